"""Kind `model_info`: the loaded model's shape and identity."""
from __future__ import annotations

from typing import Any

from pydantic import Field

from ..kernel import Context
from ..params import Params
from ..primitives.cost import Shape, Sizes, Work, passes
from ..results import Result
from ..primitives.token_speed import FIT_REPEATS, WORK_ROWS, measured


class ModelInfoParams(Params):
    """kind `model_info`: no parameters besides the model."""

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        name = "speed measurement (once per model)"
        rows, tokens = WORK_ROWS[-1]
        w = passes(name, rows, min(tokens, shape.max_positions or tokens), batch=rows)  # the warm-up
        for rows, tokens in WORK_ROWS:
            w = w + passes(name, rows, min(tokens, shape.max_positions or tokens), batch=rows, repeat=FIT_REPEATS)
        return w


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
    seconds_per_pass: float | None = Field(None, description="a forward pass's fixed seconds here (weights read, "
                                                              "per-layer overheads), measured with seconds_per_token")
    speed_threads: int | None = Field(None, description="torch threads the speed was measured with")
    speed_load: float | None = Field(None, description="the 1-minute load average when the speed was measured")


def model_info(ctx: Context, p: ModelInfoParams) -> dict[str, Any]:
    """name, family, model_type, n_layers, n_heads, n_kv_heads, head_dim, d_model, max_positions, device,
    dtype, fingerprint, seconds_per_token, seconds_per_pass, speed_threads, speed_load."""
    return {**ctx.lm.info(), **measured(ctx.lm)}
