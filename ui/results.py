"""Results as the pages read them: the service's JSON checked once, where it enters the session (`jobs`), against
the kind's result schema (`GET /capabilities`: the kind's result model's JSON schema), and read by attribute.

`typed(kind, data)` checks that every field the result model requires is there, fills each optional field the
service left out with the model's default (an older cached result), at every nested model, and returns a
`Record`: a dict (figures, exports and the session's memory take it as before) whose declared fields read as
attributes (`curves.random.seeds`). So a page never restates a backend default (`.get("seeds", [0, 1, 2])`): a
field is there, or the result was refused here with a message naming it. Torch-free: the schema is the service's.
"""
from __future__ import annotations

from typing import Any

from . import settings


class ResultError(ValueError):
    """A result that does not fit its kind's result schema (a service of another version)."""


class Record(dict):
    """A result (or a model inside one): a dict whose keys read as attributes too."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"the result has no field {name!r}; its fields: {', '.join(self)}") from None

    def __reduce__(self) -> Any:  # pickled (Streamlit's session copies) as a Record
        return (Record, (dict(self),))


def _fit(value: Any, schema: dict[str, Any], root: dict[str, Any], where: str) -> Any:
    """`value` with its nested models' defaults filled and their dicts made Records; ResultError on a missing
    required field. `root`: the result schema (its `$defs`)."""
    if value is None:
        return None
    schema = settings.plain(schema, root)
    if "anyOf" in schema:  # a choice: the first branch that fits
        errors = []
        for branch in schema["anyOf"]:
            try:
                return _fit(value, branch, root, where)
            except ResultError as e:
                errors.append(e)
        raise errors[0]
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is not None:
            missing = [k for k in schema.get("required", []) if k not in value]
            if missing:
                raise ResultError(f"{where} lacks {', '.join(f'`{k}`' for k in missing)}")
            out = Record(value)
            for k, p in props.items():
                if k not in out and "default" in p:
                    out[k] = _copy(p["default"])
                if k in out:
                    out[k] = _fit(out[k], p, root, f"{where}.{k}")
            return out
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            return Record({k: _fit(v, extra, root, f"{where}[{k!r}]") for k, v in value.items()})
        return Record(value)
    if isinstance(value, list) and isinstance(schema.get("items"), dict) and _models_inside(schema["items"], root):
        return [_fit(v, schema["items"], root, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _models_inside(schema: dict[str, Any], root: dict[str, Any]) -> bool:
    """Whether values of `schema` may hold models (only those are walked: a grid of floats is left as it is)."""
    schema = settings.plain(schema, root)
    if "properties" in schema or isinstance(schema.get("additionalProperties"), dict):
        return True
    return any(_models_inside(b, root) for b in schema.get("anyOf", [])) or (
        isinstance(schema.get("items"), dict) and _models_inside(schema["items"], root))


def _copy(v: Any) -> Any:
    return [_copy(x) for x in v] if isinstance(v, list) else dict(v) if isinstance(v, dict) else v


def typed(kind: str, data: dict[str, Any]) -> Record:
    """`data`, a `kind` result from the service, checked against the kind's result schema and read by attribute;
    unchecked (a Record all the same) when the service stated no schema for it. ResultError names a missing
    field."""
    schema = settings.result_schema(kind)
    if not schema:
        return Record(data)
    return _fit(data, schema, schema, kind)
