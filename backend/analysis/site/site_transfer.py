"""Kind `site_transfer`: do tasks share heads? Task A's SITE alphas with task B's task embedding, on B's test prompts.

Each task's SITE run comes from the cached `site_alphas` kind (a full run with the same recipe when one is cached, else one
trained with the analyses off: the training is the same); its alphas and
task embedding are read back from its safetensors file. accuracy[A][B] is the first-token accuracy of B's zero-shot
test prompts with z[l, h] <- (1 - alpha_A) z + alpha_A t_B at the last token; the diagonal is SITE itself.
accuracy_top_k[A][B]: only A's top-k heads by alpha, injected outright with t_B (soft alphas transfer almost
everywhere on a small model, where every task runs through the same heads; a sparse set shows more). Also:
rank correlations and overlaps (alpha > 0.5) between the tasks' alpha maps, and whether the overlap predicts the
transfer.
"""
from __future__ import annotations

from itertools import combinations
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import Field

from ..primitives import options as o
from ...tasks.base import Task, TaskError
from ...tasks.registry import builtin_by_names, model_tasks
from ..kernel import Context, analyze, lookup
from ..params import Int
from ..primitives.cost import NONE, Shape, Sizes, Work, passes, steps
from ..primitives.stages import planned_over
from ..results import Result, TensorsInline
from .recipe import SiteRecipeParams
from ..primitives.batching import encode
from ..primitives.capture import capture_means
from ..primitives.threads import cpu_threads
from .soft_select import hard_alpha, load_site, ranked_heads, site_data
from ..primitives.configs import RowConfig, score_configs


DEFAULT_TASKS = 10  # the model's built-in tasks, when `tasks` is not given (the default model has 10)


class SiteTransferParams(SiteRecipeParams):
    """kind `site_transfer`: SITE alphas of each task applied to every task's embedding: an accuracy matrix."""

    tasks: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=64, description="built-in task names; None = the model's built-in example tasks (the "
                                         "default model: its 10 synthetic classification and generation tasks)")
    top_k: Int = Field(o.SITE_TRANSFER_TOP_K, ge=1, le=o.MAX_LIST,
                       description="also: only task A's top-k heads by alpha, injected outright (alpha = 1)")

    def work(self, shape: Shape, sizes: Sizes) -> Work:
        names = sizes.tasks or self.tasks or ()  # the tasks' names as the run resolves them, else as asked
        k, n = len(names) or DEFAULT_TASKS, sizes.n(self.prompts)
        transfers = passes("transfers", k * n, sizes.prompt(0)) + steps("transfers", k * (2 * k + 2) * n)
        one = super().work(shape, sizes)  # in the run's order: a SITE run per task, then the transfers
        runs = sum((one.named(f"SITE on {t}") for t in names), NONE) if names else one.named(f"{k} SITE runs") * k
        return runs + transfers

    def writes_tensors(self) -> bool:
        return True


class SiteTransferResult(Result, TensorsInline):
    """kind `site_transfer`: task A's alphas with task B's task embedding, on B's test prompts."""

    tasks: list[str]
    kinds: dict[str, str]
    accuracy: list[list[float]] = Field(..., description="[A][B]: first-token accuracy on B with A's alphas, B's t")
    tr_ratio: list[list[float]]
    zero_shot: list[float] = Field(..., description="per B, no injection")
    all_ones: list[float] = Field(..., description="per B, every alpha = 1 with B's t")
    top_k: int = Field(0, description="heads of the sparse transfer")
    accuracy_top_k: list[list[float]] = Field(default_factory=list, description="[A][B]: only A's top-k heads by "
                                                                                "alpha, alpha = 1, B's t, on B")
    alpha_spearman: list[list[float | None]] = Field(..., description="rank correlation of the alpha maps")
    head_jaccard: list[list[float]] = Field(..., description="overlap of the heads with alpha > 0.5")
    summary: dict[str, float | None] = Field(default_factory=dict)
    tensors: dict[str, str] = Field(..., description="task -> id of its SITE file (GET /tensors/{id})")


RECIPE = tuple(SiteRecipeParams.model_fields)  # what each task's site call takes


def resolve_tasks(lm: Any, names: list[str] | None) -> list[Task]:
    return builtin_by_names(names, "site_transfer") if names else model_tasks(lm.name)


def site_transfer(ctx: Context, p: SiteTransferParams) -> dict[str, Any]:
    with cpu_threads(ctx.lm):
        return _transfer(ctx, p)


