"""The cost plan of kind `ltv_layers` (`primitives.cost`): its stages in the order the run takes them, from the params, the
model's shape and the prompts' sizes. `LtvLayersParams.work` (admission, the estimate) is their sum; the run's progress
bar weighs each stage by it (`primitives.stages`), a training or the vectors already cached weighing 0."""
from __future__ import annotations

from typing import Any

from ..primitives import options as o
from ..kinds import get_kind
from ..primitives import last_token
from ..primitives.cost import NONE, Shape, Sizes, Work, passes, steps, training
from .recipe import LtvRecipeParams

EVAL_BATCH = o.CONFIG_BATCH_SIZE
EXTRACTED = ("vanilla", "fv", "tr", "tl")  # the extracted vectors ltv compares
RECIPE = tuple(LtvRecipeParams.model_fields)  # what ltv_vector takes


def groups_of(p: Any, n_layers: int) -> list[list[int]]:
    """The injection layers' groups a request runs: one per layer, or one joint group (as the run's `_layers`)."""
    layers = ([n_layers // 2] if p.layer is None else [p.layer] if isinstance(p.layer, int)
              else list(range(n_layers)) if p.layer == "all" else sorted(set(p.layer)))
    return [layers] if p.joint and len(layers) > 1 else [[l] for l in layers]


def configs(name: str, k: float, n: float, t: float, shape: Shape, layer: int, last: bool) -> Work:
    """`k` configurations of the configuration engine over `n` prompts of `t` tokens whose clean prefixes are kept: with a
    vector at the last token above the embeddings, one token step each from the output of `layer` - 1 on (the
    share (L - layer + 1) / L of the model), its logits included; elsewhere a full pass each."""
    if last and layer >= 1:
        L = max(shape.n_layers, 1)
        return steps(name, k * n, share=max(L - layer + 1, 1) / L)
    return passes(name, k * n, t, EVAL_BATCH)


def saliency_work(n: float, t0: float) -> Work:
    """Head saliency: a forward and backward pass of the zero-shot prompts with theta in."""
    return training("key heads", n, t0, batch=EVAL_BATCH)


def mechanism_work(p: Any, shape: Shape, layer: int, n: int, t0: float) -> Work:
    """The mechanism stages `p` asks for at injection `layer`, on `n` zero-shot prompts of `t0` tokens; each stage
    a named part ("key heads", "OV reconstruction", "linear propagation"), so an estimate shows what each costs.
    With theta at the last token only (above the embeddings), a configuration is one token step from the layer on
    over the prompts' clean prefixes, kept by the comparison's first pass (`ltv`); elsewhere a full pass."""
    stages = p.stages()
    L = max(shape.n_layers, 1)
    last = tuple(p.positions) == (-1,)
    w = NONE
    if "key_heads" in stages:  # saliency; then the key set and the random sets
        w = w + (saliency_work(n, t0) + configs("key heads", 1 + p.random_draws, n, t0, shape, layer, last))
    if "ov" in stages:  # the eager pass reading attention, then r and theta at 4 sites
        w = w + (passes("OV reconstruction", n, t0, EVAL_BATCH)
                 + configs("OV reconstruction", 4, n, t0, shape, layer, last))
    if "propagation" in stages:  # its own clean pass, then a token step per perturbation and prompt from the layer on
        k = p.n_perturbations(shape.d_model)
        share = max(L - layer, 1) / L
        fit = (passes("linear propagation", n, t0, 64) + steps("linear propagation", k * n * share,
                                                                 last_token.STEP_ROWS * share)) \
            if last else passes("linear propagation", k * n, t0, 64)
        w = w + (fit + configs("linear propagation", 1, n, t0, shape, layer, last)).named("linear propagation")
    return w


def ltv_plan(p: Any, shape: Shape, sizes: Sizes, groups: list[list[int]], trained: list[bool] | None = None,
             vectors_cached: bool = False) -> list[tuple[str, Work]]:
    """The run's steps in order, each with its plan: "train i" (each group's training, unless loaded or
    `trained[i]`), "vectors" (the extracted vectors, unless cached), "references" (the zero-shot prompts' clean
    pass, kept; the k-shot prompts alone and with each LTV), then per group "compare i" (the extracted vectors and
    the LTV on the zero-shot prompts) and "mechanism i" (single layers)."""
    n, t0, t = sizes.n(p.prompts), sizes.prompt(0), sizes.prompt(p.shots)
    last = tuple(p.positions) == (-1,)
    out = [(f"train {i}", NONE if p.load or (trained and trained[i]) else p.training_work(sizes, shape, min(g)))
           for i, g in enumerate(groups)]
    vec = get_kind("task_vectors").params(types=list(EXTRACTED), shots=p.shots, prompts=p.prompts, top_pct=p.top_pct,
                                     top_k=p.top_k)
    out.append(("vectors", NONE if vectors_cached else vec.work(shape, sizes).named("extracted vectors")))
    refs = passes("references", n, t0, EVAL_BATCH) + passes("references", n, t, EVAL_BATCH)
    out.append(("references", sum((configs("references", 1, n, t, shape, min(g), last) for g in groups), refs)))
    single = len(groups[0]) == 1
    for i, g in enumerate(groups):
        extracted = configs("comparisons", len(EXTRACTED), n, t0, shape, g[0], True) if single else NONE
        out.append((f"compare {i}", extracted + configs("comparisons", 1, n, t0, shape, min(g), last)))
        if single and p.stages():
            out.append((f"mechanism {i}", mechanism_work(p, shape, g[0], n, t0)))
    return out
