"""Kind `attribution_patching`: attribution patching (AtP, Nanda 2022) of every head in one backward pass, beside the
exact `activation_patching` map of the same prompts.

Setup: that of `activation_patching` (the same clean k-shot prompts, target set, pairing and fill). For target prompt
i, head (l, h) and its last-token z[l, h] (the output projection's input, split by head, (head_dim,)), the exact map
runs the target with z[l, h] replaced by the fill f[i, l, h] (paired: clean prompt i's z; mean: the clean mean) and
reads the metric m (the gold answer's first-token probability, or its logit). AtP estimates that change to first
order, from one forward pass of the clean prompts and one forward and one backward pass of the targets:
    atp[i, l, h] = (f[i, l, h] - z_t[i, l, h]) . dm_i / dz[l, h] |_{target run}            (prompts, layers, heads)
    atp[l, h]    = mean_i atp[i, l, h]     ~ prob_gain[l, h] (gold_prob) or logit_gain[l, h] (gold_logit)
with its standard error and a percentile bootstrap interval over prompts. The gradients of all heads come from one
backward pass (rows are independent, so the batch's summed metric gives each row's own gradient), and that pass is
one token long: the targets' prefixes run once without autograd and their last token over the prefix's KV cache,
since a patch of the last token's z changes no earlier position (`z_and_grad`). With the exact
map (`exact=True`, through the cache): Spearman and Kendall over heads, the top-k recall |top_k(atp) & top_k(exact)|
/ k, the exact top-k heads AtP misses, and the cost ratio (exact / AtP), planned (the cost model's units) and in CPU
seconds (when both ran in this call).

AtP* (Kramar et al. 2024): its QK fix recomputes the softmax of a node's own queries and keys instead of
linearising it. The nodes here are heads' outputs z, taken from the two forward passes, so a head's own softmax is
already exact (AtP on z leaves no second-order term inside the head). What AtP* does not fix and this map keeps is
the first-order error downstream of z: later heads' attention at the last token (the patch shifts their queries),
the MLPs, the norms and the output softmax (p(gold) saturates). GradDrop is not implemented either.
"""
from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from ...model.interventions import Tap, intervene
from ...model.loading import LoadedModel
from ...tasks.base import TaskError
from ..kernel import Context
from ..kinds import get_kind
from ..params import Int, PromptParams, Selection
from ..primitives import options as o
from ..primitives.batching import Encoded, Progress, build_prompts, encode, forward_last_logits, make_batch
from ..primitives.cost import Shape, Sizes, Work, passes, training
from ..primitives.patch import Target, gold_ids, target_prompts
from ..primitives.selection import n_top, overlap, top_heads
from ..primitives.stages import planned, run_sizes, shape_of
from ..primitives.stats import bootstrap_ci, stderr
from ..primitives.stopping import check
from ..results import Grid, Head, Model, Result

Metric = Literal["gold_prob", "gold_logit"]
EXACT_FIELD = {"gold_prob": "prob_gain", "gold_logit": "logit_gain"}
"""The exact map each metric's estimate is compared with (`activation_patching`'s field)."""


class AttributionPatchingParams(Selection, PromptParams):
    """kind `attribution_patching`: every head's last-token z patch estimated to first order (one backward pass)."""

    target: Target = Field("zero_shot", description="the prompt set patched into (as activation_patching)")
    patch: Literal["paired", "mean"] = Field("paired", description="paired: clean prompt i's own z into target i; "
                                                                   "mean: the clean prompts' mean z into every one")
    metric: Metric = Field("gold_prob", description="what the gradient is of: p(gold first token) (compared with "
                                                    "the exact prob_gain, the CIE) or its logit (logit_gain)")
    exact: bool = Field(True, description="also run (or read from the cache) the exact activation_patching map of "
                                          "the same params, for the agreement")
    batch_size: Int = Field(o.BATCH_SIZE, ge=1, le=1024)

    def exact_params(self) -> dict[str, Any]:
        """The `activation_patching` params of the same prompts, target and fill."""
        return {"shots": self.shots, "prompts": self.prompts, "seed": self.seed, "top_pct": self.top_pct,
                "top_k": self.top_k, "target": self.target, "patch": self.patch, "prepend_bos": self.prepend_bos}

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        """Clean prompts: one pass; target prompts: one pass of the prefix, then the last token with its backward
        pass; the exact map when asked."""
        n, clean = sizes.n(self.prompts), sizes.prompt(self.shots)
        target = sizes.prompt(0 if self.target == "zero_shot" else self.shots)
        w = passes("clean prompts", n, clean, batch=self.batch_size) + passes(
            "target prompts", n, target, batch=self.batch_size) + training("target prompts", n, 1,
                                                                          batch=self.batch_size)
        if not self.exact:
            return w
        exact = get_kind("activation_patching").params(**self.exact_params()).work(shape, sizes)
        return w + exact.named("exact patching")


