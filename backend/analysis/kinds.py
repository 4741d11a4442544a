"""The job-kind registry: every analysis declared once.

An entry names the kind, its params model (defaults declared once), its result model, the analysis
function (`"module:function"`, imported on first use, so this module needs no torch), a one-line
description, and the name of its Python API function. The service (`POST /jobs`, `GET /capabilities`),
the CLI subcommands, the Python API (`backend.<api>`) and the UI client are all derived from it.

Adding a kind: a params and a result model (params.py, results.py), one analysis module with
`fn(ctx: Context, p: Params) -> dict`, one entry below, one page and its tests.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel

from . import params as P
from . import results as R


@dataclass(frozen=True)
class Kind:
    """One analysis kind. `fn(ctx, params) -> dict` returns the kind's result fields (without the envelope)."""

    name: str
    params: type[P.Params]
    result: type[R.Result]
    fn: str
    description: str
    api: str
    uses_task: bool = True
    uses_model: bool = True
    cached: bool = True
    needs_fit: bool = True  # refuse (TaskError) a task whose words the model mostly cannot read, before computing

    @property
    def cli(self) -> str:
        """The CLI subcommand: the name with dashes."""
        return self.name.replace("_", "-")

    def function(self) -> Callable[..., dict[str, Any]]:
        module, _, attr = self.fn.partition(":")
        return getattr(importlib.import_module(module), attr)

    def schema(self) -> dict[str, Any]:
        """JSON schema of the params (what GET /capabilities lists; built once per model class)."""
        return json_schema(self.params)

    def result_schema(self) -> dict[str, Any]:
        """JSON schema of the result."""
        return json_schema(self.result)


@functools.cache
def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


_ENTRIES: tuple[Kind, ...] = (
    Kind("model_info", P.ModelInfoParams, R.ModelInfoResult, "backend.analysis.general.model_info:model_info",
         "load a model (it stays resident) and describe it", api="model_info", uses_task=False, cached=False),
    Kind("maps", P.MapsParams, R.MapsResult, "backend.analysis.tsla.scores:maps",
         "TR, TL, DLA-TR, DLA-TL and induction head maps with accuracies (no head selection)", api="head_maps"),
    Kind("scores", P.ScoresParams, R.ScoresResult, "backend.analysis.tsla.scores:scores",
         "TR, TL, DLA-TR, DLA-TL and induction head maps, accuracies, top heads and their overlaps",
         api="head_scores"),
    Kind("icl", P.IclParams, R.IclResult, "backend.analysis.tsla.icl:icl",
         "accuracy, label accuracy and TR ratio against the number of demonstrations", api="icl_curve"),
    Kind("ablation_curves", P.AblationCurvesParams, R.AblationCurvesResult, "backend.analysis.tsla.ablation:curves",
         "accuracy, label accuracy and TR ratio against the number of top heads ablated, per order",
         api="ablation_curves"),
    Kind("ablate", P.AblateParams, R.AblateResult, "backend.analysis.tsla.ablation:ablate",
         "ablate one head set: metrics and per-prompt predictions before and after", api="ablate"),
    Kind("vectors", P.VectorsParams, R.VectorsResult, "backend.analysis.tsla.vectors:vectors",
         "task vectors extracted from ICL prompts: TR / TL / random head sets, function vector, vanilla",
         api="build_vectors"),
    Kind("steer", P.SteerParams, R.SteerResult, "backend.analysis.tsla.steering:steer",
         "inject extracted task vectors into zero-shot prompts, at a layer or every layer", api="steer"),
    Kind("geometry", P.GeometryParams, R.GeometryResult, "backend.analysis.tsla.geometry:geometry",
         "hidden-state alignment with the label subspace, logit difference, rotation and PCA per layer",
         api="geometry"),
    Kind("perturb", P.PerturbParams, R.PerturbResult, "backend.analysis.tsla.perturbations:perturb",
         "demonstration perturbations: metrics, TR/TL map differences, effect of ablating the top heads",
         api="perturbation_report"),
    Kind("fit", P.FitParams, R.FitResult, "backend.analysis.general.fit:fit",
         "does the task fit the model: unknown tokens in inputs and labels, prompt length vs the context window",
         api="task_fit", needs_fit=False),
    Kind("head", P.HeadParams, R.HeadResult, "backend.analysis.general.head:head",
         "one head on one prompt: attention pattern, per-label DLA, TR / TL / induction ranks, effect when "
         "ablated; the model's top next tokens (and per layer)", api="head_view"),
    Kind("ltv_train", P.LtvTrainParams, R.LtvTrainResult, "backend.analysis.ltv.ltv_train:ltv_train",
         "train one learned task vector (added at a decoder layer's input) through the frozen model, saved as "
         "safetensors", api="ltv_vector"),
    Kind("ltv", P.LtvParams, R.LtvResult, "backend.analysis.ltv.ltv:ltv",
         "learned task vectors per layer against zero-shot, ICL, vanilla / function / TR / TL vectors, on top of ICL; "
         "key heads, OV reconstruction and linear propagation (rotation, stretch)", api="train_ltv"),
    Kind("ltv_tasks", P.LtvTasksParams, R.LtvTasksResult, "backend.analysis.ltv.ltv_tasks:ltv_tasks",
         "learned task vectors of several tasks at one layer: the comparison task by task, their cosine "
         "similarity, and sums of two tasks' vectors on composed tasks", api="ltv_across_tasks", uses_task=False),
    Kind("site", P.SiteParams, R.SiteResult, "backend.analysis.site.site:site",
         "soft head selection (SITE): per-head alphas trained to inject an ICL task embedding into zero-shot "
         "prompts; alpha map, baselines, top/bottom-k patching, budget curve, correlations with head maps",
         api="train_site"),
    Kind("site_transfer", P.SiteTransferParams, R.SiteTransferResult, "backend.analysis.site.site_transfer:site_transfer",
         "SITE alphas of each task applied to every task's embedding: a transfer accuracy matrix and head overlaps",
         api="site_transfer", uses_task=False),
    Kind("methods", P.MethodsParams, R.MethodsResult, "backend.analysis.methods:methods",
         "every steering method on one task side by side: extracted vectors (vanilla, FV, TR / TL heads), LTV and "
         "SITE, with accuracy, TR ratio, parameter count and training seconds", api="compare_methods"),
)

KINDS: dict[str, Kind] = {k.name: k for k in _ENTRIES}


def register(kind: Kind, replace: bool = False) -> Kind:
    """Add a kind at run time (tests, plugins); the built-in ones are the entries above."""
    if kind.name in KINDS and not replace:
        raise ValueError(f"analysis kind {kind.name!r} is already registered")
    KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    if any(k.name == name for k in _ENTRIES):
        raise ValueError(f"{name!r} is a built-in kind")
    KINDS.pop(name, None)


def get_kind(name: str) -> Kind:
    """The kind named `name`; KeyError naming the known kinds otherwise."""
    if name not in KINDS:
        raise KeyError(f"unknown analysis kind {str(name)[:60]!r}; kinds: {', '.join(KINDS)}")
    return KINDS[name]


def by_api(name: str) -> Kind | None:
    return next((k for k in KINDS.values() if k.api == name), None)
