"""The Python API of the ltv kinds: one function per kind of the registry (analysis/kinds.py).

Written by `python -m backend.analysis.api.generate` from the kinds' params and result models; do not
edit it by hand (tests/unit/test_api.py checks that the two agree)."""
from __future__ import annotations

from os import PathLike
from typing import Literal

from ...model.loading import LoadedModel
from ...tasks.base import Task
from ..kernel import Progress, Store
from ..ltv.ltv import LtvResult
from ..ltv.ltv_tasks import LtvTasksResult
from ..ltv.ltv_train import LtvTrainResult
from .call import call

__all__ = ["ltv_vector", "ltv_layers", "ltv_across_tasks"]


def ltv_vector(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
               positions: list[int] = [-1], lr: float = 0.005, epochs: int = 10, patience: int = 2,
               weight_decay: float = 0.01, init_scale: float = 0.1, train_prompts: int = 100, val_prompts: int = 20,
               batch_size: int = 4, units: Literal["residual", "absolute"] = "residual", seed: int = 0,
               layer: int | list[int] | None = None, cache: bool | Store | None = True,
               progress: Progress | None = None) -> LtvTrainResult:
    """Train one learned task vector (added at a decoder layer's input) through the frozen model, saved as safetensors
    (kind `ltv_vector`, cached).

    Train one learned task vector (several layers: one theta each, trained together).

    Args:
        lm: the model (`backend.load_model`).
        task: the task (`backend.load_task`, `backend.load_task_file`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        positions: negative offsets from the last prompt token where theta is added (-1 = the last token)
        lr: AdamW learning rate (decays linearly to 0)
        epochs: most passes over the training prompts
        patience: epochs without a better held-out accuracy before stopping
        weight_decay
        init_scale: theta starts uniform in +-init_scale
        train_prompts: zero-shot training prompts per epoch (from the demonstration pool; a smaller pool is cycled
            through)
        val_prompts: held-out prompts for early stopping (at most; from the demonstration pool)
        batch_size: training batch size (part of the result)
        units: residual: theta = r * phi, r the RMS of the residual stream at the injection site, phi trained (lr and
            init_scale in units of r); absolute: theta trained as is (the reference)
        seed: seed of the split, theta's initialisation and the prompt order
        layer: decoder layer whose input theta is added to; None = L/2; a list: one theta per layer, jointly
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        LtvTrainResult: one trained LTV.
    """
    return call("ltv_vector", locals())


def ltv_layers(lm: LoadedModel, task: Task, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
               positions: list[int] = [-1], lr: float = 0.005, epochs: int = 10, patience: int = 2,
               weight_decay: float = 0.01, init_scale: float = 0.1, train_prompts: int = 100, val_prompts: int = 20,
               batch_size: int = 4, units: Literal["residual", "absolute"] = "residual", seed: int = 0,
               top_pct: float = 3.0, top_k: int | None = None, layer: int | list[int] | Literal["all"] | None = None,
               joint: bool = False, shots: int = 8, prompts: int = 50, mechanism: bool = True, key_heads: bool = True,
               ov: bool = True, propagation: bool = False, key_pct: float = 10.0, random_draws: int = 10,
               perturbations: int | None = None, load: str | PathLike[str] | None = None,
               cache: bool | Store | None = True, progress: Progress | None = None) -> LtvResult:
    """Learned task vectors per layer against zero-shot, ICL, vanilla / function / TR / TL vectors, on top of ICL; key
    heads, OV reconstruction and linear propagation (rotation, stretch) (kind `ltv_layers`, cached).

    Train LTVs and compare them, at each injection layer, with zero-shot, k-shot ICL, the vanilla task vector, the
    function vector and the TR / TL head-set vectors; LTV on top of ICL; and how it works (key heads, OV reconstruction,
    linear propagation).

    Args:
        lm: the model (`backend.load_model`).
        task: the task (`backend.load_task`, `backend.load_task_file`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        positions: negative offsets from the last prompt token where theta is added (-1 = the last token)
        lr: AdamW learning rate (decays linearly to 0)
        epochs: most passes over the training prompts
        patience: epochs without a better held-out accuracy before stopping
        weight_decay
        init_scale: theta starts uniform in +-init_scale
        train_prompts: zero-shot training prompts per epoch (from the demonstration pool; a smaller pool is cycled
            through)
        val_prompts: held-out prompts for early stopping (at most; from the demonstration pool)
        batch_size: training batch size (part of the result)
        units: residual: theta = r * phi, r the RMS of the residual stream at the injection site, phi trained (lr and
            init_scale in units of r); absolute: theta trained as is (the reference)
        seed: seed of the split, theta's initialisation and the prompt order
        top_pct: top-head set size in percent of all heads
        top_k: top-head set size as a count (overrides top_pct)
        layer: injection layer (a decoder layer's input); None = L/2; `all` or a list: one LTV per layer (the layer
            sweep), or one joint vector with `joint`
        joint: with several layers: one theta per layer trained together
        shots: demonstrations of the ICL conditions and extracted vectors
        prompts: held-out queries scored (zero-shot prompts)
        mechanism: how it works, per layer: the stages switched on below (key_heads, ov, propagation); False: none of
            them
        key_heads: mechanism: head saliency, the key heads ablated against random sets, their overlap with the head maps
        ov: mechanism: the OV reconstruction of theta, injected instead of it
        propagation: mechanism: linear propagation W = QS (rotation, stretch), fitted on `perturbations` perturbed
            vectors; the costliest stage (on SmolLM2-135M about as much as the rest of the run), so off by default
        key_pct: key heads: top percent by saliency
        random_draws: random head sets ablated for contrast
        perturbations: linear propagation: perturbed vectors (default 2 d_model, at most 1024)
        load: a saved LTV, by its id (an ltv_train result's `tensor`, or POST /tensors), to compare instead of training
            one (here also a local file, copied into the tensor store)
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        LtvResult: learned task vectors compared with zero-shot, ICL and extracted vectors, and how they work.
    """
    return call("ltv_layers", locals())


