"""headlens backend: which attention heads do in-context learning, and how.

    from backend import load_model, load_task, head_scores
    lm = load_model("default")
    r = head_scores(lm, load_task("syn-sentiment"), shots=8, prompts=50, seed=0)
    r.tr, r.tl  # numpy, (layers, heads)

Every analysis kind of the registry (`backend.analysis.kinds`) is a function here, named by the kind's name (its
older names, the entry's `aliases`, answer too): `fn(lm, task, *, <the params model's fields>, cache=True,
progress=None) -> <its result model>`, built from the registry by
`backend/analysis/api/` (typed, with docstrings: `help(backend.head_scores)`); `analyze(kind, ...)` runs any kind by
name. A saved tensor (`load`) is an id, or here a local file, copied into the tensor store (`tensor_path(id)`: the
file of an id). Imports are lazy, so `import backend` pulls in no torch.
"""
from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any

_EXPORTS = {
    "load_model": "backend.model.loading",
    "wrap": "backend.model.loading",
    "LoadedModel": "backend.model.loading",
    "pull_model": "backend.weights.pull",
    "list_presets": "backend.weights.presets",
    "load_task": "backend.tasks.registry",
    "load_task_file": "backend.tasks.files",
    "load_prompts_file": "backend.tasks.files",
    "builtin_tasks": "backend.tasks.registry",
    "Task": "backend.tasks.base",
    "tensor_path": "backend.store.tensor_store",
    "KINDS": "backend.analysis.kinds",
}


def analyze(kind: str, lm: Any, task: Any = None, params: Any = None, **kw: Any) -> Any:
    """`backend.analysis.kernel.analyze`, with a local file taken for a saved tensor (`load`)."""
    from .analysis.kernel import analyze as run, local_files
    from .analysis.kinds import get_kind

    names = set(getattr(get_kind(kind).params, "tensor_fields", ()))
    given = {**(params.model_dump() if hasattr(params, "model_dump") else dict(params or {})),
             **{k: v for k, v in kw.items() if k in names}}
    return run(kind, lm, task, local_files(get_kind(kind), given), **{k: v for k, v in kw.items() if k not in names})


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    if name.startswith("_") or find_spec(f"{__name__}.{name}") is not None:  # a submodule, being imported
        raise AttributeError(f"module 'backend' has no attribute {name!r}")
    from .analysis.kinds import by_api

    kind = by_api(name)
    if kind is not None:  # a built-in kind's function (backend/analysis/api/), or a kind registered at run time's;
        from .analysis import api  # an alias (an older name) is its kind's function

        fn = globals().get(kind.name) or getattr(api, kind.name, None) or api.kind_function(kind)
        globals()[kind.name] = globals()[name] = fn
        return fn
    raise AttributeError(f"module 'backend' has no attribute {name!r}")


def __dir__() -> list[str]:
    from .analysis.kinds import KINDS

    return sorted({*_EXPORTS, "analyze", *(k.api for k in KINDS.values())})
