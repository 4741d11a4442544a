"""Kinds `maps` and `scores`: per-head TSLA maps of a task with accuracies; and the same with top heads and overlaps.

Maps have shape (layers, heads) and are means over the prompts (see `score_heads`); the induction map is
prefix matching on repeated random tokens. `scores` reads the cached maps and selects: top-head sets hold
`n_top(top_pct, top_k)` heads, a seeded random set of the same size is the baseline; so a new selection size
costs no forward pass.

Every mean map of `maps` carries its uncertainty over the prompts (`MapStats`: standard error and 95% bootstrap
interval, from the per-prompt maps it keeps), and TR and TL their tests across heads (`map_stats`): TR against TR
onto random label subspaces of the same size, TL against per-prompt TL centred on 0, both Benjamini-Hochberg
corrected. `scores` adds each head's top-k stability over the same bootstrap resamples.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from ..kernel import Context
from ..params import Bool, PromptParams, Selection
from ..primitives import cost
from ..primitives.cost import Shape, Sizes, Work, passes
from ..results import Grid, Head, Metrics, Model, Overlap, PromptMaps, Result, pack_array
from ..primitives import map_stats
from ..primitives.batching import build_prompts, encode
from ..primitives.stats import sign_flips
from ..primitives.tr_null import BANDS, FIRST_DRAWS, POOL, STOP_P
from .scoring_pass import PER_PROMPT, score_heads
from ..primitives.induction import induction_scores
from ..primitives.predict import evaluate
from ..primitives.selection import n_top, overlap, random_heads, top_heads
from ..primitives.stages import planned


class HeadMapsParams(PromptParams):
    """kind `head_maps`: TR / TL / DLA / induction head maps and accuracies (no head selection)."""

    apply_ln: Bool = Field(False, description="scale head writes by the final norm's scale")

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        n = sizes.n(self.prompts)
        return (passes("ICL", n, sizes.prompt(self.shots), self.batch_size) + passes("zero-shot", n, sizes.prompt(0))
                + cost.induction(shape))


class HeadScoresParams(Selection, HeadMapsParams):
    """kind `head_scores`: the head maps with top heads and overlaps (a new selection size reuses the cached maps)."""


TR_TEST = (f"one-sided Monte Carlo permutation p of the mean TR against the mean TR onto random label subspaces of "
           f"the same size (each label token replaced by a random vocabulary row of its token-id band, {BANDS} bands, "
           f"{POOL} rows each, no label token), Benjamini-Hochberg across heads")
SEQUENTIAL = (f"; sequential: a head whose p from the first {FIRST_DRAWS} draws is at least {STOP_P} stops there "
              f"(it cannot reach q <= 0.05; its p carries those draws' Monte Carlo error)")
TL_TEST = "one-sided sign-flip permutation p of mean TL > 0 over the prompts, Benjamini-Hochberg across heads"


class MapStats(Model):
    """One map's uncertainty over the prompts, each (layers, heads): the standard error of the mean (sd / sqrt(n)),
    its 95% percentile bootstrap interval (1000 resamples of the prompts, seeded by the prompts' `seed`); for TR and
    TL also the test against the null: one-sided p, Benjamini-Hochberg q across heads, the heads with q <= 0.05."""

    se: Grid
    ci_low: Grid
    ci_high: Grid
    p: Grid | None = None
    q: Grid | None = None
    significant: list[Head] | None = Field(None, description="heads with q <= fdr, by q")
    test: str | None = None
    draws: int | None = Field(None, description="the test's null draws (TR: random subspaces; TL: sign vectors)")
    p_floor: float | None = Field(None, description="the smallest p the test can give: p at it is a bound")
    stopped: int | None = Field(None, description="TR: heads whose null stopped at its first draws, their p already "
                                "above the stopping p (a sequential Monte Carlo test: `tr_null.FIRST_DRAWS`)")


class HeadMapsResult(Result):
    """TSLA head maps (layers, heads), means over the prompts, with the prompt-level metrics; `stats`: each mean
    map's standard error, bootstrap interval and (TR, TL) significance; `per_prompt`: the maps prompt by prompt
    (prompts, layers, heads), kept in the cache and in Python, left out of JSON replies."""

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
    stats: dict[str, MapStats] = Field(..., description="tr, tl, dla_tr, dla_tl: each map's SE, 95% CI, and for "
                                                        "tr and tl its p, q and significant heads")
    fdr: float = Field(map_stats.FDR, description="the false discovery rate of `significant`")
    null_draws: int = Field(0, description="random label subspaces drawn for the TR null")
    per_prompt: dict[str, PromptMaps] = Field(default_factory=dict, exclude=True,
                                              description="tr, tl, dla_tr, dla_tl per prompt: (prompts, layers, heads)")


class HeadScoresResult(HeadMapsResult):
    """The head maps with the top heads by TR and TL, a random set of the same size, and overlaps."""

    top_k: int = Field(..., description="size of the top-head sets")
    top_tr: list[Head]
    top_tl: list[Head]
    random_heads: list[Head]
    overlap: dict[str, Overlap]
    stability: dict[str, Grid] = Field(..., description="tr, tl: the share of bootstrap resamples of the prompts in "
                                                        "which each head is in that map's top-k set")
    stable_at: float = Field(map_stats.STABLE_AT, description="a top head is stable at this stability or more")
    stable_tr: list[Head] = Field(default_factory=list, description="heads with TR stability >= stable_at")
    stable_tl: list[Head] = Field(default_factory=list, description="heads with TL stability >= stable_at")


def head_maps(ctx: Context, p: HeadMapsParams) -> dict[str, Any]:
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
    hm = score_heads(lm, enc, p.batch_size, p.apply_ln, ctx.stage(*share["ICL"], "scoring heads"), keep_prefix=True,
                   partial=partial, null_seed=p.seed)
    zero = None
    if zenc is not None:  # a given prompt set has no zero-shot counterpart
        # the short zero-shot prompts in batches of as many tokens as the k-shot ones (fewer passes: speed only)
        zbs = min(256, max(p.batch_size, p.batch_size * _tokens(enc.ids) // max(_tokens(zenc.ids), 1)))
        zero = evaluate(lm, zenc, zbs, ctx.stage(*share["zero-shot"], "zero-shot")).metrics
    ctx.progress(share["induction"][0], "induction scores")
    ind = induction_scores(lm)
    ctx.progress(share["induction"][1], "induction scores")  # one eager pass, memoised: the bar ends its span here
    return {"n_layers": lm.n_layers, "n_heads": lm.n_heads, "shots": built.shots, "prompts": built.n,
            "tr": hm.tr, "tl": hm.tl, "dla_tr": hm.dla_tr, "dla_tl": hm.dla_tl, "flagged": hm.flagged,
            "induction": ind, "icl": hm.metrics(), "zero_shot": zero, "multi_token_labels": enc.multi_token,
            "stats": head_stats(hm.per_prompt, hm.tr, hm.null_tr, p.seed), "fdr": map_stats.FDR,
            "null_draws": int(hm.null_tr.shape[0]), "per_prompt": {k: pack_array(v) for k, v in hm.per_prompt.items()}}


def head_stats(per_prompt: dict[str, Any], tr: Any, null_tr: Any, seed: int) -> dict[str, dict[str, Any]]:
    """Each per-prompt map's SE and bootstrap interval (seeded), and TR's and TL's tests (`map_stats`)."""
    out = {k: map_stats.uncertainty(per_prompt[k], seed=seed) for k in PER_PROMPT}
    n, flips = len(per_prompt["tl"]), sign_flips(len(per_prompt["tl"]))
    stopped = int((~np.isfinite(null_tr)).any(0).sum())
    out["tr"].update(map_stats.significance(map_stats.tr_p(tr, null_tr), n),
                     test=TR_TEST + (SEQUENTIAL if stopped else ""), draws=len(null_tr), p_floor=1 / (1 + len(null_tr)),
                     stopped=stopped)
    out["tl"].update(map_stats.significance(map_stats.tl_p(per_prompt["tl"], seed), n), test=TL_TEST, draws=flips[0],
                     p_floor=flips[1])
    return out


def head_scores(ctx: Context, p: HeadScoresParams) -> dict[str, Any]:
    """The cached `maps` of the same prompts, with top heads, a random set of the same size and overlaps."""
    m = ctx.call("head_maps", **p.model_dump(include=set(HeadMapsParams.model_fields)), progress=ctx.stage(0.0, 1.0))
    L, H = m.n_layers, m.n_heads
    k = n_top(L, H, p.top_pct, p.top_k)
    top_tr, top_tl = top_heads(m.tr, k=k), top_heads(m.tl, k=k)
    stab = {name: map_stats.stability(m.per_prompt[name], k, seed=p.seed) for name in ("tr", "tl")}
    return {**m.model_dump(exclude=set(Result.model_fields)), "top_k": k, "top_tr": top_tr, "top_tl": top_tl,
            "stability": stab, "stable_at": map_stats.STABLE_AT, "stable_tr": map_stats.stable(stab["tr"]),
            "stable_tl": map_stats.stable(stab["tl"]),
            "random_heads": random_heads(L, H, k, p.seed, exclude=set(top_tr) | set(top_tl)),  # a disjoint control
            "overlap": {"tr_tl": overlap(m.tr, m.tl, k), "tr_induction": overlap(m.tr, m.induction, k),
                        "tl_induction": overlap(m.tl, m.induction, k)}}


def _tokens(ids: list[list[int]]) -> int:
    return sum(len(x) for x in ids)
