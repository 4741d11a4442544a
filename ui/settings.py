"""The pages' settings that are a kind's parameters: their defaults, bounds, options and help, read from the kind's
params JSON schema, never restated in the UI.

The UI's one reader of the kinds as the service states them (`GET /capabilities` lists each kind's name, aliases,
`params` and `result` schemas; `layout.page_setup` hands them over with `load` before anything reads a setting):
a kind's one name (`kind_name`), its params schema here, its result schema for `ui.results`, each field read by
`plain`. So the UI imports nothing of the backend's registry. Outside a page (a test, a script) `FALLBACK` may name
where else to read a kind's entry (tests/conftest.py: the registry's own, the same schemas).

`WIDGETS` names every page setting bound to a kind field; `UI_RANGES` states, once, where a widget deliberately
offers less than the kind accepts; `UI_DEFAULTS` where a page starts elsewhere than the kind's default. The URL's
checks (`ui.state`) and the widgets both read `spec(name)`, so a link and the sidebar agree.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

WIDGETS: dict[str, tuple[str, str]] = {
    # state field -> (kind, its params field)
    "shots": ("head_scores", "shots"), "prompts": ("head_scores", "prompts"), "seed": ("head_scores", "seed"),
    "top_pct": ("head_scores", "top_pct"), "top_k": ("head_scores", "top_k"), "prepend_bos": ("head_scores", "prepend_bos"),
    "mode": ("ablate", "mode"), "ab_positions": ("ablate", "positions"),
    "pt_target": ("activation_patching", "target"), "pt_patch": ("activation_patching", "patch"),
    "sg_vectors": ("steer", "vectors"), "sg_alpha": ("steer", "alpha"), "sg_final_norm": ("geometry", "final_norm"),
    "sg_perturbations": ("perturbation_report", "perturbations"),
    "ltv_positions": ("ltv_layers", "positions"), "ltv_lr": ("ltv_layers", "lr"), "ltv_epochs": ("ltv_layers", "epochs"),
    "ltv_batch": ("ltv_layers", "batch_size"), "ltv_units": ("ltv_layers", "units"),
    "site_m": ("site_alphas", "m"), "site_shots": ("site_alphas", "shots"), "site_steps": ("site_alphas", "steps"),
}
UI_RANGES: dict[str, tuple[float | None, float | None]] = {
    # the page's (least, greatest) where it offers less than the kind accepts; None: the kind's
    "seed": (None, 2**31 - 1),  # numpy's and torch's seeds; the kind takes any int >= 0
    "top_pct": (0.1, None),  # a number input needs a least value; the kind's is "over 0"
    "ltv_lr": (1e-7, None),  # the same
    "site_shots": (None, 64),  # N demonstrations per embedding prompt: more fits no context window we serve
}
UI_DEFAULTS: dict[str, Any] = {
    "ab_positions": "last",  # the live toggle ablates the last token (fast); the page's curves run at every position
    "sg_perturbations": None,  # None: the perturbations that run (the page decides)
}

FALLBACK: Callable[[str], dict[str, Any] | None] | None = None
"""kind -> its capabilities entry (`name`, `aliases`, `params`) or None, read when the service's capabilities were
not loaded (tests: the registry's); None in the app."""
_lock = threading.Lock()
_KINDS: dict[str, dict[str, Any]] = {}  # a kind's name or alias -> its capabilities entry (name, params, result, ...)


def load(caps: dict[str, Any]) -> None:
    """Take the kinds' entries (names, aliases, params and result schemas) from the service's capabilities
    (`GET /capabilities`)."""
    for k in caps.get("job_kinds") or []:
        if isinstance(k, dict) and "name" in k:
            with _lock:
                _KINDS.update(dict.fromkeys([k["name"], *(k.get("aliases") or [])], k))


def entry(kind: str) -> dict[str, Any] | None:
    """The capabilities' entry of `kind` (its name or an alias): the service's, else FALLBACK's; None if unknown."""
    if kind not in _KINDS and FALLBACK is not None:
        found = FALLBACK(kind)
        if found:
            load({"job_kinds": [found]})
    return _KINDS.get(kind)


def kind_name(kind: str) -> str:
    """A kind's one name (the registry's, as the service states it) for its name or an older one (an alias);
    anything else as it is (the service then says it is unknown)."""
    info = entry(kind)
    return info["name"] if info else kind


def params_schema(kind: str) -> dict[str, Any]:
    """The kind's params schema; LookupError when the service states none for it."""
    e = entry(kind)
    if e is None:
        raise LookupError(f"the service states no parameters for the analysis {kind!r} (its capabilities list "
                          f"{', '.join(_KINDS) or 'no kinds'}): is it an older version than this dashboard?")
    return e.get("params") or {}


def result_schema(kind: str) -> dict[str, Any] | None:
    """The kind's result schema as the service states it; None before `load` (nothing is checked then)."""
    return (_KINDS.get(kind) or {}).get("result") or None


def plain(prop: dict[str, Any], schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """A field's schema as it is read: the non-null branch of an optional field (`int | None` is anyOf
    [{integer...}, {null}]), a `$ref` resolved against `schema`'s `$defs`. The UI's one schema reader."""
    branches = [b for b in prop.get("anyOf", []) if b.get("type") != "null"]
    if len(branches) == 1:
        prop = {**branches[0], **{k: v for k, v in prop.items() if k != "anyOf"}}
    ref = prop.get("$ref", "")
    if ref.startswith("#/$defs/"):
        found = ((schema or {}).get("$defs") or {}).get(ref.rpartition("/")[2], {})
        prop = {**found, **{k: v for k, v in prop.items() if k != "$ref"}}
    return prop


@dataclass(frozen=True)
class Spec:
    """A setting as its kind declares it. `lo`/`hi`: the least and greatest value a widget and a link take (the
    kind's bounds, narrowed by `UI_RANGES`; an exclusive bound of the kind's is one the page never offers)."""

    kind: str
    field: str
    default: Any
    lo: float | None
    hi: float | None
    help: str
    options: tuple[Any, ...] | None
    type: str | None


def field(kind: str, name: str) -> dict[str, Any]:
    """The JSON schema of `kind`'s params field `name` (KeyError naming the kind's fields otherwise)."""
    props = params_schema(kind).get("properties", {})
    if name not in props:
        raise KeyError(f"kind {kind!r} has no field {name!r}; its fields: {', '.join(props)}")
    return props[name]


def kind_default(kind: str, name: str) -> Any:
    """The default of `kind`'s params field `name` (for a job parameter a page sends without a widget)."""
    return field(kind, name).get("default")


def spec(name: str) -> Spec:
    """The setting `name` (a key of WIDGETS): default, bounds, options, help, from its kind's schema."""
    kind, fname = WIDGETS[name]
    prop = plain(field(kind, fname))
    items = prop.get("items", {}) if prop.get("type") == "array" else prop
    lo, hi = items.get("minimum"), items.get("maximum")
    ui_lo, ui_hi = UI_RANGES.get(name, (None, None))
    lo = ui_lo if ui_lo is not None else lo
    hi = ui_hi if ui_hi is not None else hi
    if lo is None and "exclusiveMinimum" in items and ui_lo is None:
        raise ValueError(f"{name}: {kind}.{fname} is over {items['exclusiveMinimum']}: state its least value in UI_RANGES")
    if hi is None and "exclusiveMaximum" in items:
        hi = items["exclusiveMaximum"] - 1 if items.get("type") == "integer" else None
    options = tuple(items["enum"]) if "enum" in items else None
    default = UI_DEFAULTS[name] if name in UI_DEFAULTS else prop.get("default")
    if isinstance(default, list):
        default = list(default)
    return Spec(kind, fname, default, lo, hi, prop.get("description", ""), options, items.get("type"))


def default(name: str) -> Any:
    """The setting's default (a fresh list for a list)."""
    return spec(name).default


def check(name: str, value: Any) -> Any:
    """`value` when within the setting's bounds and options (each item of a list), else ValueError saying which."""
    sp = spec(name)
    for v in value if isinstance(value, list) else [value]:
        if sp.options is not None and v not in sp.options:
            raise ValueError(f"must be one of {', '.join(map(str, sp.options))}")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if not math.isfinite(v):
                raise ValueError("must be a finite number")
            if (sp.lo is not None and v < sp.lo) or (sp.hi is not None and v > sp.hi):
                raise ValueError(f"must be between {_num(sp.lo)} and {_num(sp.hi)}")
    return value


def flag(s: str) -> bool:
    """A link's on/off: 1, true, yes, on or 0, false, no, off."""
    v = str(s).strip().lower()
    if v not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
        raise ValueError("must be 1 or 0")
    return v in ("1", "true", "yes", "on")


def from_text(name: str, s: str) -> Any:
    """A link's text of the setting `name` -> its value, checked as its widget is (`check`): "a,b" for a list."""
    sp = spec(name)
    one = {"integer": int, "number": lambda x: float(str(x).rstrip("%")), "boolean": flag}.get(sp.type or "", str)
    if plain(field(*WIDGETS[name])).get("type") == "array":
        value: Any = list(dict.fromkeys(one(x.strip()) for x in str(s).split(",") if x.strip()))
        if not value:
            raise ValueError("must name at least one")
    else:
        value = one(str(s).strip())
    return check(name, value)


def _num(v: float | None) -> str:
    return "any" if v is None else str(v) if float(v).is_integer() and abs(v) >= 1 else f"{v:g}"


def widget_bounds(name: str) -> dict[str, Any]:
    """`min_value` / `max_value` for a number input of the setting (floats for a float field)."""
    sp = spec(name)
    cast = float if sp.type == "number" else int
    return {k: cast(v) for k, v in (("min_value", sp.lo), ("max_value", sp.hi)) if v is not None}


def help_text(name: str, more: str = "") -> str:
    """The kind's description of the setting (first letter raised, a full stop), then `more`."""
    d = spec(name).help.strip()
    d = (d[:1].upper() + d[1:] + ("" if d.endswith(".") else ".")) if d else ""
    return " ".join(x for x in (d, more.strip()) if x)


def offsets(s: str) -> list[int]:
    """`-1,-2` -> [-1, -2]: negative offsets from the last prompt token (the `ltv` kind's bounds)."""
    items = sorted({int(x) for x in str(s).split(",") if x.strip()}, reverse=True)
    lo, hi = spec("ltv_positions").lo, spec("ltv_positions").hi
    if not items or items[0] > hi or items[-1] < lo:
        raise ValueError(f"positions are negative offsets from the last token, between {lo:g} and {hi:g}, e.g. -1,-2")
    return items


def fmt_ints(v: Iterable[int]) -> str:
    """[-1, -2] -> `-1,-2` (what `offsets` reads back)."""
    return ",".join(str(int(x)) for x in v)
