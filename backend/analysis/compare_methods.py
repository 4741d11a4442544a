"""Kind `compare_methods`: every steering method on one task and model, side by side.

Rows: zero-shot and k-shot ICL (references); the extracted vectors — vanilla task vector, function vector, top-TR
and top-TL head-set vectors — added at one layer's input at the last token (the cached `steer` result); the
learned task vector (the cached `ltv` result, when there is one, or trained with `ltv=true`); SITE (the `site`
kind with these settings). Each with first-token accuracy, label accuracy, TR ratio, the numbers that define the
method, how many of them are trained, and the training seconds. All on the same zero-shot test queries (the task's
held-out query pool, the first `prompts`).

Layers: every vector is compared at one fixed layer (`layer`, default L/2: the input of that decoder layer, as the
LTV paper compares them); with `sweep`, also at its own best layer (the extracted vectors from a `steer` run over
every layer, the LTV from its cached layer scan), chosen on the same prompts (an upper bound, said in the note).
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from .primitives import options as o
from .kernel import Context
from .kinds import KINDS, get_kind
from .params import Bool, Int, Layer, PromptParams, Selection
from .primitives.cost import Shape, Sizes, Work
from .results import Model, Result, TensorsInline
from .primitives.configs import resolve_layers
from .primitives.stages import planned


class CompareMethodsParams(Selection, PromptParams):
    """kind `compare_methods`: every steering method on one task and model side by side: the extracted vectors (vanilla,
    function vector, TR / TL head sets, from `steer`), LTV (its cached result) and SITE; accuracy, TR ratio,
    parameter count and training seconds."""

    layer: Layer | None = Field(None, description="injection layer of the extracted vectors (a decoder layer's "
                                                  "input); None = L/2")
    site_m: Int = Field(o.SITE_M, ge=1, le=10_000, description="SITE: few-shot prompts of the task embedding")
    site_shots: Int = Field(o.SITE_SHOTS, ge=0, description="SITE: demonstrations per embedding prompt")
    site_steps: Int = Field(o.SITE_STEPS, ge=0, le=100_000, description="SITE: training steps")
    ltv: Bool = Field(False, description="train the LTV when no cached result is found (else it is left out)")
    sweep: Bool = Field(False, description="also each extracted vector's best layer over every layer (a `steer` "
                                           "run) and the LTV's (when its layer scan is cached); chosen on the "
                                           "same prompts, so an upper bound")

    def writes_tensors(self) -> bool:
        return True  # SITE, and LTV with `ltv`

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """The `steer` of the extracted vectors, the `site` run with these settings and, with `ltv`, an LTV: the
        sub-calls' own work (each is cached; this counts them all)."""
        sel = {"top_pct": self.top_pct, "top_k": self.top_k}
        w = get_kind("steer").params(vectors=[k for k, _, _ in EXTRACTED], layer=self.layer, shots=self.shots,
                                     prompts=self.prompts, seed=self.seed, **sel).work(shape, sizes).named("steer")
        if self.ltv and "ltv" in KINDS:  # in the run's order: steer, LTV, SITE
            w = w + get_kind("ltv_layers").params(shots=self.shots, prompts=self.prompts, seed=self.seed, **sel).work(
                shape, sizes).named("LTV")
        w = w + get_kind("site_alphas").params(m=self.site_m, shots=self.site_shots, steps=self.site_steps,
                                        prompts=self.prompts, seed=self.seed).work(shape, sizes).named("SITE")
        return w


class MethodRow(Model):
    key: str
    name: str
    family: str = Field(..., description="reference | extracted | trained")
    accuracy: float | None = None
    label_accuracy: float | None = None
    tr_ratio: float | None = None
    exact_match: float | None = None
    accuracy_ci: tuple[float, float] | None = Field(None, description="95% Wilson interval over the row's prompts")
    label_accuracy_ci: tuple[float, float] | None = None
    tr_ratio_ci: tuple[float, float] | None = None
    exact_match_ci: tuple[float, float] | None = None
    n: int | None = Field(None, description="prompts the row's rates are measured on")
    params: int | None = Field(None, description="numbers that define the method")
    trainable: int = 0
    train_seconds: float | None = None
    source: str = Field("", description="the analysis kind the numbers come from")
    note: str = ""
    layer: int | None = Field(None, description="the decoder layer whose input the vector is added to (vectors)")
    best_layer: int | None = Field(None, description="with `sweep`: the layer of the best accuracy over the layers")
    best_accuracy: float | None = Field(None, description="with `sweep`: the accuracy there (chosen on these "
                                                          "prompts: an upper bound)")


