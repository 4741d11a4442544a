"""The Python API of the tsla kinds: one function per kind of the registry (analysis/kinds.py).

Written by `python -m backend.analysis.api.generate` from the kinds' params and result models; do not
edit it by hand (tests/unit/test_api.py checks that the two agree)."""
from __future__ import annotations

from typing import Literal

from ...model.loading import LoadedModel
from ...tasks.base import Task
from ..kernel import Progress, Store
from ..tsla.ablation import AblateResult, AblationCurvesResult
from ..tsla.geometry import GeometryResult
from ..tsla.icl import IclResult
from ..tsla.patching import PatchingResult
from ..tsla.perturbations import PerturbResult
from ..tsla.scores import MapsResult, ScoresResult
from ..tsla.steering import SteerResult
from ..tsla.vectors import VectorsResult
from .call import call

__all__ = ["head_maps", "head_scores", "icl_curve", "ablation_curves", "ablate", "task_vectors", "steer", "geometry",
    "perturbation_report", "activation_patching"]


def head_maps(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer", shots: int = 8,
              prompts: int = 50, seed: int = 0, batch_size: int = 16, apply_ln: bool = False,
              cache: bool | Store | None = True, progress: Progress | None = None) -> MapsResult:
    """TR, TL, DLA-TR, DLA-TL and induction head maps with accuracies (no head selection) (kind `head_maps`, cached).

    Args:
        lm: the model (`backend.load_model`).
        task: the task (`backend.load_task`, `backend.load_task_file`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        shots: demonstrations per prompt
        prompts: held-out queries (prompts) scored
        seed: seed of the demonstration/query split and prompt sampling
        batch_size: rows per forward pass (speed only)
        apply_ln: scale head writes by the final norm's scale
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        MapsResult: TSLA head maps (layers, heads), means over the prompts, with the prompt-level metrics; `stats`: each
            mean map's standard error, bootstrap interval and (TR, TL) significance; `per_prompt`: the maps prompt by
            prompt (prompts, layers, heads), kept in the cache and in Python, left out of JSON replies.
    """
    return call("head_maps", locals())


def head_scores(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
                shots: int = 8, prompts: int = 50, seed: int = 0, batch_size: int = 16, apply_ln: bool = False,
                top_pct: float = 3.0, top_k: int | None = None, cache: bool | Store | None = True,
                progress: Progress | None = None) -> ScoresResult:
    """TR, TL, DLA-TR, DLA-TL and induction head maps, accuracies, top heads and their overlaps (kind `head_scores`,
    cached).

    The head maps with top heads and overlaps (a new selection size reuses the cached maps).

    Args:
        lm: the model (`backend.load_model`).
        task: the task (`backend.load_task`, `backend.load_task_file`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        shots: demonstrations per prompt
        prompts: held-out queries (prompts) scored
        seed: seed of the demonstration/query split and prompt sampling
        batch_size: rows per forward pass (speed only)
        apply_ln: scale head writes by the final norm's scale
        top_pct: top-head set size in percent of all heads
        top_k: top-head set size as a count (overrides top_pct)
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        ScoresResult: The head maps with the top heads by TR and TL, a random set of the same size, and overlaps.
    """
    return call("head_scores", locals())


def icl_curve(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
              shots: list[int] = [0, 1, 2, 4, 8], prompts: int = 100, seed: int = 0, examples: int = 3,
              batch_size: int = 16, cache: bool | Store | None = True, progress: Progress | None = None) -> IclResult:
    """Accuracy, label accuracy and TR ratio against the number of demonstrations (kind `icl_curve`, cached).

    Args:
        lm: the model (`backend.load_model`).
        task: the task (`backend.load_task`, `backend.load_task_file`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        shots
        prompts: held-out queries (prompts) scored
        seed: seed of the demonstration/query split and prompt sampling
        examples: example rows (prompt, gold, prediction) kept per k
        batch_size: rows per forward pass (speed only)
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        IclResult
    """
    return call("icl_curve", locals())


def ablation_curves(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
                    shots: int = 8, prompts: int = 50, seed: int = 0, batch_size: int = 32,
                    orders: list[Literal["tr", "tl", "induction", "random"]] = ["tr", "tl", "induction", "random"],
                    ks: list[int] = [0, 1, 2, 4, 8], mode: Literal["zero", "mean"] = "zero",
                    positions: Literal["all", "last"] = "all", random_seeds: list[int] = [0, 1, 2],
                    cache: bool | Store | None = True, progress: Progress | None = None) -> AblationCurvesResult:
    """Accuracy, label accuracy and TR ratio against the number of top heads ablated, per order (kind `ablation_curves`,
    cached).

    Args:
        lm: the model (`backend.load_model`).
        task: the task (`backend.load_task`, `backend.load_task_file`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        shots: demonstrations per prompt
        prompts: held-out queries (prompts) scored
        seed: seed of the demonstration/query split and prompt sampling
        batch_size: rows per forward pass (speed only)
        orders
        ks
        mode
        positions
        random_seeds
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        AblationCurvesResult
    """
    return call("ablation_curves", locals())


