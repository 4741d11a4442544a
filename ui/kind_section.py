"""A page section made from the registry alone: what a new kind's page needs beyond one call.

    kind_section.section("head_norms", s, title="Head write norms")

The kind is the service's (`GET /capabilities`, read by `ui.settings`: its name or an alias); its settings are
widgets built from its params model's JSON schema (names, defaults, bounds, choices, help: the field's
description); the sidebar's shared settings (model, task, shots, prompts, seed, the BOS convention) fill the fields
of those names. Its Run row states the estimate; its result is drawn by the shape of each field (a layers x heads
grid as a heatmap, a number as a metric, a table of records as a table, the rest as JSON), then its warnings and its
Copy as Python. A kind that wants more draws its result itself from what `section` returns.
"""
from __future__ import annotations

from typing import Any

import streamlit as st

from . import jobs, sections, settings, snippets, state

ENVELOPE = frozenset({"model", "task", "params", "warnings", "notes", "multi_token_labels", "absent_inputs",
                      "cache_hit", "seconds", "unsaved_tensors"})
"""Fields every result has (`backend.analysis.results.Result`): not drawn as the kind's own."""
SHARED = ("shots", "prompts", "seed", "prepend_bos")
"""Params the sidebar sets for every page: taken from it, not given widgets here."""
HIDDEN = frozenset({"batch_size"})
"""Params that change speed only: left at their default."""
LIST_ITEMS = {"integer": int, "number": float, "string": str}
"""An array field's item types a comma-separated text input takes."""


def widget(name: str, prop: dict[str, Any], key: str) -> Any:
    """Draw the widget of a params field (`prop`: its schema, `settings.plain`) and return its value; a field of
    no widget (an object, a list of lists) returns its default."""
    default, label, help_ = prop.get("default"), name.replace("_", " ").capitalize(), prop.get("description")
    kind, items = prop.get("type"), (prop.get("items") or {}).get("type")
    if "enum" in prop or "const" in prop:
        options = list(prop.get("enum") or [prop.get("const")])
        return st.selectbox(label, options, index=options.index(default) if default in options else 0, key=key,
                            help=help_)
    if kind == "boolean":
        return st.checkbox(label, value=bool(default), key=key, help=help_)
    if kind in ("integer", "number"):
        cast = int if kind == "integer" else float
        lo, hi = (prop.get(b, prop.get("exclusive" + b.capitalize())) for b in ("minimum", "maximum"))
        return st.number_input(label, min_value=None if lo is None else cast(lo),
                               max_value=None if hi is None else cast(hi), value=None if default is None else
                               cast(default), step=1 if kind == "integer" else None, key=key, help=help_)
    if kind == "string":
        return st.text_input(label, value=default or "", key=key, help=help_) or (None if default is None else "")
    if kind == "array" and items in LIST_ITEMS:
        text = st.text_input(label, value=", ".join(map(str, default or [])), key=key,
                             help=(help_ or "") + " (comma-separated)")
        try:
            return [LIST_ITEMS[items](t.strip()) for t in text.split(",") if t.strip()]
        except ValueError:
            st.error(f"{label}: give comma-separated values", icon=":material/error:")
    return default


def own_settings(kind: str, key: str) -> dict[str, Any]:
    """Widgets for the kind's own params; the values that differ from their defaults (what the request sends)."""
    schema = settings.params_schema(kind)
    names = [n for n in schema.get("properties") or {} if n not in SHARED and n not in HIDDEN]
    out: dict[str, Any] = {}
    cols = st.columns(min(len(names), 3)) if names else []
    for i, name in enumerate(names):
        prop = settings.plain(schema["properties"][name], schema)
        with cols[i % len(cols)]:
            v = widget(name, prop, f"{key}_{name}")
        if v != prop.get("default"):
            out[name] = v
    return out


def request(kind: str, s: state.Settings, own: dict[str, Any]) -> dict[str, Any]:
    """The job's params: the sidebar's model and task (when the kind takes them) and its shared settings that are
    fields of the kind, then the section's own."""
    info, fields = settings.entry(kind) or {}, settings.params_schema(kind).get("properties") or {}
    return {**({"model": s.model} if info.get("uses_model", True) else {}),
            **({"task": s.task} if info.get("uses_task", True) else {}),
            **{k: v for k, v in s.job().items() if k in fields}, **own}


def views(result: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(field, how, value) for each of the kind's own result fields: "grid" (a list of equal-length lists of numbers,
    e.g. layers x heads), "number", "records" (a list of objects), "list" (of numbers or text), "json". Pure."""
    def how(v: Any) -> str:
        if isinstance(v, (bool, int, float)):
            return "number"
        if not isinstance(v, list):
            return "json"
        if v and all(isinstance(r, list) and r and len(r) == len(v[0]) and all(isinstance(x, (int, float)) for x in r)
                     for r in v):
            return "grid"
        if v and all(isinstance(r, dict) for r in v):
            return "records"
        return "list" if all(isinstance(x, (int, float, str)) for x in v) else "json"

    return [(n, how(v), v) for n, v in result.items() if n not in ENVELOPE and v is not None]


def grid_figure(values: list[list[float]], title: str) -> Any:
    """Rows (layer 0 on top) x columns (heads) heatmap of one grid."""
    import plotly.graph_objects as go

    from .figures import style_figure

    fig = go.Figure(go.Heatmap(z=values, colorscale="Viridis", xgap=1, ygap=1,
                               hovertemplate="L%{y}.H%{x}: %{z:.4g}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="head", yaxis_title="layer", yaxis_autorange="reversed")
    return style_figure(fig, int(min(760, max(320, 40 * len(values) + 120))))


def show(result: dict[str, Any], key: str) -> None:
    """Draw a result field by field (see `views`)."""
    fields = views(result)
    numbers = [(n, v) for n, how, v in fields if how == "number"][:4]
    for col, (n, v) in zip(st.columns(len(numbers)) if numbers else [], numbers):
        col.metric(n.replace("_", " "), f"{v:.4g}" if isinstance(v, float) else str(v))
    for name, how, v in fields:
        label = name.replace("_", " ")
        if how == "grid":
            st.plotly_chart(grid_figure(v, label), key=f"{key}_{name}")
        elif how == "records":
            st.dataframe(v, hide_index=True)
        elif how == "list":
            st.caption(f"**{label}**: " + ", ".join(map(str, v)))
        elif how == "json":
            with st.expander(label):
                st.json(v)


def section(kind: str, s: state.Settings, *, title: str | None = None, then: str = "") -> dict[str, Any] | None:
    """A whole page section for `kind`: title, settings, Run row with its estimate, result, warnings, Copy as
    Python (`then`: lines using the result `r`). Returns the result (None before it is computed)."""
    info = settings.entry(kind)
    if info is None:
        st.error(f"This service has no analysis {kind!r}.", icon=":material/error:")
        return None
    name = info["name"]
    title = title or name.replace("_", " ").capitalize()
    st.subheader(title)
    with st.expander("Settings", icon=":material/tune:"):
        params = request(name, s, own_settings(name, key=f"w_{name}"))
    r = sections.run(jobs.Job(name, params, title, title), info.get("description", "").capitalize() + ".",
                     "Results are cached: it runs once.", key=name)
    if r is not None:
        with sections.guard(title):
            show(r, key=name)
        snippets.show(name, params, then)
    return r