class CompareMethodsResult(Result, TensorsInline):
    """kind `compare_methods`: every steering method on one task and model, side by side."""

    layer: int
    shots: int
    prompts: int
    rows: list[MethodRow]
    missing: list[str] = Field(default_factory=list, description="methods left out, and why")


EXTRACTED = (("vanilla", "vanilla task vector", "mean ICL minus zero-shot hidden state at the layer"),
             ("fv", "function vector", "summed mean writes of the top heads by causal indirect effect"),
             ("tr", "TR heads", "summed mean writes of the top TR heads"),
             ("tl", "TL heads", "summed mean writes of the top TL heads"))


def compare_methods(ctx: Context, p: CompareMethodsParams) -> dict[str, Any]:
    lm = ctx.lm
    layer = resolve_layers(lm, p.layer)[0]
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model
    sel = {"top_pct": p.top_pct, "top_k": p.top_k}
    rows: list[dict[str, Any]] = []
    missing: list[str] = []

    sub = {"steer": dict(vectors=[k for k, _, _ in EXTRACTED], layer="all" if p.sweep else layer, shots=p.shots,
                         prompts=p.prompts, seed=p.seed, **sel),
           "SITE": dict(m=p.site_m, shots=p.site_shots, steps=p.site_steps, prompts=p.prompts, seed=p.seed)}
    # progress by the plan's stages (`work`): a sub-call already cached weighs nothing
    skip = {n for n, kind in (("steer", "steer"), ("SITE", "site"))
            if ctx.cached(kind, [sub[n]], record=False) is not None}
    if p.ltv and ctx.cached("ltv_layers", _ltv_tries(ctx, p), record=False) is not None:
        skip.add("LTV")  # (without `ltv`, the plan has no LTV stage)
    share = planned(ctx, p, skip)
    steer = ctx.call("steer", **sub["steer"], batch_size=p.batch_size,
                     progress=ctx.stage(*share["steer"], "extracted vectors"), warn_prefix="steer: ")
    at = steer.layers.index(layer)
    rows.append({"key": "zero_shot", "name": "0-shot", "family": "reference", **_m(steer.zero_shot), "params": 0,
                 "source": "steer", "note": "no demonstrations, nothing injected"})
    rows.append({"key": "icl", "name": f"{steer.shots}-shot ICL", "family": "reference", **_m(steer.icl), "params": 0,
                 "source": "steer", "note": f"{steer.shots} demonstrations in the prompt"})
    for key, name, how in EXTRACTED:
        v = steer.vectors.get(key)
        if v is None:
            missing.append(f"{name}: not built for this task (see the warnings)")
            continue
        rows.append({"key": key, "name": name, "family": "extracted", "accuracy": v.accuracy[at],
                     "label_accuracy": v.label_accuracy[at], "tr_ratio": v.tr_ratio[at], "n": steer.prompts,
                     **{f"{r}_ci": (getattr(v, f"{r}_ci") or [None] * (at + 1))[at] for r in _RATES},
                     "params": d, "trainable": 0,
                     "train_seconds": 0.0, "source": "steer", "layer": layer,
                     **(best_of(steer.layers, v.accuracy) if p.sweep else {}),
                     "note": f"{how}; added at layer {layer}'s input, last token; extracted, not trained"})

    ltv = _ltv(ctx, p, share)
    if ltv is None:
        missing.append("LTV: no cached `ltv` result for this model, task, seed and prompts (run it on the LTV page, "
                       "or ask for it here with ltv=true)")
    else:
        try:
            m = ltv.table["ltv"]
            train = next((pl.training for pl in ltv.per_layer if ltv.layer in pl.layers), None)
            n_vec = len(train.layers) if train is not None else 1
            best = (best_of(ltv.layers, ltv.sweep["ltv"].accuracy) if p.sweep and len(ltv.layers) > 1
                    and not ltv.joint else {})
            if p.sweep and not best:
                missing.append("LTV's best layer: no cached layer scan (run `ltv --layer all`)")
            rows.append({"key": "ltv", "name": "LTV", "family": "trained", **_m(m), "params": n_vec * d,
                         "trainable": n_vec * d, "train_seconds": train.train_seconds if train is not None else None,
                         "source": "ltv", "layer": ltv.layer, **best,
                         "note": f"learned task vector at layer {ltv.layer}'s input"
                         + "".join(f", {k} {v}" for k, v in get_kind("ltv_layers").params.recipe_changes(ltv.params).items())})
        except (AttributeError, KeyError, TypeError):
            missing.append("LTV: its cached result has another shape than this view reads")

    site = ctx.call("site_alphas", **sub["SITE"], batch_size=p.batch_size, progress=ctx.stage(*share["SITE"], "SITE"))
    rows.append({"key": "site", "name": "SITE", "family": "trained", **_m(site.site),
                 "exact_match": site.site.exact_match, "exact_match_ci": site.site.exact_match_ci, "params": L * H + L * H * lm.head_dim, "trainable": L * H,
                 "train_seconds": site.train_seconds, "source": "site",
                 "note": f"per-head alphas injecting a task embedding of {site.m} prompts x {site.shots} shots; "
                         f"{L * H} alphas trained, {L * H * lm.head_dim} embedding values extracted"})
    ctx.progress(1.0, "done")
    return {"layer": layer, "shots": steer.shots, "prompts": steer.prompts, "rows": rows, "missing": missing}


