"""Kind `site_alphas`: soft head selection (SITE) — learned per-head alphas that inject an ICL-derived task embedding
into zero-shot prompts, and what they say about the heads.

Method (see `soft_select.py`): t[l, h] = the mean last-token z of head (l, h) over M few-shot prompts
of the training split; z[l, h] <- (1 - alpha) z + alpha t at the last prompt token of the prefill, alpha =
sigmoid(logits) with logits (layers, heads) from 0, Adam on the cross-entropy of the gold first token of random
zero-shot training prompts; validation every `val_every` steps, the best alphas kept. Evaluation: greedy
generation with the KV cache (the injection in the prefill only), the answer cut at the task's separator or a
newline; first-token accuracy, label accuracy, TR ratio, exact match.

Besides: baselines (zero-shot, k-shot ICL where the context fits, the function vector and the vanilla task vector
at the input of the middle layer as on the Steering page, every alpha = 1, the cached LTV), top-k / bottom-k patching by alpha,
the budget curve over M (a SITE run per M, through the cache), and rank correlations of alpha with the TR, TL and
induction maps (and the LTV's key-head saliency, when cached). The alphas and t are saved in the tensor store
(checked to take a file before the training starts); the result's `tensor` is their id, which `load` takes.
"""
from __future__ import annotations

import math
import time
from typing import Any, Literal

import torch
from pydantic import Field, field_validator

from ..primitives import options as o
from ...text import clip
from ...model.hooks import hooked
from ..kernel import Context
from ..kinds import get_kind
from ..params import Int, TensorId
from ..primitives import cost
from ..primitives.cost import NONE, Shape, Sizes, Work, passes, steps
from ..results import Grid, Head, Metrics, Model, Overlap, PairedTest, Result, TensorsInline
from .recipe import SiteRecipeParams
from ..primitives.batching import build_prompts, encode
from ..primitives.capture import capture_means
from .generate import evaluate_generation, require_kv_cache, stop_strings
from ..primitives.inject import vector_at
from ..primitives.rates import config_outcomes, curve_intervals, paired_along, paired_metrics
from ..primitives.stats import rate_ci_of
from ..primitives.saved import require_writable
from ..primitives.stages import planned
from ..primitives.threads import cpu_threads
from .site_links import correlations as alpha_correlations
from .site_links import ltv_row
from .soft_select import (decisive_shares, encode_all, hard_alpha, hook_factory, load_site,
                                     lora_params, ranked_heads, save_site, site_data, train_alphas)
from ..primitives.configs import RowConfig, score_configs


SiteComparison = Literal["zero_shot", "icl", "fv", "vanilla", "all_ones", "ltv"]


SiteCorrelation = Literal["tr", "tl", "induction", "ltv"]


def _unique_ints(v: list[int]) -> list[int]:
    if any(k < 1 for k in v):
        raise ValueError("values must be at least 1")
    return sorted(set(v))


