"""Kind `model_info`: the loaded model's shape and identity."""
from __future__ import annotations

from typing import Any

from pydantic import Field

from ..kernel import Context
from ..params import Params
from ..primitives.cost import Shape, Sizes, Work, passes
from ..results import Result
from ..primitives.token_speed import ROWS, TOKENS, WARMUP, seconds_per_token


class ModelInfoParams(Params):
    """kind `model_info`: no parameters besides the model."""

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        return passes("speed measurement (once per model)", 1, WARMUP) + passes("speed measurement (once per model)",
                                                                             ROWS, TOKENS)


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
    seconds_per_token: float | None = Field(None, description="a batched forward pass's seconds per token here, "
                                                               "measured once (what time estimates are made of)")


def model_info(ctx: Context, p: ModelInfoParams) -> dict[str, Any]:
    """name, family, model_type, n_layers, n_heads, n_kv_heads, head_dim, d_model, max_positions, device,
    dtype, fingerprint, seconds_per_token."""
    return {**ctx.lm.info(), "seconds_per_token": seconds_per_token(ctx.lm)}