def best_of(layers: list[int], accuracy: list[float]) -> dict[str, Any]:
    """{"best_layer", "best_accuracy"}: the first layer of the highest accuracy (an upper bound: chosen on the
    prompts it is measured on)."""
    i = max(range(len(layers)), key=lambda j: (accuracy[j], -j))
    return {"best_layer": int(layers[i]), "best_accuracy": float(accuracy[i])}


_RATES = ("accuracy", "label_accuracy", "tr_ratio")


def _m(m: Any) -> dict[str, Any]:
    """A row's rates, their 95% intervals and n from a `Metrics`."""
    return {"accuracy": m.accuracy, "label_accuracy": m.label_accuracy, "tr_ratio": m.tr_ratio, "n": m.n or None,
            **{f"{r}_ci": getattr(m, f"{r}_ci", None) for r in _RATES}}


def _ltv_tries(ctx: Context, p: CompareMethodsParams) -> list[dict[str, Any]]:
    """The cached `ltv` results this view reads, in order of preference (see `_ltv`)."""
    return [{"seed": p.seed, "load": None, "prompts": n, **at} for n in dict.fromkeys((p.prompts, o.PROMPTS))
            for at in ({"layer": None}, {"layer": ctx.lm.n_layers // 2}, {"layer": "all", "joint": False})]


def _ltv(ctx: Context, p: CompareMethodsParams, share: dict[str, tuple[float, float]]) -> Any:
    """The LTV result at these settings: cached (its table holds the LTV at L/2: the default layer, L/2 named or the
    layer scan; these prompts, else the default count; any ICL shots, head-set sizes, mechanism settings or
    recipe, the defaults preferred), or (with `ltv`) computed; None when the kind is absent."""
    base = {"shots": p.shots, "seed": p.seed, "top_pct": p.top_pct, "top_k": p.top_k}
    r = ctx.cached("ltv_layers", _ltv_tries(ctx, p))
    if r is None and p.ltv and "ltv" in KINDS:
        fields = get_kind("ltv_layers").params.model_fields
        r = ctx.call("ltv_layers", progress=ctx.stage(*share["LTV"], "LTV"),
                     **{k: v for k, v in {**base, "prompts": p.prompts}.items() if k in fields})
    return r
