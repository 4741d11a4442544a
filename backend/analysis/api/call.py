"""What every Python API function does: validate its arguments with the kind's params model and run the cached
analysis (`kernel.analyze`), a local file taken for a saved tensor (`load`)."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from ..kernel import analyze, local_files
from ..kinds import Kind, get_kind
from ..results import Result

OWN = ("lm", "task", "cache", "progress")
"""The API function's arguments that are not the kind's params."""


def call(kind: str, arguments: Mapping[str, Any]) -> Result:
    """Run `kind` with an API function's `arguments` (its `locals()`: lm, task, cache, progress and the params)."""
    spec = get_kind(kind)
    params = {k: v for k, v in arguments.items() if k not in OWN}
    return analyze(kind, arguments.get("lm"), arguments.get("task"), local_files(spec, params),
                   cache=arguments["cache"], progress=arguments["progress"])


def kind_function(kind: Kind) -> Callable[..., Result]:
    """The API function of a kind registered at run time (`kinds.register`: tests, plugins), which has no module
    here: `fn(lm, task=None, *, cache=True, progress=None, **params)`; its params are checked when it is called."""
    def run(lm: Any, task: Any = None, *, cache: Any = True, progress: Any = None, **params: Any) -> Result:
        if not kind.uses_task and task is not None:
            raise TypeError(f"{kind.api}() takes no task")
        return call(kind.name, {"lm": lm, "task": task, "cache": cache, "progress": progress, **params})

    fields = ", ".join(f"{n}={f.get_default(call_default_factory=True)!r}" for n, f in kind.params.model_fields.items())
    run.__name__ = run.__qualname__ = kind.api
    run.__doc__ = (f"{kind.description} (analysis kind `{kind.name}`), cached.\n\n"
                   f"Parameters (defaults): {fields or 'none'}.\nReturns `{kind.result.__name__}`.")
    return run
