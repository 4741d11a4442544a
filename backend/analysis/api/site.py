"""The Python API of the site kinds: one function per kind of the registry (analysis/kinds.py).

Written by `python -m backend.analysis.api.generate` from the kinds' params and result models; do not
edit it by hand (tests/unit/test_api.py checks that the two agree)."""
from __future__ import annotations

from os import PathLike
from typing import Literal

from ...model.loading import LoadedModel
from ...tasks.base import Task
from ..kernel import Progress, Store
from ..site.site import SiteResult
from ..site.site_transfer import SiteTransferResult
from .call import call

__all__ = ["site_alphas", "site_transfer"]


def site_alphas(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
                shots: int = 10, prompts: int = 100, seed: int = 0, batch_size: int = 16, m: int = 50, steps: int = 400,
                lr: float = 0.2, beta2: float = 0.999, train_batch: int = 1, val_every: int = 50,
                val_prompts: int = 100, max_new_tokens: int = 20, keep_alpha: Literal["best", "last"] = "best",
                compare: list[Literal["zero_shot", "icl", "fv", "vanilla", "all_ones", "ltv"]] = ["zero_shot", "icl",
                    "fv", "vanilla", "all_ones", "ltv"], icl_shots: list[int] = [8, 10],
                patching: list[int] = [1, 2, 4, 8, 16], budget: list[int] = [1, 5, 10, 50],
                correlations: list[Literal["tr", "tl", "induction", "ltv"]] = ["tr", "tl", "induction", "ltv"],
                load: str | PathLike[str] | None = None, cache: bool | Store | None = True,
                progress: Progress | None = None) -> SiteResult:
    """Soft head selection (SITE): per-head alphas trained to inject an ICL task embedding into zero-shot prompts; alpha
    map, baselines, top/bottom-k patching, budget curve, correlations with head maps (kind `site_alphas`, cached).

    Train SITE alphas (or load saved ones) and evaluate them zero-shot with generation; compare with zero-shot, k-shot
    ICL, the function and vanilla task vectors, every alpha = 1 and LTV; patch the top / bottom k heads by alpha; the
    alpha budget curve over M; rank correlations with the TR / TL / induction maps.

    Args:
        lm: the model (`backend.load_model`).
        task: the task (`backend.load_task`, `backend.load_task_file`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        shots: demonstrations in each of those prompts (N)
        prompts: held-out test queries (zero-shot prompts)
        seed: seed of the demonstration/query split and prompt sampling
        batch_size: rows per forward pass (speed only)
        m: few-shot prompts averaged into the task embedding (M)
        steps: Adam steps on the alpha logits
        lr: Adam learning rate
        beta2: Adam's second-moment decay (the reference's 0.999; a lower one keeps the alphas moving once the loss is
            ~0)
        train_batch: zero-shot training prompts per step
        val_every: validate (and keep the best) every so many steps
        val_prompts: validation prompts (at most; held out of the training split)
        max_new_tokens: greedy generation length
        keep_alpha: best: keep the alphas of the lowest validation loss; last: those of the last validation (the
            reference implementation's behaviour)
        compare: baselines (empty: none); ltv only when its result is cached
        icl_shots: demonstrations of the ICL baselines (those that fit)
        patching: k of the top-k / bottom-k patching curves (empty: none)
        budget: M values of the budget curve, each a SITE run (empty: none)
        correlations: maps to rank-correlate alpha with (ltv: when cached)
        load: a saved SITE file (alphas and task embedding), by its id (a site result's `tensor`, or POST /tensors), to
            evaluate instead of training (here also a local file, copied into the tensor store)
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        SiteResult: soft head selection (SITE) on one task.
    """
    return call("site_alphas", locals())


def site_transfer(lm: LoadedModel, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer", shots: int = 10,
                  prompts: int = 100, seed: int = 0, batch_size: int = 16, m: int = 50, steps: int = 400,
                  lr: float = 0.2, beta2: float = 0.999, train_batch: int = 1, val_every: int = 50,
                  val_prompts: int = 100, max_new_tokens: int = 20, keep_alpha: Literal["best", "last"] = "best",
                  tasks: list[str] | None = None, top_k: int = 4, cache: bool | Store | None = True,
                  progress: Progress | None = None) -> SiteTransferResult:
    """SITE alphas of each task applied to every task's embedding: a transfer accuracy matrix and head overlaps (kind
    `site_transfer`, cached).

    Args:
        lm: the model (`backend.load_model`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        shots: demonstrations in each of those prompts (N)
        prompts: held-out test queries (zero-shot prompts)
        seed: seed of the demonstration/query split and prompt sampling
        batch_size: rows per forward pass (speed only)
        m: few-shot prompts averaged into the task embedding (M)
        steps: Adam steps on the alpha logits
        lr: Adam learning rate
        beta2: Adam's second-moment decay (the reference's 0.999; a lower one keeps the alphas moving once the loss is
            ~0)
        train_batch: zero-shot training prompts per step
        val_every: validate (and keep the best) every so many steps
        val_prompts: validation prompts (at most; held out of the training split)
        max_new_tokens: greedy generation length
        keep_alpha: best: keep the alphas of the lowest validation loss; last: those of the last validation (the
            reference implementation's behaviour)
        tasks: built-in task names; None = the model's built-in example tasks (the default model: its 10 synthetic
            classification and generation tasks)
        top_k: also: only task A's top-k heads by alpha, injected outright (alpha = 1)
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        SiteTransferResult: task A's alphas with task B's task embedding, on B's test prompts.
    """
    return call("site_transfer", locals())
