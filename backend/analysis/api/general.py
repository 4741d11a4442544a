"""The Python API of the general kinds: one function per kind of the registry (analysis/kinds.py).

Written by `python -m backend.analysis.api.generate` from the kinds' params and result models; do not
edit it by hand (tests/unit/test_api.py checks that the two agree)."""
from __future__ import annotations

from typing import Literal

from ...model.loading import LoadedModel
from ...tasks.base import Task
from ..kernel import Progress, Store
from ..findings.findings import FindingsResult
from ..general.fit import FitResult
from ..general.head import HeadResult
from ..general.model_info import ModelInfoResult
from ..methods import MethodsResult
from .call import call

__all__ = ["model_info", "task_fit", "head_view", "findings_report", "compare_methods"]


def model_info(lm: LoadedModel, *, cache: bool | Store | None = True,
               progress: Progress | None = None) -> ModelInfoResult:
    """Load a model (it stays resident) and describe it (kind `model_info`, cached).

    No parameters besides the model.

    Args:
        lm: the model (`backend.load_model`).
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        ModelInfoResult
    """
    return call("model_info", locals())


def task_fit(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer", shots: int = 8,
             seed: int = 0, cache: bool | Store | None = True, progress: Progress | None = None) -> FitResult:
    """Does the task fit the model: unknown tokens in inputs and labels, prompt length vs the context window (kind
    `task_fit`, cached).

    Args:
        lm: the model (`backend.load_model`).
        task: the task (`backend.load_task`, `backend.load_task_file`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        shots: demonstrations per prompt (for the prompt length)
        seed: seed of the demonstration/query split and prompt sampling
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        FitResult: Does the task fit the model: unknown-token shares (0..1), prompt length, and a verdict with its
            reasons.
    """
    return call("task_fit", locals())


def head_view(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer", shots: int = 8,
              prompts: int = 50, seed: int = 0, batch_size: int = 16, head: tuple[int, int], prompt: int = 0,
              text: str | None = None, labels: list[str] | None = None, top_tokens: int = 10, logit_lens: bool = False,
              ranks: bool = True, layer_heads: bool = False, cache: bool | Store | None = True,
              progress: Progress | None = None) -> HeadResult:
    """One head on one prompt: attention pattern, per-label DLA, TR / TL / induction ranks, effect when ablated; the
    model's top next tokens (and per layer) (kind `head_view`, cached).

    One head on one prompt (a task prompt, or `text`): its attention pattern, its write onto each label's unembedding,
    its TR / TL / induction ranks, its effect when zero-ablated; the model's top next tokens, optionally per layer
    (logit lens).

    Args:
        lm: the model (`backend.load_model`).
        task: the task (`backend.load_task`, `backend.load_task_file`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        shots: demonstrations per prompt
        prompts: held-out queries (prompts) scored
        seed: seed of the demonstration/query split and prompt sampling
        batch_size: rows per forward pass (speed only)
        head: [layer, head]
        prompt: which of the task's prompts (0-based)
        text: your own prompt instead of a task prompt (ends right before the answer)
        labels: candidate answers as they continue the prompt (e.g. ' pos'); default: the task prompt's labels
        top_tokens
        logit_lens: top tokens after every layer (final norm + unembedding)
        ranks: the head's TR / TL ranks on the task (from the cached `scores`)
        layer_heads: also every head of the head's layer: their attention patterns (the CircuitsVis grid)
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        HeadResult
    """
    return call("head_view", locals())


def findings_report(lm: LoadedModel, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
                    tasks: list[str] | None = None,
                    sections: list[Literal["tsla", "site", "ltv"]] = ["tsla", "site", "ltv"], seeds: list[int] = [0],
                    shots: int = 8, prompts: int = 20, random_sets: int = 2, site_tasks: int = 1,
                    site_prompts: int = 20, ltv_tasks: int = 1, ltv_prompts: int = 20, ltv_perturbations: int = 64,
                    ltv_sweep: bool = False, cache: bool | Store | None = True,
                    progress: Progress | None = None) -> FindingsResult:
    """The three papers' findings on one model (TSLA, LTV, SITE), each with the paper's figure and a verdict: holds /
    partly / does not hold (kind `findings_report`, cached).

    The papers' findings on one model (sizes small enough for a CPU by default).

    Args:
        lm: the model (`backend.load_model`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        tasks: built-in task names; None = the model's first 4 built-in tasks
        sections: which papers: tsla, site, ltv
        seeds: TSLA seeds (each its own demonstration/query split)
        shots: TSLA and LTV demonstrations per prompt
        prompts: TSLA held-out queries per seed
        random_sets: random head sets per k (TSLA ablation)
        site_tasks: SITE on the first this many tasks
        site_prompts: SITE test prompts
        ltv_tasks: LTV on the first this many tasks
        ltv_prompts: LTV and its steer sweeps: held-out queries
        ltv_perturbations: linear propagation: perturbed vectors
        ltv_sweep: the LTV at L/4 and 3L/4 too, on the first task
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        FindingsResult: The report on one model: the summary (a row per finding) and the whole report as markdown.
    """
    return call("findings_report", locals())


def compare_methods(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
                    shots: int = 8, prompts: int = 50, seed: int = 0, batch_size: int = 16, top_pct: float = 3.0,
                    top_k: int | None = None, layer: int | None = None, site_m: int = 50, site_shots: int = 10,
                    site_steps: int = 400, ltv: bool = False, sweep: bool = False, cache: bool | Store | None = True,
                    progress: Progress | None = None) -> MethodsResult:
    """Every steering method on one task side by side: extracted vectors (vanilla, FV, TR / TL heads), LTV and SITE,
    with accuracy, TR ratio, parameter count and training seconds (kind `compare_methods`, cached).

    Every steering method on one task and model side by side: the extracted vectors (vanilla, function vector, TR / TL
    head sets, from `steer`), LTV (its cached result) and SITE; accuracy, TR ratio, parameter count and training
    seconds.

    Args:
        lm: the model (`backend.load_model`).
        task: the task (`backend.load_task`, `backend.load_task_file`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        shots: demonstrations per prompt
        prompts: held-out queries (prompts) scored
        seed: seed of the demonstration/query split and prompt sampling
        batch_size: rows per forward pass (speed only)
        top_pct: top-head set size in percent of all heads
        top_k: top-head set size as a count (overrides top_pct)
        layer: injection layer of the extracted vectors (a decoder layer's input); None = L/2
        site_m: SITE: few-shot prompts of the task embedding
        site_shots: SITE: demonstrations per embedding prompt
        site_steps: SITE: training steps
        ltv: train the LTV when no cached result is found (else it is left out)
        sweep: also each extracted vector's best layer over every layer (a `steer` sweep) and the LTV's (when its layer
            sweep is cached); chosen on the same prompts, so an upper bound
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        MethodsResult: every steering method on one task and model, side by side.
    """
    return call("compare_methods", locals())
