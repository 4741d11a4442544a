"""The CLI's flags generated from an analysis kind's params model: one `--flag` per field, parsed from text by
the field's annotation (ints, floats, heads `layer.head`, lists, literals, switches) and validated by the model."""
from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal

from .errors import UsageError
from ..text import clip


def _strip(t: Any) -> Any:
    """The type under Annotated[...]."""
    while typing.get_origin(t) is typing.Annotated:
        t = typing.get_args(t)[0]
    return t


def _members(t: Any) -> list[Any]:
    """The members of a union (X | None -> [X]), each with Annotated stripped."""
    t = _strip(t)
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return [_strip(a) for a in typing.get_args(t) if a is not type(None)]
    return [t]


def _head(text: str) -> tuple[int, int]:
    layer, _, head = text.strip().partition(".")
    if not (layer.isdigit() and head.isdigit()):
        raise ValueError(f"heads are written layer.head, comma-separated (3.5,10.2), not {clip(text, 60)!r}")
    return int(layer), int(head)


def _scalar(t: Any, text: str) -> Any:
    """Parse one value of type t (int, float, bool, str, a Literal or a (layer, head) tuple)."""
    if typing.get_origin(t) is Literal:
        if text not in typing.get_args(t):
            raise ValueError(f"{clip(text, 60)!r} is not one of {', '.join(map(str, typing.get_args(t)))}")
        return text
    if typing.get_origin(t) is tuple:
        return _head(text)
    if t is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"expected an integer, got {clip(text, 60)!r}") from None
    if t is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"expected a number, got {clip(text, 60)!r}") from None
    return text


def parse_value(annotation: Any, text: str) -> Any:
    """A flag's text as the field's type: lists are comma-separated; `int | "all"` takes either."""
    errors = []
    for t in _members(annotation):
        try:
            if typing.get_origin(t) is list:
                (item,) = typing.get_args(t)
                return [_scalar(_strip(item), x) for x in text.split(",") if x.strip()]
            return _scalar(t, text)
        except ValueError as e:
            errors.append(str(e))
    raise ValueError("; or ".join(errors))


def _is_bool(annotation: Any) -> bool:
    return _members(annotation) == [bool]


def add_params(p: argparse.ArgumentParser, model: Any) -> None:
    """One flag per field of a params model: `--field-name`; booleans are switches."""
    for name, f in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = None if f.is_required() else f.get_default(call_default_factory=True)
        doc = f"{f.description + '; ' if f.description else ''}" + ("required" if f.is_required() else
                                                                   f"default: {default}")
        if _is_bool(f.annotation):  # a switch; one that defaults to on also gets --no-<name>
            p.add_argument(flag, dest=name, default=None, help=doc,
                           action=argparse.BooleanOptionalAction if default is True else "store_true")
        else:
            p.add_argument(flag, dest=name, default=None, metavar=name.upper(), help=doc)


def read_params(model: Any, a: argparse.Namespace) -> Any:
    """The given flags, parsed and validated by the params model (UsageError naming the flag)."""
    from pydantic import ValidationError

    given = {}
    for name, f in model.model_fields.items():
        v = getattr(a, name, None)
        if v is None:
            continue
        if isinstance(v, str):
            try:
                v = parse_value(f.annotation, v)
            except ValueError as e:
                raise UsageError(f"--{name.replace('_', '-')}: {e}") from None
        given[name] = v
    for name in getattr(model, "tensor_fields", ()):  # a local file is copied into the tensor store: its id
        v = given.get(name)
        if isinstance(v, str):
            from ..store.tensor_store import is_id

            if not is_id(v):
                from ..analysis.primitives.saved import register_file

                try:
                    given[name] = register_file(v)
                except ValueError as e:
                    raise UsageError(f"--{name.replace('_', '-')}: {e}") from None
    try:
        return model.model_validate(given)
    except ValidationError as e:
        err = e.errors()[0]
        where = str(err["loc"][0]).replace("_", "-") if err["loc"] else "arguments"
        got = err.get("input")
        shown = f" (got {clip(got, 60)})" if got is not None and not isinstance(got, dict) and err["loc"] else ""
        raise UsageError(f"--{where}: {err['msg']}{shown}") from None
