"""Seconds per forward pass and per token through a loaded model here: what turns a job's work (calls and tokens,
`cost.py`) into seconds.

The figures are `pass_speed.speed(lm)`: measured once per model, device, dtype and thread count, from whole passes
of random tokens at several sizes (`pass_speed.SIZES`), fitted as `seconds = per_pass + per_token * tokens`. They
read the machine as it was at that moment (its load average is kept with them, so an estimate made later can
scale for a busier or quieter CPU: `service/estimate.py`). A training's backward pass costs about twice its
forward pass (the estimate adds it). This module is what `model_info` reports.
"""
from __future__ import annotations

from typing import Any

from ...model.loading import LoadedModel
from .pass_speed import FIT_REPEATS, SIZES, speed

WORK_ROWS = [(rows, tokens) for rows, tokens in SIZES]
"""The passes a measurement runs (each FIT_REPEATS times, the largest once more to warm up): `model_info`'s work."""


def measured(lm: LoadedModel) -> dict[str, Any]:
    """{seconds_per_pass, seconds_per_token, speed_threads, speed_load} of `lm` here (measured once)."""
    s = speed(lm)
    return {"seconds_per_pass": s.per_pass, "seconds_per_token": s.per_token, "speed_threads": s.threads,
            "speed_load": s.load}


def seconds_per_token(lm: LoadedModel) -> float:
    """Seconds per token of a batched forward pass of `lm` here (measured once)."""
    return speed(lm).per_token


__all__ = ["FIT_REPEATS", "WORK_ROWS", "measured", "seconds_per_token"]
