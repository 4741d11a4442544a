"""headlens backend: which attention heads do in-context learning, and how.

    from backend import load_model, load_task, head_scores
    lm = load_model("default")
    r = head_scores(lm, load_task("syn-sentiment"), shots=8, prompts=50, seed=0)
    r.tr, r.tl  # numpy, (layers, heads)

Every analysis kind of the registry (`backend.analysis.kinds`) is a function here, named by its entry's
`api`: `fn(lm, task, *, cache=True, progress=None, **params) -> typed result` (see `analyze`).
Imports are lazy, so `import backend` pulls in no torch.
"""
from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any, Callable

_EXPORTS = {
    "load_model": "backend.models",
    "wrap": "backend.models",
    "LoadedModel": "backend.models",
    "pull_model": "backend.pull",
    "list_presets": "backend.presets",
    "load_task": "backend.tasks.registry",
    "load_task_file": "backend.tasks.files",
    "load_prompts_file": "backend.tasks.files",
    "builtin_tasks": "backend.tasks.registry",
    "Task": "backend.tasks.base",
    "analyze": "backend.analysis.kernel",
    "KINDS": "backend.analysis.kinds",
}


def _kind_function(kind: Any) -> Callable[..., Any]:
    def run(lm: Any, task: Any = None, *, cache: Any = True, progress: Any = None, **params: Any) -> Any:
        from .analysis.kernel import analyze

        if not kind.uses_task and task is not None:
            raise TypeError(f"{kind.api}() takes no task")
        return analyze(kind.name, lm, task, params, cache=cache, progress=progress)

    fields = ", ".join(f"{n}={f.get_default(call_default_factory=True)!r}" for n, f in kind.params.model_fields.items())
    run.__name__ = run.__qualname__ = kind.api
    run.__doc__ = (f"{kind.description} (analysis kind `{kind.name}`), cached.\n\n"
                   f"Parameters (defaults): {fields or 'none'}.\nReturns `{kind.result.__name__}`.")
    return run


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    if name.startswith("_") or find_spec(f"{__name__}.{name}") is not None:  # a submodule, being imported
        raise AttributeError(f"module 'backend' has no attribute {name!r}")
    from .analysis.kinds import by_api

    kind = by_api(name)
    if kind is not None:
        fn = _kind_function(kind)
        globals()[name] = fn
        return fn
    raise AttributeError(f"module 'backend' has no attribute {name!r}")


def __dir__() -> list[str]:
    from .analysis.kinds import KINDS

    return sorted({*_EXPORTS, *(k.api for k in KINDS.values())})
