"""The stage costs of kind `ltv`, in token-layers (`primitives.stages`): what its progress bar weighs each stage by
(trainings and vectors already cached cost 0)."""
from __future__ import annotations

import math
from typing import Any

from ..primitives import options as o
from ..kernel import Context
from ..primitives import last_token
from ..primitives.cost import NONE, Shape, Work, passes, steps, training
from ..primitives.induction import induction_length
from ..primitives.prefix_store import STORE, fits
from ..primitives.stages import OVERHEAD_TOKENS, pass_cost, tokens, unembed_layers
from .recipe import LtvRecipeParams

EVAL_BATCH = o.SWEEP_BATCH_SIZE
EXTRACTED = ("vanilla", "fv", "tr", "tl")  # the extracted vectors ltv compares
RECIPE = tuple(LtvRecipeParams.model_fields)  # what ltv_train takes


def mechanism_costs(lm: Any, p: Any, zero: Any, layer: int, positions: tuple[int, ...]) -> dict[str, float]:
    """The mechanism's stages that `p` asks for (`LtvParams.stages`: saliency and ablation for key_heads, ov,
    propagation) in token-layers (`primitives.stages`) on the zero-shot prompts `zero`."""
    L, P, T, U = lm.n_layers, len(zero.ids), tokens(zero.ids), unembed_layers(lm)
    stages = p.stages()
    clean = pass_cost(L, T, P / EVAL_BATCH)
    if tuple(positions) == (-1,) and layer >= 1:  # last-token steps over the clean prefix (`engine`)
        step = P * (L - layer + 1 + U)  # one more configuration, its logits included
    else:
        step = pass_cost(L, T, P / EVAL_BATCH) + P * U
    costs: dict[str, float] = {}
    if "key_heads" in stages:
        costs["saliency"] = 3 * clean + P * U
        costs["ablation"] = clean + (1 + p.random_draws) * step
    if "ov" in stages:
        costs["ov"] = 2 * clean + 4 * step
    if "propagation" in stages:
        n = p.n_perturbations(lm.d_model)
        if tuple(positions) == (-1,):  # one token step per perturbation from `layer` on, no logits (`last_token`)
            prop = clean + pass_cost(L - layer, n * P, n * P / last_token.STEP_ROWS)
        else:
            prop = n * pass_cost(L, T, P / 64)
        costs["propagation"] = prop + clean + step
    return costs


def mechanism_work(p: Any, shape: Shape, layer: int, n: int, t0: float) -> Work:
    """The cost model's work (`primitives.cost`: tokens through the whole model, forward calls) of the mechanism
    stages `p` asks for at injection `layer`, on `n` zero-shot prompts of `t0` tokens; each stage a named part ("key
    heads", "OV reconstruction", "linear propagation"), so an estimate shows what each costs. With theta at the last
    token only (above the embeddings), a configuration is one token step from the layer on over the prompts' clean
    prefixes, kept by the comparison's first pass (`ltv`); elsewhere a full pass."""
    stages = p.stages()
    L, b = max(shape.n_layers, 1), EVAL_BATCH
    last = tuple(p.positions) == (-1,)
    after = max(L - layer + 1, 1) / L  # the sweep engine's step: from the output of layer - 1 on

    def configs(name: str, k: float) -> Work:  # k configurations over the n prompts
        if last and layer >= 1:
            return steps(name, k * n * after, b * after)  # calls: k n / b
        return passes(name, k * n, t0, b)

    w = NONE
    if "key_heads" in stages:  # saliency: a forward and backward pass; then the key set and the random sets
        w = w + (training("key heads", n, t0, batch=b) + configs("key heads", 1 + p.random_draws)).named("key heads")
    if "ov" in stages:  # the eager pass reading attention, then r and theta at 4 sites
        w = w + (passes("OV reconstruction", n, t0, b) + configs("OV reconstruction", 4)).named("OV reconstruction")
    if "propagation" in stages:  # its own clean pass, then a token step per perturbation and prompt from the layer on
        k = p.n_perturbations(shape.d_model)
        share = max(L - layer, 1) / L
        fit = (passes("linear propagation", n, t0, 64) + steps("linear propagation", k * n * share,
                                                                 last_token.STEP_ROWS * share)) \
            if last else passes("linear propagation", k * n, t0, 64)
        w = w + (fit + configs("linear propagation", 1)).named("linear propagation")
    return w