class SiteAlphasParams(SiteRecipeParams):
    """kind `site_alphas`: train SITE alphas (or load saved ones) and evaluate them zero-shot with generation; compare
    with zero-shot, k-shot ICL, the function and vanilla task vectors, every alpha = 1 and LTV; patch the top /
    bottom k heads by alpha; the alpha budget curve over M; rank correlations with the TR / TL / induction maps."""

    compare: list[SiteComparison] = Field(default_factory=lambda: ["zero_shot", "icl", "fv", "vanilla", "all_ones",
                                                                   "ltv"], max_length=6,
                                          description="baselines (empty: none); ltv only when its result is cached")
    icl_shots: list[Int] = Field(default_factory=lambda: list(o.SITE_ICL_SHOTS), max_length=8,
                                 description="demonstrations of the ICL baselines (those that fit)")
    patching: list[Int] = Field(default_factory=lambda: list(o.SITE_PATCH_KS), max_length=64,
                                description="k of the top-k / bottom-k patching curves (empty: none)")
    budget: list[Int] = Field(default_factory=lambda: list(o.SITE_BUDGET), max_length=16,
                              description="M values of the budget curve, each a SITE run (empty: none)")
    correlations: list[SiteCorrelation] = Field(default_factory=lambda: ["tr", "tl", "induction", "ltv"], max_length=4,
                                                description="maps to rank-correlate alpha with (ltv: when cached)")
    load: TensorId("site") | None = Field(None, description="a saved SITE file (alphas and task embedding), by its "
                                                            "id (a site result's `tensor`, or POST /tensors), to "
                                                            "evaluate instead of training")
    tensor_fields = ("load",)

    def writes_tensors(self) -> bool:
        return not self.load

    @field_validator("compare", "correlations")
    @classmethod
    def _unique_names(cls, v: list[str]) -> list[str]:
        return list(dict.fromkeys(v))

    @field_validator("icl_shots")
    @classmethod
    def _shots_list(cls, v: list[int]) -> list[int]:
        if any(k < 0 for k in v):
            raise ValueError("shots must be non-negative")
        return sorted(set(v))

    @field_validator("patching", "budget")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        return _unique_ints(v)

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """The run's stages in order: task embedding, training (unless loaded), test, each baseline of `compare`
        (fv and vanilla: "vectors"), patching, each budget run ("budget M=m"), the correlations' head scores."""
        n, t0 = sizes.n(self.prompts), sizes.prompt(0)
        w = self.test_work(sizes) if self.load else super().work(shape, sizes)
        gen = lambda name, k=1, t=t0: cost.generation(name, k * n, t, self.max_new_tokens)  # noqa: E731
        vectors = [v for v in ("fv", "vanilla") if v in self.compare]
        for name in self.compare:
            if name in ("zero_shot", "all_ones"):
                w = w + gen(name)
            elif name == "icl":
                w = w + sum((gen("icl", 1, sizes.prompt(k)) for k in self.icl_shots), NONE)
            elif name in vectors and name == vectors[0]:  # the vectors kind, then a generation per vector
                vp = get_kind("task_vectors").params(types=vectors, shots=self.shots, prompts=min(self.prompts, o.PROMPTS))
                w = w + (vp.work(shape, sizes) + gen("vectors", len(vectors))).named("vectors")
        if self.patching:  # the clean pass, then a last-token step per top-k and bottom-k set
            w = w + passes("patching", n, t0) + steps("patching", 2 * len(self.patching) * n)
        if not self.load:  # the budget curve: a SITE run per other M (embedding, training, test)
            w = w + sum(((self.training_work(sizes, m) + self.test_work(sizes)).named(f"budget M={m}")
                         for m in self.budget if m != self.m), NONE)
        if {"tr", "tl", "induction"} & set(self.correlations):
            w = w + get_kind("head_scores").params(prompts=min(self.prompts, o.PROMPTS), seed=self.seed).work(
                shape, sizes).named("head scores")
        return w


class GenMetrics(Metrics):
    """Metrics of greedy generation: the first-token ones (from the prefill's logits) and two answer matches of
    the continuation cut at the task's separator or a newline."""

    exact_match: float | None = Field(None, description="the cut continuation begins with the gold answer, ending "
                                                        "at a word boundary (the reference's rule)")
    strict_match: float | None = Field(None, description="the cut continuation is exactly the gold answer (the "
                                                         "model also ended it)")
    exact_match_ci: tuple[float, float] | None = Field(None, description="95% Wilson interval of exact_match")


class SiteRow(Model):
    query: str
    gold: str
    output: str = Field(..., description="the continuation, cut at the separator or a newline")
    correct: bool = Field(..., description="first token right")
    exact: bool


class ValPoint(Model):
    step: int
    loss: float = Field(..., description="mean cross-entropy of the gold first token on the validation prompts")
    accuracy: float


class SiteBaseline(Model):
    """One row of the comparison table."""

    label: str
    metrics: GenMetrics | None = None
    params: int | None = Field(None, description="numbers that define the method (trained or extracted)")
    trainable: int = Field(0, description="trained parameters")
    seconds: float | None = Field(None, description="training seconds (trained methods)")
    note: str = ""


class PatchCurve(Model):
    accuracy: list[float]
    label_accuracy: list[float]
    tr_ratio: list[float]
    heads: list[Head] = Field(default_factory=list, description="the ranking walked (largest k's set)")
    accuracy_ci: list[tuple[float, float]] | None = Field(None, description="95% Wilson interval per k")
    label_accuracy_ci: list[tuple[float, float]] | None = None
    tr_ratio_ci: list[tuple[float, float]] | None = None


