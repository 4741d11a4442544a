"""The job-kind registry: every analysis declared once, under one name.

An entry names the kind, the module that holds it (`Kind.at`), a one-line description, the old names it still answers to
(`aliases`) and a small request (`example`, what the per-kind tests run). The module holds, side by side, the kind's
params model `<Name>Params` (defaults declared once), its result model `<Name>Result` and its function `<name>(ctx:
Context, p) -> dict`, all named by the kind's name (`head_scores`: tsla/head_scores.py, HeadScoresParams,
HeadScoresResult, head_scores). A kind renamed since its results were first cached is filed under its old name
(`key`), from the one table `STORED_NAMES`. They are imported on first use, so this module needs no torch and sits
below every kind module (which may read another kind's params through `get_kind`).

The name is the kind's one name everywhere: the `kind` of `POST /jobs`, the CLI subcommand (with dashes), the Python
API function (`backend.<name>`, built from the entry by `backend/analysis/api/`) and the pages' calls. An alias is
accepted wherever the name is, resolved here once (`get_kind`, or `KINDS[alias]`); `GET /capabilities` lists them.

Adding a kind: one module (params, result, function), one entry below (with its `example`), one page section
(docs/architecture.md, "Adding a kind"); the tests take the new kind from here.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

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
    api: str = ""
    """The Python API function: the name itself (`backend.<name>`). Given as something else (an older registration),
    that becomes an alias."""
    aliases: tuple[str, ...] = ()
    """Older names of the kind, accepted wherever the name is (HTTP `kind`, CLI subcommand, `backend.<alias>`, the
    UI client): the kind's name before the names were unified, and its Python function's name then."""
    key: str = ""
    """The name its cache entries and index are filed under, and its saved tensors' `kind`: the kind's name before
    it was renamed, so a renamed kind keeps its cached results (default: `name`)."""
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
    example: dict[str, Any] | None = field(default=None, compare=False)
    """A small request of the kind: its params, and `task` for a kind that reads one (the body of `POST /jobs`
    without kind and model). The per-kind tests run it on the default model (tests/kind_cases.py: the cost model,
    the cost plan, bench/bit_identical.py), so keep it small, with each list long enough to reach its plan's largest
    stage. Required of a built-in kind."""

    def __post_init__(self) -> None:
        if self.api and self.api != self.name and self.api not in self.aliases:
            object.__setattr__(self, "aliases", (*self.aliases, self.api))
        object.__setattr__(self, "api", self.name)
        object.__setattr__(self, "key", self.key or self.name)

    @classmethod
    def at(cls, module: str, name: str, *, description: str, **flags: Any) -> "Kind":
        """The kind `name` of `backend.analysis.<module>`: its `<Name>Params`, `<Name>Result` and function `<name>`,
        e.g. `Kind.at("tsla.head_scores", "head_scores", ...)` -> HeadScoresParams, HeadScoresResult, head_scores;
        its results are filed under `STORED_NAMES.get(name, name)`."""
        where = f"backend.analysis.{module}:"
        camel = "".join(w.capitalize() for w in name.split("_"))
        return cls(name, where + camel + "Params", where + camel + "Result", where + name, description,
                   key=STORED_NAMES.get(name, name), **flags)

    @property
    def names(self) -> tuple[str, ...]:
        """The name, then the aliases."""
        return (self.name, *self.aliases)

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

    @property
    def cli_aliases(self) -> tuple[str, ...]:
        """The aliases as CLI subcommands (with dashes)."""
        return tuple(a.replace("_", "-") for a in self.aliases)

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
    """The model's JSON schema, with the default of each field that has a default factory (pydantic leaves it out),
    so a client reads every default from the schema."""
    schema = model.model_json_schema()
    props = schema.get("properties", {})
    for name, f in model.model_fields.items():
        key = f.alias or name
        if f.default_factory is not None and not f.default_factory_takes_validated_data and key in props:
            props[key].setdefault("default", to_jsonable_python(f.default_factory()))  # type: ignore[call-arg]
    return schema


STORED_NAMES: dict[str, str] = {
    "head_maps": "maps", "head_scores": "scores", "icl_curve": "icl", "task_vectors": "vectors",
    "perturbation_report": "perturb", "activation_patching": "patching", "task_fit": "fit", "head_view": "head",
    "ltv_vector": "ltv_train", "ltv_layers": "ltv", "ltv_across_tasks": "ltv_tasks", "site_alphas": "site",
    "findings_report": "findings", "compare_methods": "methods",
}
"""The one table of old names: a kind renamed when the names were unified (issue 26) -> the name its cached results,
index and saved tensors are filed under (its `key`), so none is lost. Each old name is also an alias of its kind."""

_SMALL = {"prompts": 6, "shots": 2}
_LTV = {"epochs": 2, "patience": 2, "train_prompts": 8, "val_prompts": 4, "batch_size": 4}
_SITE = {"m": 4, "shots": 2, "steps": 6, "val_every": 3, "val_prompts": 4, "prompts": 6, "max_new_tokens": 4}
_ENTRIES: tuple[Kind, ...] = (
    Kind.at("general.model_info", "model_info", uses_task=False,
            description="load a model (it stays resident) and describe it",
            example={}),
    Kind.at("tsla.head_scores", "head_maps", aliases=("maps",), version=1,
            description="TR, TL, DLA-TR, DLA-TL and induction head maps with accuracies (no head selection)",
            example={"task": "syn-sentiment", **_SMALL}),
    Kind.at("tsla.head_scores", "head_scores", aliases=("scores",), version=1,
            description="TR, TL, DLA-TR, DLA-TL and induction head maps, accuracies, top heads and their overlaps",
            example={"task": "syn-sentiment", **_SMALL}),
    Kind.at("tsla.icl_curve", "icl_curve", aliases=("icl",), version=1,
            description="accuracy, label accuracy and TR ratio against the number of demonstrations",
            example={"task": "syn-sentiment", "prompts": 6, "shots": [0, 2, 4]}),
    Kind.at("tsla.ablation", "ablation_curves", version=3,
            description="accuracy, label accuracy and TR ratio against the number of top heads ablated, per order",
            example={"task": "syn-sentiment", **_SMALL, "ks": [0, 2, 4], "random_seeds": [0, 1]}),
    Kind.at("tsla.ablation", "ablate", version=1,
            description="ablate one head set: metrics and per-prompt predictions before and after",
            example={"task": "syn-sentiment", **_SMALL, "heads": [[1, 2], [3, 0]], "mode": "mean"}),
    Kind.at("tsla.task_vectors", "task_vectors", aliases=("vectors", "build_vectors"), version=1,
            description="task vectors extracted from ICL prompts: TR / TL / random head sets, function vector, "
                        "vanilla",
            example={"task": "syn-antonym", **_SMALL}),
    Kind.at("tsla.steering", "steer", version=2,
            description="inject extracted task vectors into zero-shot prompts, at a layer or every layer",
            example={"task": "syn-antonym", **_SMALL, "layer": "all"}),
    Kind.at("tsla.geometry", "geometry", version=2,
            description="hidden-state alignment with the label subspace, logit difference, rotation and PCA per "
                        "layer",
            example={"task": "syn-antonym", **_SMALL}),
    Kind.at("tsla.perturbation_report", "perturbation_report", aliases=("perturb",), version=1,
            description="demonstration perturbations: metrics, TR/TL map differences, effect of ablating the top "
                        "heads",
            example={"task": "syn-sentiment", **_SMALL, "perturbations": ["shuffled_inputs", "random_labels"]}),
    Kind.at("tsla.activation_patching", "activation_patching", aliases=("patching",), version=1,
            description="activation patching: every head's last-token z from clean ICL prompts into zero-shot or "
                        "perturbed ones; the share of the gold logit recovered per head, beside the TR / TL maps",
            example={"task": "syn-sentiment", **_SMALL}),
    Kind.at("tsla.attribution_patching", "attribution_patching",
            description="attribution patching (AtP): every head's last-token z patch estimated to first order from "
                        "one backward pass, beside the exact activation_patching map (Spearman, top-k recall, heads "
                        "missed, cost ratio)",
            example={"task": "syn-sentiment", **_SMALL}),
    Kind.at("general.site_patching", "site_patching",
            description="exact activation patching at any site (resid_pre, attn_out, mlp_out, z) and position (by "
                        "role: labels, separators, query, last token; or by offset), clean ICL prompts into "
                        "corrupted ones: a layer x position map and a layer x head map, with standard errors",
            example={"task": "syn-sentiment", **_SMALL, "view": "both"}),
    Kind.at("general.path_patching", "path_patching",
            description="path patching (Wang et al.): one sender head's exact paths, clean ICL prompts into "
                        "corrupted ones, into later heads' queries, keys and values, the MLPs and the logits (the "
                        "heads it feeds: a layer x head map per channel, or a given receiver set), with intervals",
            example={"task": "syn-sentiment", **_SMALL, "sender": [1, 2]}),
    Kind.at("general.task_fit", "task_fit", aliases=("fit",), needs_fit=False,
            description="does the task fit the model: unknown tokens in inputs and labels, prompt length vs the "
                        "context window",
            example={"task": "syn-sentiment"}),
    Kind.at("general.head_view", "head_view", aliases=("head",), version=1,
            description="one head on one prompt: attention pattern, per-label DLA, TR / TL / induction ranks, effect "
                        "when ablated; the model's top next tokens (and per layer)",
            example={"task": "syn-sentiment", **_SMALL, "head": [1, 2]}),
    Kind.at("general.composition", "composition",
            description="Q-, K- and V-composition scores between heads from the weights (into the top TR / TL / "
                        "induction heads, or given ones), and one head's OV circuit on the task's labels",
            example={"task": "syn-sentiment", **_SMALL, "top_k": 2}),
    Kind.at("ltv.ltv_vector", "ltv_vector", aliases=("ltv_train",),
            description="train one learned task vector (added at a decoder layer's input) through the frozen model, "
                        "saved as safetensors",
            example={"task": "syn-antonym", **_LTV}),
    Kind.at("ltv.ltv_layers", "ltv_layers", aliases=("ltv", "train_ltv"), indexed=True, version=3,
            description="learned task vectors per layer against zero-shot, ICL, vanilla / function / TR / TL "
                        "vectors, on top of ICL; key heads, OV reconstruction and linear propagation (rotation, "
                        "stretch)",
            example={"task": "syn-antonym", **_LTV, **_SMALL, "perturbations": 16, "random_draws": 2,
                     "propagation": True}),
    Kind.at("ltv.ltv_across_tasks", "ltv_across_tasks", aliases=("ltv_tasks",), uses_task=False,
            description="learned task vectors of several tasks at one layer: the comparison task by task, their "
                        "cosine similarity, and sums of two tasks' vectors on composed tasks",
            example={**_LTV, **_SMALL, "tasks": ["syn-antonym", "syn-successor"]}),
    Kind.at("site.site_alphas", "site_alphas", aliases=("site", "train_site"), version=2,
            description="soft head selection (SITE): per-head alphas trained to inject an ICL task embedding into "
                        "zero-shot prompts; alpha map, baselines, top/bottom-k patching, budget curve, correlations "
                        "with head maps",
            example={"task": "syn-antonym", **_SITE, "budget": [2], "patching": [1, 4], "icl_shots": [2]}),
    Kind.at("site.site_transfer", "site_transfer", uses_task=False,
            description="SITE alphas of each task applied to every task's embedding: a transfer accuracy matrix and "
                        "head overlaps",
            example={**_SITE, "tasks": ["syn-antonym", "syn-successor"]}),
    Kind.at("findings.findings_report", "findings_report", aliases=("findings",), uses_task=False,
            version=2,
            description="the three papers' findings on one model (TSLA, LTV, SITE), each with the paper's figure and a "
                        "verdict: holds / partly / does not hold",
            example={"tasks": ["syn-sentiment"], "sections": ["tsla"], "prompts": 4, "shots": 2, "random_sets": 1}),
    Kind.at("compare_methods", "compare_methods", aliases=("methods",), version=2,
            description="every steering method on one task side by side: extracted vectors (vanilla, FV, TR / TL "
                        "heads), LTV and SITE, with accuracy, TR ratio, parameter count and training seconds",
            example={"task": "syn-antonym", **_SMALL, "site_m": 4, "site_shots": 2, "site_steps": 6}),
)
"""The built-in kinds. Renamed ones (issue 26: one name per analysis, the Python function's where it was clear) keep
their old kind name as `key` and answer to it and to their old Python function's name."""


class Registry(dict[str, Kind]):
    """The kinds by name; a lookup (`[]`, `in`, `get`) also takes an alias, iteration yields the names only."""

    def __init__(self, kinds: Iterable[Kind]) -> None:
        super().__init__()
        self.aliases: dict[str, str] = {}
        for k in kinds:
            self.add(k)

    def resolve(self, name: object) -> str | None:
        """The kind's name for a name or an alias; None when neither."""
        if not isinstance(name, str):
            return None
        return name if dict.__contains__(self, name) else self.aliases.get(name)

    def add(self, kind: Kind, replace: bool = False) -> None:
        for n in kind.names:
            owner = self.resolve(n)
            if owner is not None and (owner != kind.name or not replace):
                raise ValueError(f"analysis kind {n!r} is already registered" + (f" (as {owner!r})" * (owner != n)))
        self.drop(kind.name)
        dict.__setitem__(self, kind.name, kind)
        self.aliases.update({a: kind.name for a in kind.aliases})

    def drop(self, name: str) -> None:
        kind = dict.pop(self, name, None)
        for a in kind.aliases if kind is not None else ():
            self.aliases.pop(a, None)

    def __missing__(self, name: str) -> Kind:
        full = self.resolve(name)
        if full is None:
            raise KeyError(name)
        return dict.__getitem__(self, full)

    def __contains__(self, name: object) -> bool:
        return self.resolve(name) is not None

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return self[name] if name in self else default


KINDS = Registry(_ENTRIES)
"""Every kind by its name (a lookup takes an alias too)."""


def register(kind: Kind, replace: bool = False) -> Kind:
    """Add a kind at run time (tests, plugins); the built-in ones are the entries above. Its name and aliases must
    be new (`replace`: or its own)."""
    if any(k.name == kind.name for k in _ENTRIES):
        raise ValueError(f"{kind.name!r} is a built-in kind")
    KINDS.add(kind, replace=replace)
    return kind


def unregister(name: str) -> None:
    if any(name in k.names for k in _ENTRIES):
        raise ValueError(f"{name!r} is a built-in kind")
    full = KINDS.resolve(name)
    if full is not None:
        KINDS.drop(full)


def builtin() -> tuple[Kind, ...]:
    """The product's kinds (the entries above), without those registered at run time."""
    return _ENTRIES


def get_kind(name: str) -> Kind:
    """The kind named `name`, or that has `name` among its aliases; KeyError naming the known kinds otherwise."""
    if name not in KINDS:
        raise KeyError(f"unknown analysis kind {str(name)[:60]!r}; kinds: {', '.join(KINDS)}")
    return KINDS[name]


def stored_name(name: str) -> str:
    """The name a kind's stored records keep (its cache key's `key`, whatever name a caller uses: a recorded miss
    in a cached result stays the same); an unknown name as it is."""
    return KINDS[name].key if name in KINDS else name


def by_api(name: str) -> Kind | None:
    """The kind whose Python function is `backend.<name>` (its name or an alias), or None."""
    return KINDS.get(name)


def aliases() -> dict[str, str]:
    """Every alias -> its kind's name."""
    return dict(KINDS.aliases)
