"""What kind `site_alphas` reads from other kinds' results: the cached LTV's row among the baselines, and the rank
correlations of alpha (layers, heads) with the TR / TL / induction maps and the LTV's key-head saliency."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..primitives import options as o
from ..kernel import Context
from ..kinds import get_kind
from ..primitives.selection import n_top, overlap


def ltv_row(ctx: Context, prompts: int, seed: int) -> dict[str, Any] | None:
    """The cached LTV result's row (its table's `ltv` metrics at its layer), or None when the kind is absent,
    nothing is cached for these prompts and seed, or its result has another shape than this reads."""
    r = cached_ltv(ctx, prompts, seed)
    try:
        m = r.table["ltv"]
        train = next((pl.training for pl in r.per_layer if r.layer in pl.layers), None)
        n_vec = len(train.layers) if train is not None else 1
        return {"label": "LTV", "metrics": m.model_dump(), "params": n_vec * ctx.lm.d_model,
                "trainable": n_vec * ctx.lm.d_model, "seconds": train.train_seconds if train is not None else None,
                "note": f"learned task vector at layer {r.layer}'s input (cached `ltv` result, {r.prompts} prompts"
                        + "".join(f", {k} {v}" for k, v in get_kind("ltv_layers").params.recipe_changes(r.params).items()) + ")"}
    except (AttributeError, KeyError, TypeError):
        return None


def cached_ltv(ctx: Context, prompts: int, seed: int, mechanism: bool = False) -> Any:
    """The `ltv` kind's cached result on this model and task at this seed whose table holds the LTV at L/2 (these
    prompts, else the default count; the default layer, L/2 named, or the layer scan, whose table is at L/2), or
    None; `mechanism`: one with the key heads (its `key_heads` stage run). Its other fields (the ICL shots, the
    head-set sizes, the mechanism's settings, the recipe) may be anything: they do not change that row; the
    defaults are preferred."""
    base = {"seed": seed, "load": None, **({"mechanism": True, "key_heads": True} if mechanism else {})}
    return ctx.cached("ltv_layers", [{**base, "prompts": n, **at} for n in dict.fromkeys((prompts, o.PROMPTS))
                              for at in ({"layer": None}, {"layer": ctx.lm.n_layers // 2},
                                         {"layer": "all", "joint": False})])


# -- patching -----------------------------------------------------------------------------------------------------------
def correlations(ctx: Context, p: Any, alpha: np.ndarray,
                  span: tuple[float, float] = (0.95, 1.0)) -> dict[str, Any]:
    lm = ctx.lm
    k = n_top(lm.n_layers, lm.n_heads)
    out: dict[str, Any] = {}
    maps = [m for m in p.correlations if m in ("tr", "tl", "induction")]
    if maps:
        # the Head map's maps at these test prompts (at most the default count): the same result the page shows
        r = ctx.call("head_scores", shots=o.SHOTS, prompts=min(p.prompts, o.PROMPTS), seed=p.seed, batch_size=p.batch_size,
                     progress=ctx.stage(*span, "head scores"))
        for m in maps:
            out[m] = overlap(alpha, np.asarray(getattr(r, m), dtype=float), k)
    if "ltv" in p.correlations:
        r = cached_ltv(ctx, p.prompts, p.seed, mechanism=True)
        try:
            kh = next((pl.key_heads for pl in (r.per_layer if r is not None else []) if r.layer in pl.layers
                       and pl.key_heads is not None), None)
            sal = None if kh is None else np.asarray(kh.saliency, dtype=float)
        except (AttributeError, TypeError):  # its result has another shape than this reads
            sal = None
        if sal is not None and sal.shape == alpha.shape:
            out["ltv"] = overlap(alpha, sal, k)
    return out
