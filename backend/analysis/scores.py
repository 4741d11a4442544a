"""Kind `scores`: per-head TSLA maps of a task, with accuracies, top heads and overlaps.

Maps have shape (layers, heads) and are means over the prompts (see `primitives.head_maps`); the
induction map is prefix matching on repeated random tokens. Top-head sets hold `n_top(top_pct, top_k)`
heads; a seeded random set of the same size is the baseline.
"""
from __future__ import annotations

from typing import Any

from .kernel import Context
from .params import ScoresParams
from .primitives.batching import build_prompts, encode
from .primitives.head_maps import head_maps
from .primitives.induction import induction_scores
from .primitives.predict import evaluate
from .primitives.selection import n_top, overlap, random_heads, top_heads


def scores(ctx: Context, p: ScoresParams) -> dict[str, Any]:
    """TR, TL, DLA-TR, DLA-TL, flagged and induction maps; ICL and zero-shot metrics; top heads; overlaps."""
    lm, task = ctx.lm, ctx.task
    built = build_prompts(lm, task, p.shots, p.prompts, p.seed)
    for w in built.warnings:
        ctx.warn(w)
    enc = encode(lm, built.prompts, task.kind)
    maps = head_maps(lm, enc, p.batch_size, p.apply_ln, ctx.stage(0.0, 0.75, "scoring heads"))
    zero = None
    if task.fixed is None:  # a given prompt set has no zero-shot counterpart
        zenc = encode(lm, task.build_prompts(0, built.n, p.seed), task.kind)
        zero = evaluate(lm, zenc, p.batch_size, ctx.stage(0.75, 0.95, "zero-shot")).metrics
    ctx.progress(0.95, "induction scores")
    ind = induction_scores(lm)
    L, H = ind.shape
    k = n_top(L, H, p.top_pct, p.top_k)
    return {
        "n_layers": L, "n_heads": H, "shots": built.shots, "prompts": built.n,
        "tr": maps.tr, "tl": maps.tl, "dla_tr": maps.dla_tr, "dla_tl": maps.dla_tl, "flagged": maps.flagged,
        "induction": ind, "icl": maps.metrics(), "zero_shot": zero, "top_k": k,
        "top_tr": top_heads(maps.tr, k=k), "top_tl": top_heads(maps.tl, k=k),
        "random_heads": random_heads(L, H, k, p.seed),
        "overlap": {"tr_tl": overlap(maps.tr, maps.tl, k), "tr_induction": overlap(maps.tr, ind, k),
                    "tl_induction": overlap(maps.tl, ind, k)},
        "multi_token_labels": enc.multi_token,
    }