class SitePatching(Model):
    """Zero-shot prompts with t injected outright (alpha = 1) at the top-k or bottom-k heads by alpha only."""

    ks: list[int]
    top: PatchCurve
    bottom: PatchCurve
    tests: dict[str, list[PairedTest]] | None = Field(None, description="per rate, per k: top-k against bottom-k on "
                                                                        "the same prompts (effect = top minus bottom)")


class SiteBudget(Model):
    """SITE trained with M few-shot prompts in the task embedding, per M."""

    m: list[int]
    accuracy: list[float]
    exact_match: list[float]
    tr_ratio: list[float]
    decided: list[float] = Field(..., description="share of alphas under 0.1 or over 0.9")
    train_seconds: list[float]


class SiteAlphasResult(Result, TensorsInline):
    """kind `site_alphas`: soft head selection (SITE) on one task."""

    n_layers: int
    n_heads: int
    head_dim: int
    m: int = Field(..., description="few-shot prompts averaged into the task embedding")
    shots: int = Field(..., description="demonstrations per embedding prompt (fewer than asked when the task or "
                                        "the context is short)")
    steps: int
    prompts: int = Field(..., description="held-out test prompts")
    n_train: int = Field(..., description="zero-shot training queries")
    n_val: int = Field(..., description="validation queries")
    alpha: Grid = Field(..., description="(layers, heads) sigmoid of the kept logits")
    alpha_logits: Grid
    decisive: dict[str, float] = Field(..., description="low: share of alpha < 0.1, high: > 0.9, decided: both; "
                                                        "decided_2x: under 0.2 or over 0.8")
    loss: list[float] = Field(default_factory=list, description="training loss per step")
    val: list[ValPoint] = Field(default_factory=list)
    best_step: int = Field(0, description="the validation step whose alphas are kept (0: the initial ones)")
    site: GenMetrics = Field(..., description="zero-shot prompts with the soft injection (the test set)")
    site_hard: GenMetrics = Field(..., description="the same with the alphas rounded to 0 / 1 at 0.5")
    tests: dict[str, dict[str, PairedTest]] = Field(default_factory=dict, description="\"site vs <baseline>\" -> rate "
                                                    "-> paired test on the same test queries (effect = SITE minus it)")
    baselines: dict[str, SiteBaseline] = Field(default_factory=dict, description="zero_shot, icl_<k>, fv, vanilla, "
                                                                                 "all_ones, ltv (those asked for)")
    params_count: dict[str, int] = Field(..., description="site: layers x heads; lora: rank-8 LoRA on q and v")
    patching: SitePatching | None = None
    budget: SiteBudget | None = None
    correlations: dict[str, Overlap] = Field(default_factory=dict, description="alpha against the tr, tl, induction "
                                                                               "and LTV key-head saliency maps")
    train_seconds: float = Field(..., description="the training loop (0 for loaded alphas)")
    embed_seconds: float = Field(..., description="building the task embedding")
    tensor: str = Field(..., description="id of the safetensors file with the alphas and the task embedding (GET "
                                         "/tensors/{id}; `load` takes it)")
    loaded: bool = False
    stop: list[str] = Field(default_factory=list, description="where a generated answer is cut")
    examples: list[SiteRow] = Field(default_factory=list)
    multi_token_labels: list[str] = Field(default_factory=list)


RECIPE = tuple(k for k in SiteRecipeParams.model_fields if k != "batch_size")  # the saved recipe (not the batching)
EXAMPLES = 10


def gen_metrics(ev: dict[str, Any]) -> dict[str, Any]:
    out = {k: ev[k] for k in ("accuracy", "label_accuracy", "tr_ratio", "n", "exact_match", "strict_match",
                              "accuracy_ci", "label_accuracy_ci", "tr_ratio_ci", "per_prompt") if k in ev}
    if out.get("exact_match") is not None and out.get("n"):
        out["exact_match_ci"] = rate_ci_of(out["exact_match"], out["n"])
    return out