def ablate(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer", shots: int = 8,
           prompts: int = 50, seed: int = 0, batch_size: int = 32, heads: list[tuple[int, int]],
           mode: Literal["zero", "mean"] = "zero", positions: Literal["all", "last"] = "all",
           cache: bool | Store | None = True, progress: Progress | None = None) -> AblateResult:
    """Ablate one head set: metrics and per-prompt predictions before and after (kind `ablate`, cached).

    Args:
        lm: the model (`backend.load_model`).
        task: the task (`backend.load_task`, `backend.load_task_file`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        shots: demonstrations per prompt
        prompts: held-out queries (prompts) scored
        seed: seed of the demonstration/query split and prompt sampling
        batch_size: rows per forward pass (speed only)
        heads: [[layer, head], ...]
        mode
        positions
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        AblateResult
    """
    return call("ablate", locals())


def task_vectors(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
                 shots: int = 8, prompts: int = 50, seed: int = 0, batch_size: int = 16, top_pct: float = 3.0,
                 top_k: int | None = None,
                 types: list[Literal["tr", "tl", "random", "fv", "vanilla"]] = ["tr", "tl", "random", "fv", "vanilla"],
                 heads: list[tuple[int, int]] | None = None, cache: bool | Store | None = True,
                 progress: Progress | None = None) -> VectorsResult:
    """Task vectors extracted from ICL prompts: TR / TL / random head sets, function vector, vanilla (kind
    `task_vectors`, cached).

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
        types
        heads: also a vector of this head set
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        VectorsResult
    """
    return call("task_vectors", locals())


def steer(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer", shots: int = 8,
          prompts: int = 50, seed: int = 0, batch_size: int = 32, top_pct: float = 3.0, top_k: int | None = None,
          vectors: list[Literal["tr", "tl", "random", "fv", "vanilla"]] = ["tr", "tl", "random", "fv", "vanilla"],
          layer: int | Literal["all"] | None = None, alpha: float = 1.0, heads: list[tuple[int, int]] | None = None,
          cache: bool | Store | None = True, progress: Progress | None = None) -> SteerResult:
    """Inject extracted task vectors into zero-shot prompts, at a layer or every layer (kind `steer`, cached).

    Zero-shot prompts with alpha * v added at a layer (or every layer), per vector type.

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
        vectors
        layer: decoder layer whose input the vector is added to; None = L/2; `all` sweeps
        alpha
        heads: an extra user head set
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        SteerResult
    """
    return call("steer", locals())


def geometry(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer", shots: int = 8,
             prompts: int = 50, seed: int = 0, batch_size: int = 16, top_pct: float = 3.0, top_k: int | None = None,
             layer: int | None = None, alpha: float = 1.0, final_norm: bool = True, pca_layer: int | None = None,
             cache: bool | Store | None = True, progress: Progress | None = None) -> GeometryResult:
    """Hidden-state alignment with the label subspace, logit difference, rotation and PCA per layer (kind `geometry`,
    cached).

    Per-layer alignment, logit difference and rotation for five conditions, and PCA.

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
        layer: injection layer of the steered conditions (a decoder layer's input); None = L/2
        alpha
        final_norm: measure the states after the final norm (as the unembedding reads them: the logit difference is in
            logits); false: the raw residual
        pca_layer: layer of the PCA view; None = the last
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        GeometryResult
    """
    return call("geometry", locals())


def perturbation_report(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
                        shots: int = 8, prompts: int = 50, seed: int = 0, batch_size: int = 16, top_pct: float = 3.0,
                        top_k: int | None = None,
                        perturbations: list[Literal["shuffled_inputs", "random_labels", "flipped_labels",
                            "symbol_labels", "number_labels"]] = ["shuffled_inputs", "random_labels", "flipped_labels",
                            "symbol_labels", "number_labels"], cache: bool | Store | None = True,
                        progress: Progress | None = None) -> PerturbResult:
    """Demonstration perturbations: metrics, TR/TL map differences, effect of ablating the top heads (kind
    `perturbation_report`, cached).

    ICL metrics, TR/TL maps and ablation effects under demonstration perturbations.

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
        perturbations
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        PerturbResult
    """
    return call("perturbation_report", locals())


def activation_patching(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
                        shots: int = 8, prompts: int = 50, seed: int = 0, batch_size: int = 32, top_pct: float = 3.0,
                        top_k: int | None = None,
                        target: Literal["zero_shot", "shuffled_inputs", "random_labels",
                            "flipped_labels"] = "zero_shot", patch: Literal["paired", "mean"] = "paired",
                        cache: bool | Store | None = True, progress: Progress | None = None) -> PatchingResult:
    """Activation patching: every head's last-token z from clean ICL prompts into zero-shot or perturbed ones; the share
    of the gold logit recovered per head, beside the TR / TL maps (kind `activation_patching`, cached).

    Every head's last-token z patched from the clean ICL prompts into a corrupted set.

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
        target: the prompt set patched into: zero-shot prompts, or the k-shot prompts with perturbed demonstrations
        patch: paired: clean prompt i's own z into target i; mean: the clean prompts' mean z into every one
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        PatchingResult: Per-head patching maps (layers, heads) with the clean and target runs they start from.
    """
    return call("activation_patching", locals())
