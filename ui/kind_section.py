"""A page section made from the registry alone: what a new kind's page needs beyond one call.

    kind_section.section("head_norms", s, caps, title="Head write norms")

The kind is found in `GET /capabilities` (its name or an alias); its settings are widgets built from its params
model's JSON schema (names, defaults, bounds, choices, help: the field's description); the sidebar's shared settings
(model, task, shots, prompts, seed, the BOS convention) fill the fields of those names. Its Run row states the
estimate; its result is drawn by the shape of each field (a layers x heads grid as a heatmap, a number as a metric,
a table of records as a table, the rest as JSON), then its warnings and its Copy as Python. A kind that wants more
draws its result itself from what `section` returns.
"""
from __future__ import annotations

from typing import Any

import streamlit as st

from . import jobs, sections, snippets, state

ENVELOPE = frozenset({"model", "task", "params", "warnings", "notes", "multi_token_labels", "absent_inputs",
                      "cache_hit", "seconds", "unsaved_tensors"})
"""Fields every result has (`backend.analysis.results.Result`): not drawn as the kind's own."""
SHARED = ("shots", "prompts", "seed", "prepend_bos")
"""Params the sidebar sets for every page: taken from it, not given widgets here."""
HIDDEN = frozenset({"batch_size"})
"""Params that change speed only: left at their default."""