def site_tests(site: dict[str, Any], baselines: dict[str, Any]) -> dict[str, Any]:
    """SITE against each baseline run on the same test queries (ICL: where its prompts hold them in order)."""
    tests = {f"site vs {k}": paired_metrics(site, b["metrics"]) for k, b in baselines.items()
             if b.get("metrics") and b.get("paired", k != "ltv")}
    return {k: v for k, v in tests.items() if v is not None}


def site_alphas(ctx: Context, p: SiteAlphasParams) -> dict[str, Any]:
    with cpu_threads(ctx.lm):
        return _site(ctx, p)


def _site(ctx: Context, p: SiteAlphasParams) -> dict[str, Any]:
    lm, task = ctx.lm, ctx.task
    require_kv_cache(lm)
    if not p.load:
        require_writable(ctx.tensors, "site")  # a folder that cannot take the alphas: an error now, not after
    data = site_data(lm, task, m=p.m, shots=p.shots, val_prompts=p.val_prompts, test_prompts=p.prompts, seed=p.seed)
    for w in data.warnings:
        ctx.warn(w)
    enc = encode_all(lm, task, data)
    stop = stop_strings(task)
    L, H = lm.n_layers, lm.n_heads
    gen = dict(stop=stop, max_new_tokens=p.max_new_tokens, batch_size=p.batch_size)
    share = _progress(ctx, p)

    # -- the task embedding and the alphas: trained, or loaded ---------------------------------------------------
    loss: list[float] = []
    val: list[dict[str, float]] = []
    best_step, train_s, embed_s = 0, 0.0, 0.0
    if p.load:
        alpha, t, meta = load_site(ctx.tensors, p.load, lm)
        logits = torch.logit(alpha.clamp(1e-6, 1 - 1e-6)).cpu()
        if meta.get("task_hash") and meta["task_hash"] != task.content_hash():
            ctx.warn(f"the saved alphas were trained on task {clip(meta.get('task') or '?', 80)!r}; evaluated here "
                     f"on {clip(task.name, 80)!r} with their own task embedding")
        best_step = meta["recipe"].get("best_step", 0)
        best_step = best_step if type(best_step) is int and best_step >= 0 else 0
        tid = p.load
        ctx.progress(share["SITE test"][0], "loaded the alphas")
    else:
        t0 = time.perf_counter()
        t = capture_means(lm, enc["embed"], "z", p.batch_size, ctx.stage(*share["task embedding"], "task embedding"))
        embed_s = time.perf_counter() - t0
        tr = train_alphas(lm, t, enc["train"], enc["val"], steps=p.steps, lr=p.lr, batch=p.train_batch,
                          val_every=p.val_every, seed=p.seed, progress=ctx.stage(*share["training"], "training"),
                          live=ctx.live, beta2=p.beta2, keep=p.keep_alpha)
        logits, loss, val, best_step, train_s = tr.logits, tr.loss, tr.val, tr.best_step, tr.seconds
        alpha = tr.alpha
        recipe = {k: getattr(p, k) for k in RECIPE} | {"shots_used": data.shots, "best_step": best_step}
        tid = save_site(ctx.tensors, lm, logits, t, task, recipe)
    alpha = alpha.float().cpu()
    t = t.float()

    # -- SITE on the test prompts --------------------------------------------------------------------------------
    ev = evaluate_generation(lm, enc["test"], hooks=hook_factory(lm, alpha, t), keep_rows=EXAMPLES,
                             progress=ctx.stage(*share["SITE test"], "evaluating"), **gen)
    hard = evaluate_generation(lm, enc["test"], hooks=hook_factory(lm, (alpha > 0.5).float(), t), **gen)
    n_test = len(enc["test"].ids)

    baselines = _baselines(ctx, p, enc, t, gen, n_test, data.shots, share)
    patching = _patching(ctx, p, enc, alpha, t, share["patching"]) if p.patching else None
    budget = _budget(ctx, p, ev, alpha, train_s, share) if p.budget else None
    correlations = alpha_correlations(ctx, p, alpha.numpy(), share.get("head scores", (1.0, 1.0)))
    ctx.progress(1.0, "done")
    return {"n_layers": L, "n_heads": H, "head_dim": lm.head_dim, "m": len(data.embed), "shots": data.shots,
            "steps": p.steps, "prompts": n_test, "n_train": len(data.train), "n_val": len(data.val),
            "alpha": alpha.numpy(), "alpha_logits": logits.float().numpy(), "decisive": decisive_shares(alpha.numpy()),
            "loss": loss, "val": val, "best_step": best_step, "site": gen_metrics(ev), "site_hard": gen_metrics(hard),
            "baselines": baselines, "tests": site_tests(gen_metrics(ev), baselines),
            "params_count": {"site": L * H, "lora": lora_params(lm), "task_embedding": L * H * lm.head_dim},
            "patching": patching, "budget": budget, "correlations": correlations, "train_seconds": train_s,
            "embed_seconds": embed_s, "tensor": tid, "loaded": bool(p.load), "stop": stop, "examples": ev["rows"],
            "multi_token_labels": sorted(set().union(*(e.multi_token for e in enc.values())))}