class Agreement(Model):
    """AtP against the exact map of the same prompts."""

    exact_map: str = Field(..., description="the activation_patching field compared with")
    exact: Grid = Field(..., description="that exact map (layers, heads)")
    spearman: float | None = Field(None, description="rank correlation over all heads")
    kendall: float | None = None
    jaccard: float = Field(..., description="of the top-k sets")
    recall: float = Field(..., description="|top_k(atp) & top_k(exact)| / k")
    missed: list[Head] = Field(..., description="the exact top-k heads outside AtP's top k, by exact rank")
    exact_top: list[Head]
    max_abs_error: float = Field(..., description="max over heads of |atp - exact|")
    planned_ratio: float = Field(..., description="exact / AtP in the cost model's units (passes, tokens, calls)")
    cpu_ratio: float | None = Field(None, description="exact / AtP in CPU seconds; None when the exact map came "
                                                      "from the cache")
    exact_cpu_seconds: float | None = None


class AttributionPatchingResult(Result):
    """The AtP map (layers, heads), its intervals over prompts, and its agreement with the exact map."""

    n_layers: int
    n_heads: int
    shots: int
    prompts: int
    target: str
    patch: str
    metric: str
    atp: Grid = Field(..., description="first-order estimate of the metric's change when the head is patched")
    atp_se: Grid | None = Field(None, description="standard error of `atp` over prompts")
    atp_lo: Grid | None = Field(None, description="bootstrap interval over prompts, low end")
    atp_hi: Grid | None = Field(None, description="bootstrap interval over prompts, high end")
    clean_metric: float = Field(..., description="mean metric of the clean prompts")
    target_metric: float = Field(..., description="mean metric of the target prompts")
    top_k: int
    top: list[Head] = Field(..., description="the top heads by atp, best first")
    cpu_seconds: float = Field(..., description="CPU seconds of the two forward passes and the backward pass")
    agreement: Agreement | None = None


def read_metric(logits: torch.Tensor, gold: torch.Tensor, metric: str) -> torch.Tensor:
    """Per-row metric (b,) from last-token logits (b, vocab): p(gold) (softmax in float32, float64 logits kept) or the
    gold logit."""
    logits = logits if logits.dtype == torch.float64 else logits.float()
    if metric == "gold_prob":
        return torch.softmax(logits, -1).gather(1, gold[:, None]).squeeze(1)
    return logits.gather(1, gold[:, None]).squeeze(1)


def z_and_grad(lm: LoadedModel, enc: Encoded, metric: str, *, grad: bool, batch_size: int = 16,
               prefix: bool = True, progress: Progress | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None, np.ndarray]:
    """Each prompt's last-token z (prompts, layers, heads, head_dim) float32 on the CPU, with grad: dm_i / dz
    (same shape; m_i the row's metric) from one backward pass per batch, and the metric m (prompts,) float64.

    Without grad: one full pass per batch. With grad and `prefix`: each batch's prefix (every token but the last)
    runs once without autograd, then the last token alone runs over its KV cache with the backward pass (a patch of
    the last token's z changes no earlier position, so its gradient needs no other); where the model's layers do
    not allow that (`last_token.clean_prefixes` is None), or without `prefix`, the whole pass runs with autograd."""
    from ..primitives.last_token import clean_prefixes, step_logits

    L, H, dh = lm.n_layers, lm.n_heads, lm.head_dim
    N = len(enc.ids)
    z = torch.zeros(N, L, H, dh)
    g = torch.zeros(N, L, H, dh) if grad else None
    m = np.zeros(N)
    gold_all = torch.tensor(gold_ids(enc), device=lm.device)
    order = sorted(range(N), key=lambda i: -len(enc.ids[i]))
    with lm.lock:
        for start in range(0, N, batch_size):
            check()
            rows = order[start:start + batch_size]
            pre = clean_prefixes(lm, [enc.ids[r] for r in rows], 0, batch_size=len(rows)) if grad and prefix else None
            with torch.set_grad_enabled(grad):
                if pre is not None:
                    tap = Tap("z")  # the step is the last token alone
                    logits = step_logits(pre, range(len(rows)), hooks=lambda _n: intervene(lm, [tap]))
                else:
                    batch = make_batch(lm, enc.ids, rows)
                    tap = Tap("z", last=batch.last)
                    with intervene(lm, [tap]):
                        logits = forward_last_logits(lm, batch)
                mm = read_metric(logits, gold_all[rows], metric)
                if grad:
                    mm.sum().backward()  # rows are independent: row b's gradient is d m_b / d z_b
            idx = torch.tensor(rows)
            z[idx] = torch.stack([tap.value[l] for l in range(L)], 1).reshape(len(rows), L, H, dh).cpu()
            if g is not None:
                g[idx] = torch.stack([tap.delta[l].grad for l in range(L)], 1).reshape(len(rows), L, H, dh).cpu()
            m[rows] = mm.detach().double().cpu().numpy()
            if progress:
                progress(min(1.0, (start + len(rows)) / N), "attribution")
    return z, g, m