def ltv_across_tasks(lm: LoadedModel, *, prepend_bos: Literal["tokenizer", "always"] = "tokenizer",
                     positions: list[int] = [-1], lr: float = 0.005, epochs: int = 10, patience: int = 2,
                     weight_decay: float = 0.01, init_scale: float = 0.1, train_prompts: int = 100,
                     val_prompts: int = 20, batch_size: int = 4, units: Literal["residual", "absolute"] = "residual",
                     seed: int = 0, top_pct: float = 3.0, top_k: int | None = None, tasks: list[str] | None = None,
                     layer: int | None = None, shots: int = 8, prompts: int = 50, compose: bool = True,
                     cache: bool | Store | None = True, progress: Progress | None = None) -> LtvTasksResult:
    """Learned task vectors of several tasks at one layer: the comparison task by task, their cosine similarity, and
    sums of two tasks' vectors on composed tasks (kind `ltv_across_tasks`, cached).

    LTVs of several tasks at one layer: the comparison task by task (the paper's ordering), the cosine similarity of the
    vectors, and composition (the sum of two tasks' vectors on their composed task).

    Args:
        lm: the model (`backend.load_model`).
        prepend_bos: tokenizer: the tokenizer's own choice (SmolLM2's adds no BOS); always: a BOS token first in every
            prompt (TransformerLens's convention; an error for a tokenizer without one)
        positions: negative offsets from the last prompt token where theta is added (-1 = the last token)
        lr: AdamW learning rate (decays linearly to 0)
        epochs: most passes over the training prompts
        patience: epochs without a better held-out accuracy before stopping
        weight_decay
        init_scale: theta starts uniform in +-init_scale
        train_prompts: zero-shot training prompts per epoch (from the demonstration pool; a smaller pool is cycled
            through)
        val_prompts: held-out prompts for early stopping (at most; from the demonstration pool)
        batch_size: training batch size (part of the result)
        units: residual: theta = r * phi, r the RMS of the residual stream at the injection site, phi trained (lr and
            init_scale in units of r); absolute: theta trained as is (the reference)
        seed: seed of the split, theta's initialisation and the prompt order
        top_pct: top-head set size in percent of all heads
        top_k: top-head set size as a count (overrides top_pct)
        tasks: built-in task names; None = the model's built-in tasks (the default model: its 10 synthetic
            classification and generation tasks)
        layer: injection layer; None = L/2
        shots: demonstrations per prompt
        prompts: held-out queries (prompts) scored
        compose: evaluate vector sums on the composed tasks the task language defines
        cache: True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute
            afresh and store nothing; or a store of your own (`kernel.Store`).
        progress: called as `progress(fraction, message)` while the analysis runs.

    Returns:
        LtvTasksResult: LTVs of several tasks at one layer.
    """
    return call("ltv_across_tasks", locals())
