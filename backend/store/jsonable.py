"""Strict JSON values: what the cache stores, the service returns and the CLI writes (no NaN, no Infinity)."""
from __future__ import annotations

import math
from typing import Any


def to_jsonable(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats -> None, tuples -> lists, numpy / torch values -> Python values,
    Pydantic models -> their JSON dump."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "model_dump"):
        return to_jsonable(obj.model_dump(mode="json"))
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, torch tensors
        return to_jsonable(obj.tolist())
    return str(obj)
