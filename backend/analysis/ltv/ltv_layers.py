"""Kind `ltv_layers`: learned task vectors (LTVs) compared with extracted ones, at one layer or along the layers, and
how they work.

Injection site: the INPUT of decoder layer l (layer 0: the embeddings; the input of layer l is the output of
layer l - 1). Per injection layer (`layer`: None = L/2, an int, a list or `all`; `joint` trains one vector over
several layers instead), on the seed's held-out queries:

conditions   zero_shot   the query alone
             icl         k-shot prompts of the same queries
             vanilla     mean over ICL prompts of (h_ICL - h_zero) at the layer's input, last token
             fv          the function vector (top heads by causal indirect effect)
             tr, tl      the top-TR / top-TL head-set vectors
             ltv         the trained vector at `positions` (kind `ltv_vector`, cached: a layer scan and a single layer
                         share their trainings)
             ltv+icl     the LTV added to the k-shot prompts
             Extracted vectors come from the cached `task_vectors` kind and are added at the last token, unscaled.
mechanism    per single layer, each stage a param (`key_heads` and `ov` on by default, `propagation` opt-in: on
             SmolLM2-135M it cost 90% of the mechanism's CPU time and half the run; `mechanism=False`: none)
             key heads   saliency |a . dp(gold)/da| per head at the last token with the LTV in; the top
                         `key_pct` % of all heads, taken from the layers that see theta (>= its layer), are
                         ablated (zero, last token) against `random_draws` random sets as large from the same
                         layers (from their other heads, when there are enough); overlaps of the saliency map with the TR, TL and induction maps (kind `head_scores`)
             ov          sum over later heads of A(last -> theta's positions) W_O W_V theta, injected instead of
                         theta: at the last layer's output (`final`) and at theta's own site (`same_layer`);
                         `direct` is theta itself at the last layer's output (the residual path alone)
             propagation W fitted on perturbed thetas (final hidden-state change ~ W theta), W = Q S:
                         rotation cos(theta, Q theta), stretch ||S theta|| / ||theta||, and the accuracy of
                         zero-shot prompts with W theta added to the final hidden state
`load` compares a saved vector, by its id (its layers and positions come from the file), instead of training one.
"""
from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from ..primitives import options as o
from ...errors import BadInput
from ...tasks.base import TaskError
from ...text import clip
from ..kernel import Context
from ..params import Bool, Float, Int, Layer, Selection, TensorId
from ..primitives.cost import NONE, Shape, Sizes, Work
from ..results import Grid, Head, Metrics, Model, Overlap, PairedTest, Result, TensorsInline
from .recipe import LtvRecipeParams, LtvTraining
from ..primitives.batching import build_prompts, encode
from ..primitives.inject import Injection, check_layers, check_positions, evaluate_injections, vector_at
from ..primitives.rates import paired_metrics
from ..primitives.saved import load_tensors
from ..primitives.selection import n_top, overlap, random_heads, top_heads
from ..primitives.stages import plan_spans, run_sizes, shape_of
from ..primitives.configs import head_mask
from ..primitives.threads import cpu_threads
from .ltv_costs import EVAL_BATCH, EXTRACTED, RECIPE, groups_of, ltv_plan, mechanism_work, saliency_work
from .propagation import head_saliency, linear_propagation, ov_reconstruction