def _transfer(ctx: Context, p: SiteTransferParams) -> dict[str, Any]:
    lm = ctx.lm
    tasks = resolve_tasks(lm, p.tasks)
    fields = {k: getattr(p, k) for k in RECIPE} | {"compare": [], "patching": [], "budget": [], "correlations": []}
    runs: dict[str, tuple[torch.Tensor, torch.Tensor, str | None]] = {}
    kept: list[Task] = []
    store = ctx.store if ctx.store is not None else False
    recipe = {k: getattr(p, k) for k in RECIPE}
    # progress by the plan's stages (`work`): a task's SITE run already cached weighs nothing
    share = planned_over(ctx, p, tasks, {f"SITE on {name}" for name in ctx.cached_on("site_alphas", tasks, recipe)})
    for t in tasks:
        stage = ctx.stage(*share[f"SITE on {t.name}"], f"SITE on {t.name}")
        try:  # a full run with these settings (the page's, or the CLI's defaults) trained the same alphas
            r = lookup("site_alphas", lm, t, recipe, cache=store, tensors=ctx.tensors) or \
                analyze("site_alphas", lm, t, fields, cache=store, progress=stage, tensors=ctx.tensors)
        except TaskError as e:
            ctx.warn(f"{t.name}: left out ({e})")
            continue
        try:
            alpha, emb, _ = load_site(ctx.tensors, r.tensor, lm)
        except ValueError:  # absent or damaged since (the cache checked it a moment ago)
            alpha = emb = None
        if alpha is None:  # the file is gone (a cleaned tensors folder): the result's alphas, t rebuilt
            data = site_data(lm, t, m=p.m, shots=p.shots, val_prompts=p.val_prompts, test_prompts=p.prompts,
                             seed=p.seed)
            alpha = torch.as_tensor(np.asarray(r.alpha), dtype=torch.float32)
            emb = capture_means(lm, encode(lm, data.embed, t.kind), "z", p.batch_size)
        runs[t.name] = (alpha.float().cpu(), emb.float(), r.tensor)
        kept.append(t)
    if len(kept) < 2:
        raise TaskError("site_transfer needs at least two tasks SITE can run on")
    names = [t.name for t in kept]
    n = len(names)
    acc = np.zeros((n, n))
    acc_k = np.zeros((n, n))
    k = min(p.top_k, lm.n_layers * lm.n_heads)
    trr = np.zeros((n, n))
    zero, ones = np.zeros(n), np.zeros(n)
    transfer = ctx.stage(*share["transfers"])
    for j, b in enumerate(kept):
        transfer(j / n, f"transfer onto {b.name}")
        data = site_data(lm, b, m=1, shots=0, val_prompts=1, test_prompts=p.prompts, seed=p.seed)
        enc = encode(lm, data.test, b.kind)
        L, H = lm.n_layers, lm.n_heads
        configs = [RowConfig(mask=1.0 - runs[a][0], scope="last") for a in names]
        configs += [RowConfig(mask=torch.zeros(L, H), scope="last"), RowConfig()]
        configs += [RowConfig(mask=1.0 - hard_alpha(lm, ranked_heads(runs[a][0].numpy())[:k]), scope="last")
                    for a in names]
        res = score_configs(lm, enc, configs, fill=runs[b.name][1], batch_size=o.CONFIG_BATCH_SIZE)
        means = res.means()
        acc[:, j] = means["accuracy"][:n]
        trr[:, j] = means["tr_ratio"][:n]
        ones[j], zero[j] = means["accuracy"][n], means["accuracy"][n + 1]
        acc_k[:, j] = means["accuracy"][n + 2:]
    alphas = {a: runs[a][0].numpy() for a in names}
    rho = [[None if a == b else _spearman(alphas[a], alphas[b]) for b in names] for a in names]
    jac = [[_jaccard(alphas[a], alphas[b]) for b in names] for a in names]
    kinds = {t.name: t.kind for t in kept}
    off = [(i, j) for i in range(n) for j in range(n) if i != j]
    same = [acc[i, j] for i, j in off if kinds[names[i]] == kinds[names[j]]]
    cross = [acc[i, j] for i, j in off if kinds[names[i]] != kinds[names[j]]]
    pairs = list(combinations(range(n), 2))
    sym_acc = [(acc[i, j] + acc[j, i]) / 2 for i, j in pairs]
    sym_jac = [jac[i][j] for i, j in pairs]
    link = _spearman(np.array(sym_jac), np.array(sym_acc)) if len(pairs) > 2 else None
    mean = lambda xs: float(np.mean(xs)) if len(xs) else None  # noqa: E731
    tops = {a: set(ranked_heads(alphas[a])[:k]) for a in names}
    jac_k = [len(tops[names[i]] & tops[names[j]]) / len(tops[names[i]] | tops[names[j]]) for i, j in pairs]
    link_k = _spearman(np.array(jac_k), np.array([(acc_k[i, j] + acc_k[j, i]) / 2 for i, j in pairs])) \
        if len(pairs) > 2 else None
    summary = {"own": mean(np.diag(acc)), "others": mean([acc[i, j] for i, j in off]),
               "own_top_k": mean(np.diag(acc_k)), "others_top_k": mean([acc_k[i, j] for i, j in off]),
               "same_kind_top_k": mean([acc_k[i, j] for i, j in off if kinds[names[i]] == kinds[names[j]]]),
               "other_kind_top_k": mean([acc_k[i, j] for i, j in off if kinds[names[i]] != kinds[names[j]]]),
               "top_k_overlap": mean(jac_k), "overlap_vs_transfer_top_k_spearman": link_k,
               "same_kind": mean(same), "other_kind": mean(cross), "zero_shot": mean(zero), "all_ones": mean(ones),
               "overlap_vs_transfer_spearman": link}
    ctx.progress(1.0, "done")
    return {"tasks": names, "kinds": kinds, "accuracy": acc.tolist(), "tr_ratio": trr.tolist(),
            "zero_shot": zero.tolist(), "all_ones": ones.tolist(), "top_k": k, "accuracy_top_k": acc_k.tolist(),
            "alpha_spearman": rho, "head_jaccard": jac,
            "summary": summary, "tensors": {a: runs[a][2] for a in names}}


def _spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """None where it is undefined (a constant input)."""
    from scipy import stats  # imported on first use (see primitives.selection.overlap)

    a, b = np.ravel(a), np.ravel(b)
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    r = stats.spearmanr(a, b).statistic
    return float(r) if r is not None and np.isfinite(r) else None


def _jaccard(a: np.ndarray, b: np.ndarray) -> float:
    sa, sb = np.ravel(a) > 0.5, np.ravel(b) > 0.5
    union = (sa | sb).sum()
    return float((sa & sb).sum() / union) if union else 1.0