def kind_info(caps: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The capabilities' entry of `kind` (its name or an alias), or None."""
    return next((k for k in caps.get("job_kinds") or [] if kind == k.get("name") or kind in (k.get("aliases") or [])),
                None)


def field_schema(schema: dict[str, Any], name: str) -> tuple[dict[str, Any], bool]:
    """(the field's schema without its null branch, whether it may be null), `$ref`s resolved against `schema`."""
    prop = dict(schema.get("properties", {}).get(name) or {})
    nullable = False
    branches = prop.get("anyOf")
    if branches:
        nullable = any(b.get("type") == "null" for b in branches)
        rest = [b for b in branches if b.get("type") != "null"]
        prop = {**{k: v for k, v in prop.items() if k != "anyOf"}, **(rest[0] if len(rest) == 1 else {})}
    ref = prop.get("$ref", "")
    if ref.startswith("#/$defs/"):
        prop = {**(schema.get("$defs") or {}).get(ref.rsplit("/", 1)[1], {}), **prop}
    return prop, nullable


def widget_for(prop: dict[str, Any], nullable: bool) -> str | None:
    """The widget of a field: checkbox, select, int, float, text, list; None: not drawn (its default is sent)."""
    kind = prop.get("type")
    if "enum" in prop or "const" in prop:
        return "select"
    if kind == "boolean":
        return "checkbox"
    if kind == "integer":
        return "int"
    if kind == "number":
        return "float"
    if kind == "string":
        return "text"
    if kind == "array" and (prop.get("items") or {}).get("type") in ("integer", "number", "string"):
        return "list"
    return None


def parse_list(text: str, item_type: str) -> list[Any]:
    """"1, 2, 3" as the list of an array field's items (ints, floats or strings); ValueError on a bad item."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    cast = {"integer": int, "number": float}.get(item_type, str)
    return [cast(t) for t in items]


def settings(info: dict[str, Any], key: str) -> dict[str, Any]:
    """Widgets for the kind's own params; the values that differ from their defaults (what the request sends)."""
    schema = info.get("params") or {}
    out: dict[str, Any] = {}
    names = [n for n in schema.get("properties") or {} if n not in SHARED and n not in HIDDEN]
    cols = st.columns(min(len(names), 3)) if names else []
    for i, name in enumerate(names):
        prop, nullable = field_schema(schema, name)
        how = widget_for(prop, nullable)
        if how is None:
            continue
        default, label, help_ = prop.get("default"), name.replace("_", " ").capitalize(), prop.get("description")
        wkey = f"{key}_{name}"
        with cols[i % len(cols)]:
            if how == "checkbox":
                v = st.checkbox(label, value=bool(default), key=wkey, help=help_)
            elif how == "select":
                options = list(prop.get("enum") or [prop.get("const")])
                v = st.selectbox(label, options, index=options.index(default) if default in options else 0, key=wkey,
                                 help=help_)
            elif how in ("int", "float"):
                cast = int if how == "int" else float
                lo = prop.get("minimum", prop.get("exclusiveMinimum"))
                hi = prop.get("maximum", prop.get("exclusiveMaximum"))
                v = st.number_input(label, min_value=None if lo is None else cast(lo),
                                    max_value=None if hi is None else cast(hi),
                                    value=None if default is None else cast(default), step=1 if how == "int" else None,
                                    key=wkey, help=help_)
            elif how == "text":
                v = st.text_input(label, value=default or "", key=wkey, help=help_) or (None if nullable else "")
            else:
                text = st.text_input(label, value=", ".join(str(x) for x in default or []), key=wkey,
                                     help=(help_ or "") + " (comma-separated)")
                try:
                    v = parse_list(text, prop["items"]["type"])
                except ValueError:
                    st.error(f"{label}: give comma-separated values", icon=":material/error:")
                    v = default
        if v != default:
            out[name] = v
    return out


def request(info: dict[str, Any], s: state.Settings, own: dict[str, Any]) -> dict[str, Any]:
    """The job's params: the sidebar's model and task (when the kind takes them) and its shared settings that are
    fields of the kind, then the section's own."""
    fields = (info.get("params") or {}).get("properties") or {}
    shared = {k: v for k, v in s.job().items() if k in fields}
    return {**({"model": s.model} if info.get("uses_model", True) else {}),
            **({"task": s.task} if info.get("uses_task", True) else {}), **shared, **own}


def views(result: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(field, how, value) for each of the kind's own result fields: "grid" (a list of equal-length lists of numbers,
    e.g. layers x heads), "number", "records" (a list of objects), "list" (of numbers or text), "json". Pure."""
    out = []
    for name, v in result.items():
        if name in ENVELOPE or v is None:
            continue
        if isinstance(v, bool) or isinstance(v, (int, float)):
            how = "number"
        elif isinstance(v, list) and v and all(isinstance(r, list) and r and len(r) == len(v[0])
                                               and all(isinstance(x, (int, float)) for x in r) for r in v):
            how = "grid"
        elif isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
            how = "records"
        elif isinstance(v, list) and all(isinstance(x, (int, float, str)) for x in v):
            how = "list"
        else:
            how = "json"
        out.append((name, how, v))
    return out


def grid_figure(name: str, values: list[list[float]], title: str) -> Any:
    """Rows (layer 0 on top) x columns (heads) heatmap of one grid."""
    import plotly.graph_objects as go

    from .figures import style_figure

    fig = go.Figure(go.Heatmap(z=values, colorscale="Viridis", xgap=1, ygap=1,
                               hovertemplate="L%{y}.H%{x}: %{z:.4g}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="head", yaxis_title="layer", yaxis_autorange="reversed")
    return style_figure(fig, int(min(760, max(320, 40 * len(values) + 120))))


def show(result: dict[str, Any], key: str) -> None:
    """Draw a result field by field (see `views`)."""
    numbers = [(n, v) for n, how, v in views(result) if how == "number"]
    if numbers:
        for col, (n, v) in zip(st.columns(min(len(numbers), 4)), numbers[:4]):
            col.metric(n.replace("_", " "), f"{v:.4g}" if isinstance(v, float) else str(v))
    for name, how, v in views(result):
        label = name.replace("_", " ")
        if how == "grid":
            st.plotly_chart(grid_figure(name, v, label), key=f"{key}_{name}")
        elif how == "records":
            st.dataframe(v, hide_index=True)
        elif how == "list":
            st.caption(f"**{label}**: " + ", ".join(str(x) for x in v))
        elif how == "json":
            with st.expander(label):
                st.json(v)


def section(kind: str, s: state.Settings, caps: dict[str, Any], *, title: str | None = None,
            then: str = "") -> dict[str, Any] | None:
    """A whole page section for `kind`: title, settings, Run row with its estimate, result, warnings, Copy as
    Python (`then`: lines using the result `r`). Returns the result (None before it is computed)."""
    info = kind_info(caps, kind)
    if info is None:
        st.error(f"This service has no analysis {kind!r}.", icon=":material/error:")
        return None
    name = info["name"]
    st.subheader(title or name.replace("_", " ").capitalize())
    with st.expander("Settings", icon=":material/tune:"):
        own = settings(info, key=f"w_{name}")
    params = request(info, s, own)
    clicked = sections.run_row(info.get("description", "").capitalize() + ".", "Results are cached: it runs once.",
                               key=f"run_{name}", estimate=[(name, params)])
    r = sections.section(name, clicked, jobs.Job(name, params, title or name, title or name),
                         "Press **Run** to compute it.")
    if r is not None:
        jobs.show_warnings(r)
        with sections.guard(title or name):
            show(r, key=name)
        snippets.show(name, params, then)
    return r