class LtvLayersParams(Selection, LtvRecipeParams):
    """kind `ltv_layers`: train LTVs and compare them, at each injection layer, with zero-shot, k-shot ICL, the vanilla
    task vector, the function vector and the TR / TL head-set vectors; LTV on top of ICL; and how it works
    (key heads, OV reconstruction, linear propagation)."""

    layer: Layer | list[Layer] | Literal["all"] | None = Field(
        None, description="injection layer (a decoder layer's input); None = L/2; `all` or a list: one LTV per "
                          "layer (the layer scan), or one joint vector with `joint`")
    joint: Bool = Field(False, description="with several layers: one theta per layer trained together")
    shots: Int = Field(o.SHOTS, ge=0, description="demonstrations of the ICL conditions and extracted vectors")
    prompts: Int = Field(o.PROMPTS, ge=1, description="held-out queries scored (zero-shot prompts)")
    mechanism: Bool = Field(True, description="how it works, per layer: the stages switched on below (key_heads, "
                                              "ov, propagation); False: none of them")
    key_heads: Bool = Field(True, description="mechanism: head saliency, the key heads ablated against random sets, "
                                              "their overlap with the head maps")
    ov: Bool = Field(True, description="mechanism: the OV reconstruction of theta, injected instead of it")
    propagation: Bool = Field(False, description="mechanism: linear propagation W = QS (rotation, stretch), fitted "
                                                 "on `perturbations` perturbed vectors; the costliest stage (on "
                                                 "SmolLM2-135M about as much as the rest of the run), so off by "
                                                 "default")
    key_pct: Float = Field(o.LTV_KEY_PCT, gt=0, le=100, description="key heads: top percent by saliency")
    random_draws: Int = Field(o.LTV_RANDOM_DRAWS, ge=1, le=100, description="random head sets ablated for contrast")
    perturbations: Int | None = Field(None, ge=2, le=16384, description="linear propagation: perturbed vectors "
                                                                        "(default 2 d_model, at most 1024)")
    load: TensorId("ltv") | None = Field(None, description="a saved LTV, by its id (an ltv_vector result's `tensor`, "
                                                           "or POST /tensors), to compare instead of training one")
    tensor_fields = ("load",)

    def writes_tensors(self) -> bool:
        return not self.load

    def stages(self) -> tuple[str, ...]:
        """The mechanism's stages this request runs (at each single layer; a joint vector runs none)."""
        if not self.mechanism:
            return ()
        return tuple(name for name, on in (("key_heads", self.key_heads), ("ov", self.ov),
                                           ("propagation", self.propagation)) if on)

    def n_perturbations(self, d_model: int) -> int:
        """Linear propagation's perturbed vectors: `perturbations`, else 2 d_model (at most LTV_MAX_PERTURBATIONS)."""
        return self.perturbations or min(2 * d_model, o.LTV_MAX_PERTURBATIONS)

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """The sum of the run's plan (`ltv_costs.ltv_plan`), nothing cached."""
        return sum((w for _, w in ltv_plan(self, shape, sizes, groups_of(self, shape.n_layers))), NONE)


class MetricCurve(Model):
    """accuracy, label_accuracy and TR ratio along the layer scan (one value per layer of `LtvLayersResult.layers`)."""

    accuracy: list[float]
    label_accuracy: list[float]
    tr_ratio: list[float]
    accuracy_ci: list[tuple[float, float] | None] | None = Field(None, description="95% Wilson interval per layer")
    label_accuracy_ci: list[tuple[float, float] | None] | None = None
    tr_ratio_ci: list[tuple[float, float] | None] | None = None


class KeyHeads(Model):
    """Saliency |a . dp(gold)/da| of each head's last-token output under the LTV, and what ablating the top heads
    (zero, last token, LTV injected) costs against as many random heads."""

    saliency: Grid = Field(..., description="(layers, heads), mean over the scored prompts")
    heads: list[Head] = Field(..., description="the key heads: top `key_pct` percent by saliency, best first")
    ltv: Metrics = Field(..., description="LTV, nothing ablated")
    ablated: Metrics = Field(..., description="LTV with the key heads ablated")
    random: list[Metrics] = Field(..., description="LTV with as many random heads ablated, one per draw")
    random_heads: list[list[Head]]
    random_accuracy_mean: float
    random_accuracy_std: float
    gold_prob: dict[str, float] = Field(default_factory=dict, description="mean probability of the gold first token: "
                                                                          "ltv, ablated, random (mean of the draws)")
    overlap: dict[str, Overlap] = Field(default_factory=dict, description="with the tr, tl and induction rankings: "
                                                                          "top-k Jaccard and rank correlations")


class OvReconstruction(Model):
    """r = sum over heads of layers >= the injection layer of A(last -> theta's positions) * W_O W_V theta (through
    the layer's input norm, linearised), mean over prompts; injected instead of theta."""

    heads: Grid = Field(..., description="(layers, heads): norm of each head's mean OV write of theta")
    norm: float = Field(..., description="||r||")
    cosine: float = Field(..., description="cos(r, theta)")
    final: Metrics = Field(..., description="r added to the last layer's output (last token) instead of theta")
    same_layer: Metrics = Field(..., description="r added where theta was (the layer's input, last token)")
    direct: Metrics = Field(..., description="theta itself added to the last layer's output: its residual path alone")
    direct_and_ov: Metrics = Field(..., description="theta + r added to the last layer's output: the residual path and "
                                                    "the heads' OV writes, without MLPs or attention-pattern changes")


