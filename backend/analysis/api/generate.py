"""Writes the Python API's modules from the registry: `python -m backend.analysis.api.generate`.

One function per built-in kind (`backend/analysis/kinds.py`), named by the kind's name, in the module of its
paper (`tsla.py`, `ltv.py`, `site.py`; `general.py` for the rest): keyword parameters with the names, types and
defaults of the kind's params model, a docstring from the entry's description, the params model's fields and the
result model's doc, and the result model as the return annotation. Run it after adding a kind or changing a
params model; tests/unit/test_api.py fails until the files are what it writes.
"""
from __future__ import annotations

import inspect
import re
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

from ..kinds import KINDS, Kind

HERE = Path(__file__).resolve().parent
GROUPS = ("general", "tsla", "ltv", "site")
WIDTH = 120
COMMON = {
    "lm": "the model (`backend.load_model`).",
    "task": "the task (`backend.load_task`, `backend.load_task_file`).",
    "cache": "True: the result cache on disk (a hit is served, a miss computed and stored); False or None: compute "
             "afresh and store nothing; or a store of your own (`kernel.Store`).",
    "progress": "called as `progress(fraction, message)` while the analysis runs.",
}


def group(kind: Kind) -> str:
    """The API module of a kind: its paper's (tsla, ltv, site), else general."""
    part = kind.module.split(".")[2]
    return part if part in GROUPS else "general"


def builtin() -> list[Kind]:
    return [k for k in KINDS.values() if k.module.startswith("backend.analysis.")]


def annotation(tp: Any) -> str:
    """A type as source text, without the validation metadata (`Annotated[int, Strict()]` -> `int`)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return annotation(args[0])
    if tp is type(None) or tp is None:
        return "None"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(annotation(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(value(a) for a in args)}]"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(annotation(a) for a in args)}]"
    return tp.__name__


def value(v: Any) -> str:
    """A default as source text (strings in double quotes)."""
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return f"[{', '.join(value(x) for x in v)}]"
    if isinstance(v, tuple):
        return f"({', '.join(value(x) for x in v)}{',' if len(v) == 1 else ''})"
    return repr(v)


def descriptions() -> dict[tuple[str, str], str]:
    """A field's description by name and type, from the first params model that gives one (a field a model declares
    without one, e.g. IclParams.prompts, reads the shared one)."""
    out: dict[tuple[str, str], str] = {}
    for k in builtin():
        for name, f in k.params.model_fields.items():
            if f.description:
                out.setdefault((name, annotation(f.annotation)), f.description)
    return out


def parameters(kind: Kind) -> list[str]:
    """The signature's parameters as source text: lm and task (positional), the params model's fields, cache and
    progress (keyword-only)."""
    out = [p for p, used in (("lm: LoadedModel", kind.uses_model), ("task: Task", kind.uses_task)) if used]
    out.append("*")
    tensors = getattr(kind.params, "tensor_fields", ())
    for name, f in kind.params.model_fields.items():
        tp = annotation(f.annotation)
        if name in tensors:  # an id, or (the Python API runs as the user) a local file
            tp = tp.replace("str", "str | PathLike[str]", 1)
        default = f.get_default(call_default_factory=True)
        out.append(f"{name}: {tp}" + ("" if f.is_required() else f" = {value(default)}"))
    return out + ["cache: bool | Store | None = True", "progress: Progress | None = None"]


def wrap(text: str, indent: str, hang: str = "") -> list[str]:
    """`text` in lines of at most WIDTH characters after `indent`, the lines after the first indented by `hang`
    more."""
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


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def signature(kind: Kind) -> list[str]:
    """`def <api>(...) -> <Result>:` as lines of at most WIDTH characters."""
    head = f"def {kind.api}("
    params = parameters(kind)
    pieces = [p + "," for p in params[:-1]] + [f"{params[-1]}) -> {kind.result.__name__}:"]
    indent = " " * len(head)
    lines, line = [], head
    for piece in pieces:
        if len(line) + len(piece) > WIDTH:
            lines.append(line.rstrip())
            line = indent
        if len(line) + len(piece) <= WIDTH:
            line += piece + " "
            continue
        for atom in re.split(r"(?<=, )", piece):  # too long for a line of its own: broken after its commas
            if len(line) + len(atom) > WIDTH:
                lines.append(line.rstrip())
                line = indent + "    "
            line += atom
        line += " "
    return lines + [line.rstrip()]


def docstring(kind: Kind, docs: dict[tuple[str, str], str]) -> list[str]:
    """The entry's description, the params model's doc, every parameter's description, the result model's doc."""
    cached = ", cached" if kind.cached else ""
    first = f"{sentence(kind.description)} (kind `{kind.name}`{cached})."
    out = wrap('"""' + first, "    ")
    said = set(words(kind.description))
    for para in paragraphs(kind.params.__doc__, kind):
        if sum(w in said for w in words(para)) < 0.9 * len(words(para)):  # not a restatement of the description
            out += [""] + wrap(sentence(para), "    ")
    out += ["", "    Args:"]
    names = [n for n, used in (("lm", kind.uses_model), ("task", kind.uses_task)) if used]
    fields = kind.params.model_fields
    for name in [*names, *fields, "cache", "progress"]:
        f = fields.get(name)
        text = COMMON.get(name) or (f and (f.description or docs.get((name, annotation(f.annotation))))) or ""
        if name in getattr(kind.params, "tensor_fields", ()):
            text += " (here also a local file, copied into the tensor store)"
        out += wrap(f"{name}: {text}".rstrip(": "), "        ", "    ")
    result_doc = next(iter(paragraphs(kind.result.__doc__, kind)), "")
    out += ["", "    Returns:"] + wrap(f"{kind.result.__name__}: {result_doc}".rstrip(": "), "        ", "    ")
    return out + ['    """']


def function(kind: Kind, docs: dict[tuple[str, str], str]) -> str:
    return "\n".join([*signature(kind), *docstring(kind, docs), f'    return call("{kind.name}", locals())'])


def module(name: str) -> str:
    """The source of API module `name`."""
    kinds = [k for k in builtin() if group(k) == name]
    docs = descriptions()
    functions = [function(k, docs) for k in kinds]
    code = "\n".join(functions)
    results: dict[str, set[str]] = {}
    for k in kinds:
        results.setdefault(k.result.__module__.replace("backend.analysis.", ".."), set()).add(k.result.__name__)
    imports = ["from __future__ import annotations", ""]
    imports += ["from os import PathLike"] * ("PathLike[" in code)
    imports += ["from typing import Literal"] * ("Literal[" in code)
    imports += [""] * (imports[-1] != "")
    imports += ["from ...model.loading import LoadedModel"] * any(k.uses_model for k in kinds)
    imports += ["from ...tasks.base import Task"] * any(k.uses_task for k in kinds)
    imports += ["from ..kernel import Progress, Store"]
    imports += [f"from {m} import {', '.join(sorted(ns))}" for m, ns in sorted(results.items())]
    imports += ["from .call import call"]
    header = [f'"""The Python API of the {name} kinds: one function per kind of the registry (analysis/kinds.py).',
              "",
              "Written by `python -m backend.analysis.api.generate` from the kinds' params and result models; do not",
              'edit it by hand (tests/unit/test_api.py checks that the two agree)."""',
              *imports, "", *wrap(f"__all__ = [{', '.join(value(k.api) for k in kinds)}]", "", "    ")]
    return "\n".join(header) + "\n" + "".join(f"\n\n{f}\n" for f in functions)


def main() -> int:
    for name in GROUPS:
        path = HERE / f"{name}.py"
        text = module(name)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