# -- baselines ---------------------------------------------------------------------------------------------------------
def _progress(ctx: Context, p: SiteAlphasParams) -> dict[str, tuple[float, float]]:
    """The progress bar's spans: the plan's stages (`SiteAlphasParams.work`), sub-results already cached weighing 0."""
    skip, fields = set(), {"prompts": min(p.prompts, o.PROMPTS), "seed": p.seed}
    vectors = [v for v in ("fv", "vanilla") if v in p.compare]
    if vectors and ctx.cached("task_vectors", [{"types": vectors, **fields}], record=False) is not None:
        skip.add("vectors")
    if ctx.cached("head_scores", [{"shots": o.SHOTS, **fields}], record=False) is not None:
        skip.add("head scores")
    return planned(ctx, p, skip)


def _baselines(ctx: Context, p: SiteAlphasParams, enc: dict[str, Any], t: torch.Tensor, gen: dict[str, Any], n_test: int,
               shots_used: int, share: dict[str, tuple[float, float]]) -> dict[str, Any]:
    lm, task = ctx.lm, ctx.task
    L, H, d = lm.n_layers, lm.n_heads, lm.d_model
    out: dict[str, Any] = {}
    todo = list(p.compare)
    stage = lambda name, i=0, k=1: ctx.stage(*_part(share[name], i, k))  # noqa: E731
    layer = L // 2
    for i, name in enumerate(todo):
        if name == "zero_shot":
            ev = evaluate_generation(lm, enc["test"], progress=stage(name), **gen)
            out["zero_shot"] = {"label": "0-shot", "metrics": gen_metrics(ev), "params": 0}
        elif name == "icl":
            for j, k in enumerate(p.icl_shots):
                built = build_prompts(lm, task, k, n_test, p.seed)
                if built.shots != k:
                    out[f"icl_{k}"] = {"label": f"{k}-shot ICL", "note": f"{k} demonstrations do not fit the "
                                       f"context window of {lm.max_positions} tokens; not run"}
                    continue
                ev = evaluate_generation(lm, encode(lm, built.prompts, task.kind), progress=stage(name, j, len(p.icl_shots)),
                                         **gen)
                out[f"icl_{k}"] = {"label": f"{k}-shot ICL", "metrics": gen_metrics(ev), "params": 0,
                                   "note": f"{k} demonstrations in the prompt",
                                   "paired": [q.query for q in built.prompts] == [q.query for q in enc["test"].prompts]}
        elif name in ("fv", "vanilla"):
            if name in out:
                continue
            want = [v for v in ("fv", "vanilla") if v in todo]
            r = ctx.call("task_vectors", types=want, shots=shots_used, prompts=min(p.prompts, o.PROMPTS), seed=p.seed,
                         batch_size=p.batch_size, progress=stage("vectors"), warn_prefix="vectors: ")
            for v in want:
                if v in out:
                    continue
                if v not in r.vectors:
                    out[v] = {"label": _LABELS[v], "note": "not available for this task"}
                    continue
                vec = vector_at(r.vectors[v].vector, layer)
                hooks = lambda b, vec=vec: hooked(lm, inject={layer: vec}, inject_positions=(-1,),  # noqa: E731
                                                  last=b.last, prefill_only=True)
                ev = evaluate_generation(lm, enc["test"], hooks=hooks, **gen)
                out[v] = {"label": _LABELS[v], "metrics": gen_metrics(ev), "params": d,
                          "note": f"added at the input of layer {layer}, last token (as on the Steering page)"
                                  + (f"; heads {', '.join(f'L{a}.H{b}' for a, b in r.vectors[v].heads)}"
                                     if r.vectors[v].heads else "")}
        elif name == "all_ones":
            ev = evaluate_generation(lm, enc["test"], hooks=hook_factory(lm, torch.ones(L, H), t), progress=stage(name),
                                     **gen)
            out["all_ones"] = {"label": "every α = 1", "metrics": gen_metrics(ev), "params": L * H * lm.head_dim,
                               "note": "every head's last-token z replaced by its task embedding"}
        elif name == "ltv":
            row = ltv_row(ctx, p.prompts, p.seed)
            out["ltv"] = row or {"label": "LTV", "note": "no cached LTV result for this model, task and seed: run "
                                                         "it on the LTV page (or `python -m backend ltv`)"}
    return out


