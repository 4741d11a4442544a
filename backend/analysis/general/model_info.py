"""Kind `model_info`: the loaded model's shape and identity."""
from __future__ import annotations

from typing import Any

from ..kernel import Context
from ..params import ModelInfoParams


def model_info(ctx: Context, p: ModelInfoParams) -> dict[str, Any]:
    """name, family, model_type, n_layers, n_heads, n_kv_heads, head_dim, d_model, max_positions, device,
    dtype, fingerprint."""
    return ctx.lm.info()