def training_cost(lm: Any, p: Any, layer: int, t0: float, positions: tuple[int, ...]) -> float:
    """One `ltv_train` in token-layers: `epochs` epochs of `train_prompts` prompts in batches (forward and
    backward: 3 passes), the held-out prompts after each, the residual scale's pass."""
    L, U = lm.n_layers, unembed_layers(lm)
    steps = p.epochs * math.ceil(p.train_prompts / p.batch_size)
    n_val = (p.epochs + 1) * p.val_prompts
    if tuple(positions) == (-1,):  # one token step over each prompt's kept prefix, from the layer on
        prefixes = pass_cost(L, (p.train_prompts + p.val_prompts) * t0, (p.train_prompts + p.val_prompts) / 32)
        return (2 * prefixes + 3 * steps * (pass_cost(L - layer, p.batch_size) + p.batch_size * U)
                + pass_cost(L - layer, n_val, n_val / 16) + n_val * U)
    return (pass_cost(L, p.train_prompts * t0, p.train_prompts / 32)
            + 3 * steps * (pass_cost(L, p.batch_size * t0) + p.batch_size * U)
            + pass_cost(L, n_val * t0, n_val / 16) + n_val * U)


def ltv_costs(ctx: Context, p: Any, groups: list[list[int]], zero: Any, icl: Any,
           positions: tuple[int, ...]) -> dict[str, float]:
    """Each stage of `ltv` in token-layers (`primitives.stages`); trainings and vectors already cached cost 0."""
    lm = ctx.lm
    L, H, P, U = lm.n_layers, lm.n_heads, len(zero.ids), unembed_layers(lm)
    t0, ti = tokens(zero.ids) / P, tokens(icl.ids) / max(len(icl.ids), 1)  # tokens per prompt
    costs: dict[str, float] = {}
    if not p.load:
        recipe = {k: getattr(p, k) for k in RECIPE}
        for i, g in enumerate(groups):
            done = ctx.cached("ltv_train", [{"layer": g[0] if len(g) == 1 else g, **recipe}], record=False) is not None
            costs[f"train {i}"] = 0.0 if done else training_cost(lm, p, min(g), t0, positions)
    vec = {"types": list(EXTRACTED), "shots": p.shots, "prompts": p.prompts, "seed": p.seed, "top_pct": p.top_pct,
           "top_k": p.top_k}
    icl_pass = pass_cost(L, P * ti, P / o.BATCH_SIZE)
    scored = True
    if ctx.cached("vectors", [vec], record=False) is not None:
        costs["vectors"] = 0.0
    else:
        scored = ctx.cached("scores", [{k: v for k, v in vec.items() if k != "types"}], record=False) is not None
        induction = 2 * pass_cost(L, 4 * (2 * induction_length(lm) + 1))  # eager attention: ~2x
        fv = min(p.prompts, o.FV_PROMPTS)  # a clean pass, then a last-token step per head from its layer on
        fv_steps = fv * H * L * ((L + 1) / 2 + U) + L * L / 2 * OVERHEAD_TOKENS * H * fv / (4 * o.SWEEP_BATCH_SIZE)
        zero_pass = pass_cost(L, P * t0, P / o.BATCH_SIZE)
        costs["vectors"] = ((0 if scored else icl_pass + zero_pass + induction) + icl_pass
                            + pass_cost(L, fv * ti) + fv_steps + zero_pass)
    # the k-shot prompts' prefixes kept already, or by the scores' pass the vectors are about to run
    kept = STORE.get(lm, icl.ids) is not None or (costs["vectors"] > 0 and not scored and fits(lm, P * ti))
    costs["icl"] = (0 if kept else icl_pass) + len(groups) * P * (L + U)
    for i, g in enumerate(groups):
        costs[f"compare {i}"] = pass_cost(L, P * t0, P / EVAL_BATCH) + 5 * P * (L - min(g) + 1 + U)
        if p.stages() and len(groups[0]) == 1:
            costs[f"mechanism {i}"] = sum(mechanism_costs(lm, p, zero, g[0], positions).values())
    return costs
