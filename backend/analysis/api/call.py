"""The Python API function of a kind, made from its registry entry: its signature (`inspect.signature`, so `help()`
and tab-completion list the params model's fields with their types and defaults), its annotations (the result
model as the return type) and a docstring from the entry's description and the fields' descriptions. A call binds
its arguments by that signature (a typo is a TypeError naming it), validates them with the params model and runs
the cached analysis (`kernel.analyze`), a local file taken for a saved tensor (`load`)."""
from __future__ import annotations

import functools
import inspect
import operator
import re
import textwrap
import types
import typing
from inspect import Parameter, Signature
from os import PathLike
from typing import Any, Callable, Mapping

from ...model.loading import LoadedModel
from ...tasks.base import Task
from ..kernel import Progress, Store, analyze, local_files
from ..kinds import Kind, builtin, get_kind
from ..results import Result

OWN = ("lm", "task", "cache", "progress")
"""The API function's arguments that are not the kind's params."""
WIDTH = 120
COMMON = {
    "lm": "the model (`backend.load_model`).",
    "task": "the task (`backend.load_task`, `backend.load_task_file`).",
    "cache": "True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute "
             "afresh and store nothing; or a store of your own (`kernel.Store`).",
    "progress": "called as `progress(fraction, message)` while the analysis runs.",
}


def call(kind: str, arguments: Mapping[str, Any]) -> Result:
    """Run `kind` with an API function's `arguments` (lm, task, cache, progress and the params)."""
    spec = get_kind(kind)
    params = {k: v for k, v in arguments.items() if k not in OWN}
    return analyze(kind, arguments.get("lm"), arguments.get("task"), local_files(spec, params),
                   cache=arguments["cache"], progress=arguments["progress"])


def plain(tp: Any) -> Any:
    """A type without its validation metadata, as `help()` shows it: `Annotated[int, Strict()] | None` -> `int | None`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return plain(args[0])
    if origin in (typing.Union, types.UnionType):
        return functools.reduce(operator.or_, map(plain, args))
    return origin[tuple(map(plain, args))] if origin in (list, tuple, dict) else tp


def parameters(kind: Kind) -> list[Parameter]:
    """lm and task (positional, where the kind uses them), the params model's fields (keyword-only: names, types,
    defaults; a saved tensor's field also takes a local file), cache and progress."""
    pos, kw = Parameter.POSITIONAL_OR_KEYWORD, Parameter.KEYWORD_ONLY
    out = [Parameter(n, pos, annotation=t) for n, t, used in (("lm", LoadedModel, kind.uses_model),
                                                              ("task", Task, kind.uses_task)) if used]
    for name, f in kind.params.model_fields.items():
        tp = plain(f.annotation) | PathLike[str] if name in kind.params.tensor_fields else plain(f.annotation)
        default = Parameter.empty if f.is_required() else f.get_default(call_default_factory=True)
        out.append(Parameter(name, kw, default=default, annotation=tp))
    return out + [Parameter("cache", kw, default=True, annotation=bool | Store | None),
                  Parameter("progress", kw, default=None, annotation=Progress | None)]


@functools.cache
def shared_descriptions() -> dict[tuple[str, Any], str]:
    """A field's description by name and type, from the first built-in params model that gives one (a field a model declares
    without one, e.g. IclCurveParams.prompts, reads the shared one)."""
    out: dict[tuple[str, Any], str] = {}
    for k in builtin():
        for name, f in k.params.model_fields.items():
            if f.description:
                out.setdefault((name, plain(f.annotation)), f.description)
    return out


def wrap(text: str, indent: str, hang: str = "") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + hang, break_long_words=False,
                         break_on_hyphens=False)


def paragraphs(doc: str | None, kind: Kind) -> list[str]:
    """A model's docstring as paragraphs on one line each, without its leading "kind `name`: "."""
    text = inspect.cleandoc(doc or "")
    for name in (kind.name, kind.key):
        text = text.removeprefix(f"kind `{name}`: ")
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def docstring(kind: Kind) -> str:
    """The entry's description, the params model's doc (unless it restates the description), every parameter's
    description, the result model's doc; laid out as a function's docstring in source (`help()` shows it)."""
    first = f"{sentence(kind.description)} (kind `{kind.name}`{', cached' * kind.cached})."
    out = wrap('"""' + first, "    ")
    said = set(re.findall(r"\w+", kind.description.lower()))
    for para in paragraphs(kind.params.__doc__, kind):
        words = re.findall(r"\w+", para.lower())
        if sum(w in said for w in words) < 0.9 * len(words):
            out += [""] + wrap(sentence(para), "    ")
    out += ["", "    Args:"]
    fields, docs = kind.params.model_fields, shared_descriptions()
    names = [n for n, used in (("lm", kind.uses_model), ("task", kind.uses_task)) if used]
    for name in [*names, *fields, "cache", "progress"]:
        f = fields.get(name)
        text = COMMON.get(name) or (f and (f.description or docs.get((name, plain(f.annotation))))) or ""
        if name in kind.params.tensor_fields:
            text += " (here also a local file, copied into the tensor store)"
        out += wrap(f"{name}: {text}".rstrip(": "), "        ", "    ")
    result_doc = next(iter(paragraphs(kind.result.__doc__, kind)), "")
    out += ["", "    Returns:"] + wrap(f"{kind.result.__name__}: {result_doc}".rstrip(": "), "        ", "    ")
    return "\n".join(out)[len('    """'):] + "\n    "


def kind_function(kind: Kind) -> Callable[..., Result]:
    """`backend.<api>(lm, task, *, <params>, cache=True, progress=None) -> <result>` for `kind`."""
    params = parameters(kind)
    sig = Signature(params, return_annotation=kind.result)
    positional = sum(p.kind is Parameter.POSITIONAL_OR_KEYWORD for p in params)

    def run(*args: Any, **kw_args: Any) -> Result:
        if len(args) > positional and not kind.uses_task:
            raise TypeError(f"{kind.api}() takes no task")
        bound = sig.bind(*args, **kw_args)  # a typo or a missing field: TypeError naming it
        bound.apply_defaults()
        return call(kind.name, {"lm": None, "task": None, **bound.arguments})

    run.__name__ = run.__qualname__ = kind.api
    run.__module__ = __name__.rpartition(".")[0]  # backend.analysis.api, where the built-in ones live
    run.__signature__ = sig  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params} | {"return": kind.result}
    run.__doc__ = docstring(kind)
    return run