class Propagation(Model):
    """The linear surrogate W (final hidden-state change ~ W theta), fitted on perturbed thetas; W = Q S."""

    rotation: float = Field(..., description="cos(theta, Q theta)")
    stretch: float = Field(..., description="||S theta|| / ||theta||")
    r2: float = Field(..., description="share of the final-state changes' variance that W explains")
    n: int = Field(..., description="perturbed vectors fitted")
    surrogate: Metrics = Field(..., description="zero-shot prompts with W theta added to the final hidden state")
    recovered: float | None = Field(None, description="(surrogate - zero-shot) / (LTV - zero-shot) accuracy; None "
                                                      "when the LTV does not beat zero-shot")


class LtvLayer(Model):
    """Everything at one injection layer (or one joint multi-layer vector)."""

    layers: list[int]
    conditions: dict[str, Metrics] = Field(..., description="zero_shot, icl, vanilla, fv, tr, tl, ltv, ltv+icl "
                                                            "(those available)")
    training: LtvTraining
    key_heads: KeyHeads | None = None
    ov: OvReconstruction | None = None
    propagation: Propagation | None = None
    tests: dict[str, dict[str, PairedTest]] = Field(default_factory=dict, description="\"ltv vs <condition>\" -> "
                                                    "rate -> paired test on the same queries (effect = LTV minus it)")


class LtvLayersResult(Result, TensorsInline):
    """kind `ltv_layers`: learned task vectors compared with zero-shot, ICL and extracted vectors, and how they work.

    `table` is the comparison at `layer`; `sweep` (the layer scan) the same conditions at every layer of `layers`; the extracted
    vectors (vanilla, fv, tr, tl) are added at the last token, the LTV at `positions`. Conditions:
    zero_shot, icl (k-shot prompts), vanilla (mean ICL - zero-shot hidden state at the layer's input), fv
    (function vector), tr / tl (top-TR / top-TL head-set vectors), ltv, ltv+icl (LTV on top of the ICL prompt).
    """

    n_layers: int
    n_heads: int
    d_model: int
    layers: list[int] = Field(..., description="the injection layers of the scan (a joint vector: its layers)")
    layer: int = Field(..., description="the table's layer (L/2 when swept)")
    joint: bool
    positions: list[int]
    shots: int
    prompts: int
    conditions: list[str] = Field(..., description="condition names, in display order")
    table: dict[str, Metrics]
    sweep: dict[str, MetricCurve]
    rotation: list[float | None] = Field(..., description="per layer of `layers`: cos(theta, Q theta)")
    stretch: list[float | None] = Field(..., description="per layer of `layers`: ||S theta|| / ||theta||")
    per_layer: list[LtvLayer]
    tensor: str = Field(..., description="id of the table's LTV file (GET /tensors/{id}; `load` takes it)")
    heads: dict[str, list[Head]] = Field(default_factory=dict, description="head sets of the fv, tr and tl vectors")
    multi_token_labels: list[str] = Field(default_factory=list)


CONDITIONS = ("zero_shot", "icl", "vanilla", "fv", "tr", "tl", "ltv", "ltv+icl")


