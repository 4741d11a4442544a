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
    """The API function of a kind registered at run time (`kinds.register`: a plugin, a new kind not yet in the
    generated modules): the same signature and docstring the generator would write (`inspect.signature` lists the
    params model's fields), its arguments bound and checked by that signature, then by the params model."""
    from inspect import Parameter, Signature, cleandoc

    from .generate import descriptions, docstring

    pos, kw = Parameter.POSITIONAL_OR_KEYWORD, Parameter.KEYWORD_ONLY
    params = [Parameter(n, pos, annotation=t) for n, t, used in (("lm", "LoadedModel", kind.uses_model),
                                                                 ("task", "Task", kind.uses_task)) if used]
    for name, f in kind.params.model_fields.items():
        default = Parameter.empty if f.is_required() else f.get_default(call_default_factory=True)
        params.append(Parameter(name, kw, default=default, annotation=f.annotation))
    params += [Parameter("cache", kw, default=True, annotation="bool | Store | None"),
               Parameter("progress", kw, default=None, annotation="Progress | None")]
    sig = Signature(params, return_annotation=kind.result)
    positional = sum(p.kind is pos for p in params)

    def run(*args: Any, **kw_args: Any) -> Result:
        if len(args) > positional and not kind.uses_task:
            raise TypeError(f"{kind.name}() takes no task")
        bound = sig.bind(*args, **kw_args)  # a typo or a missing field: TypeError naming it
        bound.apply_defaults()
        return call(kind.name, {"lm": None, "task": None, **bound.arguments})

    run.__name__ = run.__qualname__ = kind.name
    run.__signature__ = sig  # type: ignore[attr-defined]
    run.__doc__ = cleandoc("\n".join(docstring(kind, descriptions())).strip().strip('"'))
    return run
