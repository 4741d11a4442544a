"""Progress over an analysis's stages, each taking the share of the bar that its estimated cost is of the whole, so
the fraction done, and the time left a progress bar extrapolates from it, tell the truth.

Costs are in token-layers: one token through one decoder layer, forward (a backward pass about 2 more). A full pass
of prompts of T tokens in all through L layers costs T * L; a last-token step from layer l over a cached prefix,
L - l per prompt. A stage whose result is cached already costs 0.

    share = spans({"train": 3e5, "vectors": 8e4, "mechanism": 2e6})   # {name: (lo, hi)}, in order
    ctx.stage(*share["train"], "training")
"""
from __future__ import annotations

from typing import Mapping, Sequence


def spans(costs: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """Consecutive (lo, hi) shares of [0, 1] in proportion to each stage's cost (in the mapping's order); all
    stages equal when every cost is 0."""
    values = [max(0.0, float(c)) for c in costs.values()]
    total = sum(values)
    if total <= 0:
        values, total = [1.0] * len(values), float(len(values) or 1)
    out, at = {}, 0.0
    for name, c in zip(costs, values):
        out[name] = (at, min(1.0, at + c / total))
        at += c / total
    return out


def tokens(ids: Sequence[Sequence[int]]) -> int:
    """Tokens of the prompts in all."""
    return sum(len(x) for x in ids)