_LABELS = {"fv": "function vector", "vanilla": "vanilla task vector"}


def _patching(ctx: Context, p: SiteAlphasParams, enc: dict[str, Any], alpha: torch.Tensor, t: torch.Tensor,
              span: tuple[float, float] = (0.75, 0.8)) -> dict[str, Any]:
    lm = ctx.lm
    total = lm.n_layers * lm.n_heads
    ks = sorted({min(k, total) for k in p.patching})
    order = ranked_heads(alpha.numpy())
    configs = []
    for k in ks:
        configs.append(RowConfig(mask=1.0 - hard_alpha(lm, order[:k]), scope="last"))
    for k in ks:
        configs.append(RowConfig(mask=1.0 - hard_alpha(lm, order[::-1][:k]), scope="last"))
    res = score_configs(lm, enc["test"], configs, fill=t, batch_size=o.CONFIG_BATCH_SIZE,
                         progress=ctx.stage(*span, "patching"))
    means = res.means()
    n = len(ks)
    curve = lambda sl, heads: ({m: [float(x) for x in v[sl]] for m, v in means.items()} | {"heads": heads}  # noqa: E731
                               | curve_intervals(res, range(sl.start, sl.stop)))
    tests = paired_along([config_outcomes(res, j) for j in range(n)], [config_outcomes(res, n + j) for j in range(n)])
    return {"ks": ks, "top": curve(slice(0, n), order[:ks[-1]]), "bottom": curve(slice(n, 2 * n), order[::-1][:ks[-1]]),
            "tests": tests}


# -- budget -----------------------------------------------------------------------------------------------------------
def _part(span: tuple[float, float], i: int, k: int) -> tuple[float, float]:  # the i-th of k equal parts
    lo, hi = span
    return lo + (hi - lo) * i / max(k, 1), lo + (hi - lo) * (i + 1) / max(k, 1)


def _budget(ctx: Context, p: SiteAlphasParams, ev: dict[str, Any], alpha: torch.Tensor, train_s: float,
            share: dict[str, tuple[float, float]]) -> dict[str, Any] | None:
    if p.load:
        ctx.warn("no budget curve for loaded alphas (it trains SITE with each M)")
        return None
    ms = list(p.budget)
    rows: dict[str, list[float]] = {k: [] for k in ("accuracy", "exact_match", "tr_ratio", "decided", "train_seconds")}
    fields = {k: getattr(p, k) for k in RECIPE if k != "m"} | {"batch_size": p.batch_size}
    for i, m in enumerate(ms):
        if m == p.m:
            acc, em, trr, dec, sec = ev["accuracy"], ev["exact_match"], ev["tr_ratio"], \
                decisive_shares(alpha.numpy())["decided"], train_s
        else:
            r = ctx.call("site_alphas", m=m, compare=[], patching=[], budget=[], correlations=[], **fields,
                         progress=ctx.stage(*share[f"budget M={m}"], f"budget M={m}"))
            acc, em, trr, dec, sec = r.site.accuracy, r.site.exact_match, r.site.tr_ratio, r.decisive["decided"], \
                r.train_seconds
        for k, v in zip(rows, (acc, em, trr, dec, sec)):
            rows[k].append(float(v if v is not None else math.nan))
    return {"m": ms, **rows}


# -- correlations -------------------------------------------------------------------------------------------------------
