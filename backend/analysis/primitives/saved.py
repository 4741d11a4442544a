"""Saving and loading trained tensors (learned task vectors, soft head selections) as safetensors.

Every file carries metadata: what it is (`kind`), the model fingerprint and name, d_model, the task's content
hash and name, and the recipe (any JSON-able dict: layers, positions, lr, ...). Loading refuses a file made for
another model or another d_model with a clear error, so a vector is never applied where it means nothing.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from ...models import LoadedModel
from ...paths import cache_dir

FORMAT = "headlens-tensors-1"


class SavedTensorError(ValueError):
    """A saved-tensor file that cannot be used here, with the reason in words."""


def saved_dir() -> Path:
    """Where trained tensors are written by default: `<cache dir>/tensors`."""
    return cache_dir() / "tensors"


def default_path(kind: str, key: str) -> Path:
    """A stable file name for a trained result: `<kind>-<hash of key>.safetensors` under `saved_dir()`."""
    return saved_dir() / f"{kind}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.safetensors"


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], lm: LoadedModel, kind: str, *,
                 task_hash: str | None = None, task_name: str | None = None,
                 recipe: dict[str, Any] | None = None) -> Path:
    """Write `tensors` (float32, CPU, contiguous) and the metadata to `path` atomically; returns the path."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "kind": kind, "model": lm.name, "fingerprint": lm.fingerprint,
            "d_model": str(lm.d_model), "n_layers": str(lm.n_layers), "n_heads": str(lm.n_heads),
            "task_hash": task_hash or "", "task": task_name or "", "recipe": json.dumps(recipe or {}, sort_keys=True)}
    tmp = path.with_suffix(path.suffix + ".tmp")
    save_file({k: v.detach().float().cpu().contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta)
    tmp.replace(path)
    return path


def load_tensors(path: str | Path, lm: LoadedModel, kind: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors on the model's device, metadata with `recipe` decoded). Refuses a file of another kind, another
    model (fingerprint) or another d_model, with the reason."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise SavedTensorError(f"no saved {kind} file at {str(path)[:200]}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
        tensors = load_file(str(path), device=str(lm.device))
    except Exception as e:  # not a safetensors file, truncated, ...
        raise SavedTensorError(f"{path.name} is not a readable safetensors file ({type(e).__name__})") from None
    if meta.get("format") != FORMAT or meta.get("kind") != kind:
        raise SavedTensorError(f"{path.name} holds {meta.get('kind') or 'no headlens data'!r}, not a {kind}")
    if meta.get("d_model") != str(lm.d_model):
        raise SavedTensorError(f"{path.name} was trained for d_model {meta.get('d_model')} ({meta.get('model')}); "
                               f"{lm.name} has d_model {lm.d_model}")
    if meta.get("fingerprint") != lm.fingerprint:
        raise SavedTensorError(f"{path.name} was trained for another model ({meta.get('model')}, fingerprint "
                               f"{meta.get('fingerprint')}); this is {lm.name} ({lm.fingerprint})")
    meta["recipe"] = json.loads(meta.get("recipe") or "{}")
    return tensors, meta
