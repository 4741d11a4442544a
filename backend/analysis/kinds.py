"""The job-kind registry: every analysis declared once.

An entry names the kind and the module that holds it (`Kind.at`), a one-line description and the name of its
Python API function. The module holds, side by side, the kind's params model `<Name>Params` (defaults declared
once), its result model `<Name>Result` and its function `<name>(ctx: Context, p) -> dict` (`fn=` names another);
they are imported on first use, so this module needs no torch and sits below every kind module (which may read
another kind's params through `get_kind`). The service (`POST /jobs`, `GET /capabilities`), the CLI subcommands,
the Python API (`backend.<api>`) and the UI client are all derived from it.

Adding a kind: one module (params, result, function), one entry below, one page and its tests.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel

if TYPE_CHECKING:
    from .params import Params
    from .results import Result


@dataclass(frozen=True)
class Kind:
    """One analysis kind. `fn(ctx, params) -> dict` returns the kind's result fields (without the envelope).

    `params_model` and `result_model` are the models, or where they live (`"module:Name"`, imported on first use);
    `params` and `result` are the models themselves."""

    name: str
    params_model: "type[Params] | str"
    result_model: "type[Result] | str"
    fn: str
    description: str
    api: str
    uses_task: bool = True
    uses_model: bool = True
    cached: bool = True
    needs_fit: bool = True  # refuse (TaskError) a task whose words the model mostly cannot read, before computing
    version: int = 0
    """Bumped when a change alters what this kind computes, so its older cached results are not served (part of
    the cache key when > 0; 0 leaves the key as before). 1 for steer, vectors, geometry, site and methods: every
    vector "at layer l" is added at the INPUT of decoder layer l (they added it at the output before). 1 for
    ablation_curves, perturb, ltv and findings: their random head sets are drawn from the heads outside the top
    sets they are compared with (`selection.random_heads`; they could hold top heads before). 1 for head: a
    typed prompt the tokenizer reads as unknown tokens is warned about. One more (icl, ablation_curves, ablate,
    steer, geometry, patching, ltv, site, methods) when their results gained intervals and paired tests (issue 27):
    a cached result without them is recomputed, so every page shows them. Kinds whose only rates are `Metrics`
    (scores, maps, perturb, ltv_tasks) keep their key: `Metrics` fills its intervals from the rate and n when read
    back. `maps` and `scores` keep their key too: their results gained required fields (each map's `stats`, the
    top-k `stability`), so one cached before them does not fit the result model and is recomputed on read. One more
    for ltv (issue 25): its linear propagation became opt-in (`propagation`, off by default).
    3 for ablation_curves: its curves keep every prompt's outcome per set and k (the findings' tests pool them over
    seeds); 2 for findings: its verdicts rest on per-task tests."""
    indexed: bool = False  # list its cached results per model and task, so `Context.cached` finds them by any field

    @classmethod
    def at(cls, module: str, name: str, description: str, *, api: str, fn: str | None = None, **flags: Any) -> "Kind":
        """The kind `name` of `backend.analysis.<module>`: its `<Name>Params`, `<Name>Result` and function `fn`
        (default: `name`), e.g. `Kind.at("tsla.scores", "maps", ...)` -> MapsParams, MapsResult, maps."""
        where = f"backend.analysis.{module}:"
        camel = "".join(w.capitalize() for w in name.split("_"))
        return cls(name, where + camel + "Params", where + camel + "Result", where + (fn or name), description, api,
                   **flags)

    @property
    def module(self) -> str:
        """The module that holds the kind's function."""
        return self.fn.partition(":")[0]

    @property
    def params(self) -> "type[Params]":
        return _resolve(self.params_model)

    @property
    def result(self) -> "type[Result]":
        return _resolve(self.result_model)

    @property
    def cli(self) -> str:
        """The CLI subcommand: the name with dashes."""
        return self.name.replace("_", "-")

    def function(self) -> Callable[..., dict[str, Any]]:
        return _resolve(self.fn)

    def schema(self) -> dict[str, Any]:
        """JSON schema of the params (what GET /capabilities lists; built once per model class)."""
        return json_schema(self.params)

    def result_schema(self) -> dict[str, Any]:
        """JSON schema of the result."""
        return json_schema(self.result)