def atp_per_prompt(fill: torch.Tensor, z_t: torch.Tensor, g_t: torch.Tensor) -> np.ndarray:
    """atp[i, l, h] = (fill - z_t)[i, l, h] . g_t[i, l, h]: fill (prompts | 1, L, H, dh) or (L, H, dh); z_t, g_t
    (prompts, L, H, dh) -> (prompts, L, H) float64."""
    return ((fill.double() - z_t.double()) * g_t.double()).sum(-1).numpy()


def attribution_patching(ctx: Context, p: AttributionPatchingParams) -> dict[str, Any]:
    """AtP of every head from the clean ICL prompts into the target set, and its agreement with the exact map."""
    lm, task = ctx.lm, ctx.task
    if task.builder is not None:
        raise TaskError(f"task {task.name!r} builds its own prompts: it has no zero-shot or perturbed counterpart "
                        f"of the same queries to patch into")
    exact_cached = p.exact and bool(ctx.cached_on("activation_patching", [task], p.exact_params()))
    share = planned(ctx, p, skip={"exact patching"} if exact_cached else ())
    cpu0 = time.process_time()
    built = build_prompts(lm, task, p.shots, p.prompts, p.seed)
    for w in built.warnings:
        ctx.warn(w)
    clean = encode(lm, built.prompts, task.kind)
    target = encode(lm, target_prompts(task, p.target, built.shots, built.n, p.seed), task.kind)
    if gold_ids(clean) != gold_ids(target) or [q.query for q in clean.prompts] != [q.query for q in target.prompts]:
        raise TaskError(f"the {p.target.replace('_', ' ')} prompts do not pair with the clean ones (another query or "
                        f"gold token): nothing to patch")
    z_c, _, m_c = z_and_grad(lm, clean, p.metric, grad=False, batch_size=p.batch_size,
                             progress=ctx.stage(*share["clean prompts"], "clean activations"))
    z_t, g_t, m_t = z_and_grad(lm, target, p.metric, grad=True, batch_size=p.batch_size,
                               progress=ctx.stage(*share["target prompts"], "gradients at the target"))
    fill = z_c if p.patch == "paired" else z_c.mean(0)
    per = atp_per_prompt(fill, z_t, g_t)  # (prompts, layers, heads)
    cpu = time.process_time() - cpu0
    L, H = lm.n_layers, lm.n_heads
    atp = per.mean(0)
    lo, hi = bootstrap_ci(per, seed=p.seed)
    k = n_top(L, H, p.top_pct, p.top_k)
    out: dict[str, Any] = {
        "n_layers": L, "n_heads": H, "shots": built.shots, "prompts": built.n, "target": p.target, "patch": p.patch,
        "metric": p.metric, "atp": atp, "atp_se": stderr(per), "atp_lo": lo, "atp_hi": hi,
        "clean_metric": float(m_c.mean()), "target_metric": float(m_t.mean()), "top_k": k,
        "top": top_heads(atp, k=k), "cpu_seconds": cpu,
        "multi_token_labels": sorted(set(clean.multi_token) | set(target.multi_token))}
    if p.exact:
        e0 = time.process_time()
        ex = ctx.call("activation_patching", **p.exact_params(), progress=ctx.stage(*share["exact patching"],
                                                                                   "exact patching"))
        e_cpu = None if ex.cache_hit else time.process_time() - e0
        out["agreement"] = agreement(atp, np.asarray(getattr(ex, EXACT_FIELD[p.metric]), dtype=float), k,
                                     EXACT_FIELD[p.metric], planned_ratio(lm, task, p), cpu, e_cpu)
    return out


def planned_ratio(lm: LoadedModel, task: Any, p: AttributionPatchingParams) -> float:
    """The exact map's planned cost (less its head scores) over AtP's, in the cost model's units."""
    shape, sizes = shape_of(lm), run_sizes(lm, task)
    exact = get_kind("activation_patching").params(**p.exact_params()).work(shape, sizes).without({"head scores"})
    own = p.model_copy(update={"exact": False}).work(shape, sizes)
    return exact.units(shape) / max(own.units(shape), 1e-9)


def agreement(atp: np.ndarray, exact: np.ndarray, k: int, field: str, planned: float, cpu: float,
              exact_cpu: float | None) -> dict[str, Any]:
    """AtP (layers, heads) against the exact map: rank correlations, top-k recall and the exact top heads missed."""
    ov = overlap(atp, exact, k)
    mine, theirs = set(top_heads(atp, k=k)), top_heads(exact, k=k)
    return {"exact_map": field, "exact": exact, **ov, "recall": len(mine & set(theirs)) / k,
            "missed": [h for h in theirs if h not in mine], "exact_top": theirs,
            "max_abs_error": float(np.abs(atp - exact).max()), "planned_ratio": planned,
            "cpu_ratio": None if exact_cpu is None else exact_cpu / max(cpu, 1e-9), "exact_cpu_seconds": exact_cpu}
