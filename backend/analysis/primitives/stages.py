"""Progress over an analysis's stages, each taking the share of the bar that its estimated cost is of the whole, so
the fraction done, and the time left a progress bar extrapolates from it, tell the truth.

Costs are in token-layers: one token through one decoder layer, forward (a backward pass about 2 more). A pass of
T tokens in all through L layers costs L * (T + OVERHEAD_TOKENS): on a CPU a pass of a few rows is bound by reading
the weights, which costs about as much as OVERHEAD_TOKENS more tokens (SmolLM2-135M: a 4-row training step runs at
the speed of ~20 tokens a layer). A last-token step from layer l over a cached prefix costs L - l per row, and a row
of full-vocabulary logits `unembed_layers` (the unembedding's weights over a layer's). A stage whose result is
cached already costs 0.

    share = spans({"train": 3e5, "vectors": 8e4, "mechanism": 2e6})   # {name: (lo, hi)}, in order
    ctx.stage(*share["train"], "training")
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

OVERHEAD_TOKENS = 16


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


def pass_cost(layers: float, n_tokens: float, passes: float = 1.0) -> float:
    """Token-layers of `passes` passes of `n_tokens` tokens in all through `layers` layers."""
    return layers * (n_tokens + OVERHEAD_TOKENS * max(1.0, math.ceil(passes)))


def unembed_layers(lm: Any) -> float:
    """A row of full-vocabulary logits in token-layers: the unembedding's weights over one decoder layer's."""
    per_layer = sum(p.numel() for p in lm.layers[0].parameters())
    return lm.unembed.numel() / max(per_layer, 1)
