"""Kind `model_info`: the loaded model's shape and identity."""
from __future__ import annotations

from typing import Any

from ..kernel import Context
from ..params import Params
from ..primitives.cost import NONE, Shape, Sizes, Work
from ..results import Result


class ModelInfoParams(Params):
    """kind `model_info`: no parameters besides the model."""

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        return NONE


class ModelInfoResult(Result):
    name: str
    family: str
    model_type: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    max_positions: int | None = None
    device: str
    dtype: str
    fingerprint: str


def model_info(ctx: Context, p: ModelInfoParams) -> dict[str, Any]:
    """name, family, model_type, n_layers, n_heads, n_kv_heads, head_dim, d_model, max_positions, device, dtype,
    fingerprint."""
    return ctx.lm.info()
