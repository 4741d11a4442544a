"""The stage costs of kind `site`, in token-layers (`primitives.stages`): what its progress bar weighs each stage by
(sub-results already cached cost 0)."""
from __future__ import annotations

from typing import Any

from ..primitives import options as o
from ..kernel import Context
from ..primitives.stages import pass_cost, tokens, unembed_layers


def generation_cost(L: int, U: float, n: int, n_tokens: float, new_tokens: int, bs: int) -> float:
    """Greedy generation in token-layers (`stages`): the prefill, then up to `new_tokens` one-token steps."""
    return pass_cost(L, n_tokens, n / bs) + new_tokens * (pass_cost(L, n, n / bs) + n * U)


def site_costs(ctx: Context, p: Any, enc: dict[str, Any]) -> dict[str, float]:
    """Each stage of `site` in token-layers (`primitives.stages`); sub-results already cached cost 0. A SITE
    training is `steps` gradient steps of `train_batch` one-token rows (forward and backward: 3 passes) and a
    validation every `val_every` steps; the budget curve runs a SITE (embedding, training, evaluation) per M."""
    lm = ctx.lm
    L, U, bs, n_new = lm.n_layers, unembed_layers(lm), p.batch_size, p.max_new_tokens
    test, n_test = enc["test"], len(enc["test"].ids)
    n_val = len(enc["val"].ids)
    gen = generation_cost(L, U, n_test, tokens(test.ids), n_new, bs)
    train = (3 * p.steps * (pass_cost(L, p.train_batch) + p.train_batch * U)
             + (p.steps // p.val_every + 1) * (pass_cost(L, n_val, n_val / 16) + n_val * U))
    per_embed = tokens(enc["embed"].ids) / max(len(enc["embed"].ids), 1)
    costs = {"embed": 0.0 if p.load else pass_cost(L, tokens(enc["embed"].ids), len(enc["embed"].ids) / bs),
             "train": 0.0 if p.load else train, "evaluate": 2 * gen}
    zero_len = tokens(test.ids) / max(n_test, 1)
    base = 0.0
    for name in p.compare:
        if name in ("zero_shot", "all_ones", "fv", "vanilla"):
            base += gen
        elif name == "icl":  # k-shot prompts: about k + 1 times the zero-shot prompt each
            base += sum(generation_cost(L, U, n_test, n_test * zero_len * (k + 1), n_new, bs) for k in p.icl_shots)
    if {"fv", "vanilla"} & set(p.compare):
        fields = {"types": [v for v in ("fv", "vanilla") if v in p.compare], "prompts": min(p.prompts, o.PROMPTS),
                  "seed": p.seed}
        if ctx.cached("vectors", [fields], record=False) is None:  # its ICL passes and the function vector's steps, roughly
            base += 4 * pass_cost(L, o.PROMPTS * per_embed) + o.FV_PROMPTS * lm.n_heads * L * ((L + 1) / 2 + U)
    costs["baselines"] = base
    costs["patching"] = pass_cost(L, tokens(test.ids)) + 2 * len(p.patching) * n_test * (L + U) if p.patching else 0.0
    extra = [m for m in p.budget if m != p.m] if not p.load else []
    costs["budget"] = sum(pass_cost(L, m * per_embed, m / bs) + train + 2 * gen for m in extra)
    costs["correlations"] = 0.0
    if {"tr", "tl", "induction"} & set(p.correlations) and ctx.cached(
            "scores", [{"shots": o.SHOTS, "prompts": o.PROMPTS, "seed": p.seed}], record=False) is None:
        costs["correlations"] = 2 * pass_cost(L, o.PROMPTS * per_embed * o.SHOTS / max(p.shots, 1))
    return costs