def _layers(lm: Any, p: LtvLayersParams) -> list[int]:
    if p.layer is None:
        return [lm.n_layers // 2]
    if p.layer == "all":
        return list(range(lm.n_layers))
    return check_layers(lm, sorted(set([p.layer] if isinstance(p.layer, int) else p.layer)))


def _loaded(ctx: Context, p: LtvLayersParams) -> dict[str, Any]:
    """A saved vector as an `ltv_vector`-shaped dict (the file checked: `saved.load_tensors`)."""
    tensors, meta = load_tensors(ctx.tensors, p.load, ctx.lm, "ltv")
    recipe = meta["recipe"]
    theta = tensors["theta"]
    layers = list(recipe["layers"])
    if meta.get("task_hash") and meta["task_hash"] != ctx.task.content_hash():
        ctx.warn(f"{p.load} was trained on task {clip(meta.get('task') or '?', 80)!r} (another task or version than "
                 f"{clip(ctx.task.name, 80)!r}); compared here as given")
    theta = theta.float().cpu()
    return {"layers": layers, "positions": [int(x) for x in recipe.get("positions", [-1])], "theta": theta.numpy(),
            "norm": [float(v.norm()) for v in theta], "loss": [], "val_accuracy": [], "val_loss": [],
            "init_val_accuracy": 0.0, "best_epoch": int(recipe.get("best_epoch", 0)), "epochs_run": 0,
            "stopped": "loaded", "train_seconds": 0.0, "n_train": int(recipe.get("n_train", 0)),
            "n_val": int(recipe.get("n_val", 0)), "recipe": recipe, "tensor": p.load}


def _extracted_at(vectors: Any, name: str, layer: int) -> torch.Tensor | None:
    """The extracted vector `name` to add at the INPUT of `layer`: a head-set vector as is; the vanilla vector's row
    of `layer` (the ICL-minus-zero-shot difference of that same state)."""
    entry = vectors.vectors.get(name)
    return None if entry is None else vector_at(entry.vector, layer)


def ltv_layers(ctx: Context, p: LtvLayersParams) -> dict[str, Any]:
    """The `LtvLayersResult` fields (see the module docstring)."""
    with cpu_threads(ctx.lm):
        return _ltv(ctx, p)


def _ltv(ctx: Context, p: LtvLayersParams) -> dict[str, Any]:
    lm, task = ctx.lm, ctx.task
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model
    if p.load:
        trainings = [_loaded(ctx, p)]
        layers = trainings[0]["layers"]
        if p.layer is not None and _layers(lm, p) != layers:
            raise BadInput(f"layer: {p.load!r} holds a vector for layer(s) {layers}; leave `layer` out or ask for "
                             f"those")
        groups = [layers]
        if p.positions != [-1] and p.positions != trainings[0]["positions"]:
            ctx.warn(f"positions {p.positions} ignored: {p.load} was trained at {trainings[0]['positions']}")
        ctx.progress(0.0, "loaded the vector")
    else:
        layers = _layers(lm, p)
        groups = [layers] if p.joint and len(layers) > 1 else [[l] for l in layers]
    joint = len(groups) == 1 and len(groups[0]) > 1

    # the scored prompts: the seed's held-out queries, zero-shot and k-shot
    built = build_prompts(lm, task, p.shots, p.prompts, p.seed)
    for w in built.warnings:
        ctx.warn(w)
    zero = encode(lm, task.build_prompts(0, built.n, p.seed), task.kind)
    icl = encode(lm, built.prompts, task.kind)
    multi = sorted(set(zero.multi_token) | set(icl.multi_token))  # the kernel warns once (primitives/notes.py)
    # the progress bar: the plan's steps (`ltv_costs.ltv_plan`, the estimate's), cached sub-results weighing 0
    shape, sizes = shape_of(lm), run_sizes(lm, task)
    recipe = {k: getattr(p, k) for k in RECIPE}
    trained = None if p.load else [ctx.cached("ltv_vector", [{"layer": g[0] if len(g) == 1 else g, **recipe}],
                                              record=False) is not None for g in groups]
    vec_fields = {"types": list(EXTRACTED), "shots": p.shots, "prompts": p.prompts, "seed": p.seed,
                  "top_pct": p.top_pct, "top_k": p.top_k}
    share = plan_spans(dict(ltv_plan(p, shape, sizes, groups, trained,
                                     ctx.cached("task_vectors", [vec_fields], record=False) is not None)), shape)
    if not p.load:
        trainings = []
        for i, g in enumerate(groups):
            r = ctx.call("ltv_vector", layer=g[0] if len(g) == 1 else g, **{k: getattr(p, k) for k in RECIPE},
                         progress=ctx.stage(*share[f"train {i}"], f"LTV {i + 1}/{len(groups)}"))
            trainings.append(r.model_dump(include=set(LtvTraining.model_fields)))
    positions = check_positions(zero.ids, tuple(trainings[0]["positions"]))

    vec = ctx.call("task_vectors", types=list(EXTRACTED), shots=p.shots, prompts=p.prompts, seed=p.seed,
                   top_pct=p.top_pct, top_k=p.top_k, batch_size=o.BATCH_SIZE,
                   progress=ctx.stage(*share["vectors"], "extracted vectors"))
    if joint:
        ctx.warn("extracted vectors and the mechanism analyses are single-layer comparisons: a joint vector over "
                 f"layers {groups[0]} is compared with zero-shot and ICL only")
    def ltv_injection(g: list[int], tr: dict[str, Any]) -> Injection:
        theta = torch.as_tensor(np.asarray(tr["theta"]), dtype=torch.float32)
        return Injection({l: theta[i] for i, l in enumerate(g)}, positions)

    # the zero-shot prompts' clean prefixes kept: the comparison and the mechanism's configurations are token steps
    base = evaluate_injections(lm, zero, [Injection()], EVAL_BATCH, keep_prefix=True)
    # k-shot prompts alone and with each LTV: one batch of configurations (one clean pass; a last-token LTV is one step over it)
    with_icl = evaluate_injections(lm, icl, [Injection()] + [ltv_injection(g, tr) for g, tr in zip(groups, trainings)],
                                   EVAL_BATCH, ctx.stage(*share["references"], "k-shot prompts"))
    ref = {"zero_shot": base.summary(0), "icl": with_icl.summary(0)}
    scores = None
    per_layer = []
    for gi, (g, tr) in enumerate(zip(groups, trainings)):
        ltv_inj = ltv_injection(g, tr)
        thetas = ltv_inj.vectors
        names, injections = [], []
        if not joint:
            for name in EXTRACTED:
                v = _extracted_at(vec, name, g[0])
                if v is not None:
                    names.append(name)
                    injections.append(Injection({g[0]: v}, (-1,)))
        names.append("ltv")
        injections.append(ltv_inj)
        out = evaluate_injections(lm, zero, injections, EVAL_BATCH, ctx.stage(*share[f"compare {gi}"], "comparing"))
        conditions = {**ref, **{nm: out.summary(i) for i, nm in enumerate(names)}, "ltv+icl": with_icl.summary(gi + 1)}
        entry: dict[str, Any] = {"layers": g, "conditions": {c: conditions[c] for c in CONDITIONS if c in conditions},
                                 "training": tr, "tests": ltv_tests(conditions)}
        if p.stages() and not joint:
            if scores is None and "key_heads" in p.stages():
                scores = ctx.call("head_scores", shots=p.shots, prompts=p.prompts, seed=p.seed, top_pct=p.top_pct,
                                  top_k=p.top_k, batch_size=o.BATCH_SIZE)
            entry.update(_mechanism(ctx, p, zero, g[0], thetas[g[0]], positions, conditions,
                                    float(out.gold_prob[names.index("ltv")].mean()), scores,
                                    ctx.stage(*share[f"mechanism {gi}"], f"mechanism at layer {g[0]}"), shape, sizes))
        per_layer.append(entry)

    main = layers.index(L // 2) if (L // 2 in layers and not joint) else 0
    order = [c for c in CONDITIONS if c in per_layer[main]["conditions"]]
    sweep = {c: {m: [e["conditions"][c][m] if c in e["conditions"] else float("nan") for e in per_layer]
                 for m in ("accuracy", "label_accuracy", "tr_ratio")} for c in order}
    for c in order:  # each point's interval (None where the condition is absent at that layer)
        sweep[c].update({f"{m}_ci": [e["conditions"][c].get(f"{m}_ci") if c in e["conditions"] else None
                                     for e in per_layer] for m in ("accuracy", "label_accuracy", "tr_ratio")})
    prop = [e.get("propagation") for e in per_layer]
    heads = {nm: list(vec.vectors[nm].heads) for nm in ("fv", "tr", "tl") if nm in vec.vectors}
    return {"n_layers": L, "n_heads": H, "d_model": d, "layers": [e["layers"][0] for e in per_layer] if not joint
            else groups[0], "layer": per_layer[main]["layers"][0], "joint": joint, "positions": list(positions),
            "shots": built.shots, "prompts": built.n, "conditions": order, "table": per_layer[main]["conditions"],
            "sweep": sweep, "rotation": [x["rotation"] if x else None for x in prop],
            "stretch": [x["stretch"] if x else None for x in prop], "per_layer": per_layer,
            "tensor": per_layer[main]["training"]["tensor"], "heads": heads, "multi_token_labels": multi}


def ltv_tests(conditions: dict[str, Any]) -> dict[str, Any]:
    """The LTV against vanilla, FV, zero-shot and ICL, paired on the same queries (`rates.paired_metrics`)."""
    tests = {f"ltv vs {c}": paired_metrics(conditions["ltv"], conditions[c])
             for c in ("vanilla", "fv", "zero_shot", "icl") if c in conditions}
    return {k: v for k, v in tests.items() if v is not None}


def _mechanism(ctx: Context, p: LtvLayersParams, zero: Any, layer: int, theta: torch.Tensor, positions: tuple[int, ...],
               conditions: dict[str, Any], ltv_gold_prob: float, scores: Any, progress: Any, shape: Shape,
               sizes: Sizes) -> dict[str, Any]:
    """The mechanism stages `p.stages()` asks for: key heads (saliency, ablation against random sets, overlaps), OV
    reconstruction and linear propagation of theta at the input of `layer`; `conditions` and `ltv_gold_prob` (mean
    gold probability) are theta's own scores on `zero`, already measured. A stage not asked for is absent."""
    lm = ctx.lm
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model
    stages = p.stages()
    inj = Injection({layer: theta}, positions)
    n, t0 = sizes.n(p.prompts), sizes.prompt(0)  # the plan's stages (`ltv_costs.mechanism_work`)
    plan = mechanism_work(p, shape, layer, n, t0)
    share = plan_spans(plan, shape)
    if "key_heads" in stages:  # the saliency's share of the key heads' stage
        lo, hi = share["key heads"]
        share["ablation"] = (lo + (hi - lo) * saliency_work(n, t0).cost().weight(shape)
                             / max(plan.stage("key heads").weight(shape), 1e-9), hi)
    out: dict[str, Any] = {}
    if "key_heads" in stages:
        progress(share["key heads"][0], "head saliency")
        sal = head_saliency(lm, zero, inj, EVAL_BATCH)
        # heads before the injection layer never see theta: key heads and random sets come from layers >= layer
        later = sal.copy()
        later[:layer] = -np.inf
        pool = [(l, h) for l in range(layer, L) for h in range(H)]
        k = min(n_top(L, H, p.key_pct), len(pool))
        key = top_heads(later, k=k)
        # the random sets: from the later heads that are not key heads (`random_heads`, the control of every kind)
        draws = [sorted(random_heads(L, H, k, p.seed, exclude=key, draw=i + 1, pool=pool))
                 for i in range(p.random_draws)]
        progress(share["ablation"][0], "ablating key and random heads")
        abl = evaluate_injections(lm, zero, [Injection({layer: theta}, positions, mask=head_mask(lm, hs))
                                             for hs in [key, *draws]], EVAL_BATCH)
        rand = [abl.summary(i + 1) for i in range(len(draws))]
        racc = np.array([r["accuracy"] for r in rand])
        ov_overlap = {nm: overlap(sal, np.asarray(getattr(scores, nm)), k) for nm in ("tr", "tl", "induction")}
        probs = {"ltv": ltv_gold_prob, "ablated": float(abl.gold_prob[0].mean()),
                 "random": float(abl.gold_prob[1:].mean())}
        out["key_heads"] = {"saliency": sal, "heads": key, "ltv": conditions["ltv"], "ablated": abl.summary(0),
                            "random": rand, "random_heads": draws, "random_accuracy_mean": float(racc.mean()),
                            "random_accuracy_std": float(racc.std()), "gold_prob": probs, "overlap": ov_overlap}

    if "ov" in stages:
        progress(share["OV reconstruction"][0], "OV reconstruction")
        rec, head_norms = ov_reconstruction(lm, zero, layer, theta, positions, EVAL_BATCH)
        ov_out = evaluate_injections(lm, zero, [Injection(final=rec), Injection({layer: rec}, (-1,)),
                                                Injection(final=theta), Injection(final=theta.cpu() + rec)],
                                     EVAL_BATCH)
        cos = float(torch.nn.functional.cosine_similarity(rec, theta.cpu(), dim=0))
        out["ov"] = {"heads": head_norms, "norm": float(rec.norm()), "cosine": cos, "final": ov_out.summary(0),
                     "same_layer": ov_out.summary(1), "direct": ov_out.summary(2), "direct_and_ov": ov_out.summary(3)}

    if "propagation" in stages:
        n = p.n_perturbations(d)
        if n < d:
            ctx.warn(f"linear propagation: {n} perturbations for d_model {d}: W is the minimum-norm fit in their "
                     f"span")
        lo, hi = share["linear propagation"]
        progress(lo, "linear propagation")
        fit = linear_propagation(lm, zero, layer, theta, positions, n, seed=p.seed,
                                 progress=lambda f, m="": progress(lo + (hi - lo) * f, "linear propagation"))
        if not math.isfinite(fit["r2"]):
            raise TaskError("linear propagation: the least-squares fit failed (non-finite R^2)")
        sur = evaluate_injections(lm, zero, [Injection(final=fit["w"] @ theta.cpu())], EVAL_BATCH).summary(0)
        gain = conditions["ltv"]["accuracy"] - conditions["zero_shot"]["accuracy"]
        recovered = (sur["accuracy"] - conditions["zero_shot"]["accuracy"]) / gain if gain > 0 else None
        out["propagation"] = {"rotation": fit["rotation"], "stretch": fit["stretch"], "r2": fit["r2"], "n": n,
                              "surrogate": sur, "recovered": recovered}
    progress(1.0, "mechanism")
    return out
