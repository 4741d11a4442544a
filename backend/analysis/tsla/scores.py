"""Kinds `maps` and `scores`: per-head TSLA maps of a task with accuracies; and the same with top heads and overlaps.

Maps have shape (layers, heads) and are means over the prompts (see `head_maps`); the induction map is
prefix matching on repeated random tokens. `scores` reads the cached maps and selects: top-head sets hold
`n_top(top_pct, top_k)` heads, a seeded random set of the same size is the baseline; so a new selection size
costs no forward pass.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from ..kernel import Context
from ..params import Bool, PromptParams, Selection
from ..primitives import cost
from ..primitives.cost import Shape, Sizes, Work, passes
from ..results import Grid, Head, Metrics, Overlap, Result
from ..primitives.batching import build_prompts, encode
from .head_maps import head_maps
from ..primitives.induction import induction_scores
from ..primitives.predict import evaluate
from ..primitives.selection import n_top, overlap, random_heads, top_heads
from ..primitives.stages import planned


class MapsParams(PromptParams):
    """kind `maps`: TR / TL / DLA / induction head maps and accuracies (no head selection)."""

    apply_ln: Bool = Field(False, description="scale head writes by the final norm's scale")

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        n = sizes.n(self.prompts)
        return (passes("ICL", n, sizes.prompt(self.shots), self.batch_size) + passes("zero-shot", n, sizes.prompt(0))
                + cost.induction(shape))


class ScoresParams(Selection, MapsParams):
    """kind `scores`: the head maps with top heads and overlaps (a new selection size reuses the cached maps)."""


class MapsResult(Result):
    """TSLA head maps (layers, heads), means over the prompts, with the prompt-level metrics."""

    n_layers: int
    n_heads: int
    shots: int = Field(..., description="demonstrations used (fewer than asked when the context is short)")
    prompts: int = Field(..., description="prompts scored")
    tr: Grid
    tl: Grid
    dla_tr: Grid
    dla_tl: Grid
    induction: Grid
    flagged: Grid = Field(..., description="share of prompts where a head's TR was zero (TL set to 0)")
    icl: Metrics
    zero_shot: Metrics | None = None
    multi_token_labels: list[str] = Field(default_factory=list)


class ScoresResult(MapsResult):
    """The head maps with the top heads by TR and TL, a random set of the same size, and overlaps."""

    top_k: int = Field(..., description="size of the top-head sets")
    top_tr: list[Head]
    top_tl: list[Head]
    random_heads: list[Head]
    overlap: dict[str, Overlap]


def maps(ctx: Context, p: MapsParams) -> dict[str, Any]:
    """TR, TL, DLA-TR, DLA-TL, flagged and induction maps; ICL and zero-shot metrics."""
    lm, task = ctx.lm, ctx.task
    built = build_prompts(lm, task, p.shots, p.prompts, p.seed)
    for w in built.warnings:
        ctx.warn(w)
    enc = encode(lm, built.prompts, task.kind)
    zenc = encode(lm, task.build_prompts(0, built.n, p.seed), task.kind) if task.fixed is None else None
    # progress by the plan's stages (`stages`: the estimate's `work`): ICL, zero-shot, induction
    share = planned(ctx, p, skip=() if zenc else ("zero-shot",))
    # the prompts' clean prefix stays in memory: the Ablation page's first live toggle of them needs no clean pass
    # an anytime pass where a page listens (a service job): the maps so far as `live` data, after the first prompts
    # and each batch ({"kind": "maps", "prompts_done", "prompts", "tr", ..., "icl"}); the final maps are the same
    partial = None
    if ctx.report is not None:
        def partial(d: dict[str, Any]) -> None:
            ctx.live({**d, "n_layers": lm.n_layers, "n_heads": lm.n_heads, "shots": built.shots})
    hm = head_maps(lm, enc, p.batch_size, p.apply_ln, ctx.stage(*share["ICL"], "scoring heads"), keep_prefix=True,
                   partial=partial)
    zero = None
    if zenc is not None:  # a given prompt set has no zero-shot counterpart
        # the short zero-shot prompts in batches of as many tokens as the k-shot ones (fewer passes: speed only)
        zbs = min(256, max(p.batch_size, p.batch_size * _tokens(enc.ids) // max(_tokens(zenc.ids), 1)))
        zero = evaluate(lm, zenc, zbs, ctx.stage(*share["zero-shot"], "zero-shot")).metrics
    ctx.progress(share["induction"][0], "induction scores")
    ind = induction_scores(lm)
    return {"n_layers": lm.n_layers, "n_heads": lm.n_heads, "shots": built.shots, "prompts": built.n,
            "tr": hm.tr, "tl": hm.tl, "dla_tr": hm.dla_tr, "dla_tl": hm.dla_tl, "flagged": hm.flagged,
            "induction": ind, "icl": hm.metrics(), "zero_shot": zero, "multi_token_labels": enc.multi_token}


def scores(ctx: Context, p: ScoresParams) -> dict[str, Any]:
    """The cached `maps` of the same prompts, with top heads, a random set of the same size and overlaps."""
    m = ctx.call("maps", **p.model_dump(include=set(MapsParams.model_fields)), progress=ctx.stage(0.0, 1.0))
    L, H = m.n_layers, m.n_heads
    k = n_top(L, H, p.top_pct, p.top_k)
    top_tr, top_tl = top_heads(m.tr, k=k), top_heads(m.tl, k=k)
    return {**m.model_dump(exclude=set(Result.model_fields)), "top_k": k, "top_tr": top_tr, "top_tl": top_tl,
            "random_heads": random_heads(L, H, k, p.seed, exclude=set(top_tr) | set(top_tl)),  # a disjoint control
            "overlap": {"tr_tl": overlap(m.tr, m.tl, k), "tr_induction": overlap(m.tr, m.induction, k),
                        "tl_induction": overlap(m.tl, m.induction, k)}}


def _tokens(ids: list[list[int]]) -> int:
    return sum(len(x) for x in ids)