def _resolve(ref: Any) -> Any:
    """`"module:attribute"` -> that attribute (the module imported on first use); anything else as it is."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@functools.cache
def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


_ENTRIES: tuple[Kind, ...] = (
    Kind.at("general.model_info", "model_info", "load a model (it stays resident) and describe it",
            api="model_info", uses_task=False, cached=False),
    Kind.at("tsla.scores", "maps",
            "TR, TL, DLA-TR, DLA-TL and induction head maps with accuracies (no head selection)", api="head_maps"),
    Kind.at("tsla.scores", "scores",
            "TR, TL, DLA-TR, DLA-TL and induction head maps, accuracies, top heads and their overlaps",
            api="head_scores"),
    Kind.at("tsla.icl", "icl",
            "accuracy, label accuracy and TR ratio against the number of demonstrations", api="icl_curve", version=1),
    Kind.at("tsla.ablation", "ablation_curves",
            "accuracy, label accuracy and TR ratio against the number of top heads ablated, per order",
            api="ablation_curves", fn="curves", version=3),
    Kind.at("tsla.ablation", "ablate",
            "ablate one head set: metrics and per-prompt predictions before and after", api="ablate", version=1),
    Kind.at("tsla.vectors", "vectors",
            "task vectors extracted from ICL prompts: TR / TL / random head sets, function vector, vanilla",
            api="build_vectors", version=1),
    Kind.at("tsla.steering", "steer",
            "inject extracted task vectors into zero-shot prompts, at a layer or every layer", api="steer", version=2),
    Kind.at("tsla.geometry", "geometry",
            "hidden-state alignment with the label subspace, logit difference, rotation and PCA per layer",
            api="geometry", version=2),
    Kind.at("tsla.perturbations", "perturb",
            "demonstration perturbations: metrics, TR/TL map differences, effect of ablating the top heads",
            api="perturbation_report", version=1),
    Kind.at("tsla.patching", "patching",
            "activation patching: every head's last-token z from clean ICL prompts into zero-shot or perturbed ones; "
            "the share of the gold logit recovered per head, beside the TR / TL maps", api="activation_patching",
            version=1),
    Kind.at("general.fit", "fit",
            "does the task fit the model: unknown tokens in inputs and labels, prompt length vs the context window",
            api="task_fit", needs_fit=False),
    Kind.at("general.head", "head",
            "one head on one prompt: attention pattern, per-label DLA, TR / TL / induction ranks, effect when "
            "ablated; the model's top next tokens (and per layer)", api="head_view", version=1),
    Kind.at("ltv.ltv_train", "ltv_train",
            "train one learned task vector (added at a decoder layer's input) through the frozen model, saved as "
            "safetensors", api="ltv_vector"),
    Kind.at("ltv.ltv", "ltv",
            "learned task vectors per layer against zero-shot, ICL, vanilla / function / TR / TL vectors, on top of "
            "ICL; key heads, OV reconstruction and linear propagation (rotation, stretch)", api="train_ltv",
            indexed=True, version=3),
    Kind.at("ltv.ltv_tasks", "ltv_tasks",
            "learned task vectors of several tasks at one layer: the comparison task by task, their cosine "
            "similarity, and sums of two tasks' vectors on composed tasks", api="ltv_across_tasks", uses_task=False),
    Kind.at("site.site", "site",
            "soft head selection (SITE): per-head alphas trained to inject an ICL task embedding into zero-shot "
            "prompts; alpha map, baselines, top/bottom-k patching, budget curve, correlations with head maps",
            api="train_site", version=2),
    Kind.at("site.site_transfer", "site_transfer",
            "SITE alphas of each task applied to every task's embedding: a transfer accuracy matrix and head overlaps",
            api="site_transfer", uses_task=False),
    Kind.at("findings.findings", "findings",
            "the three papers' findings on one model (TSLA, LTV, SITE), each with the paper's figure and a verdict: "
            "holds / partly / does not hold", api="findings_report", uses_task=False, version=2),
    Kind.at("methods", "methods",
            "every steering method on one task side by side: extracted vectors (vanilla, FV, TR / TL heads), LTV "
            "and SITE, with accuracy, TR ratio, parameter count and training seconds", api="compare_methods",
            version=2),
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
