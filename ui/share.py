"""What leaves the dashboard: figure files and "Share as HTML".

- Every figure's camera button saves a PNG or an SVG (the sidebar's *Figure files* setting, `img` in the link),
  named for what it shows: `headlens_<model>_<task>_<shots>shot_<heads>_<figure>` (`file_stem`).
- *Share as HTML* (the sidebar, on every page): one self-contained file with the page's figures (interactive, plotly
  inlined), its settings and link, its numbers (the tables the page registered) and the exact CLI commands of the
  jobs whose results it showed; built on click by `backend.report.html_export` (plotly and the standard library only).

A page draws its figures through `chart` (st.plotly_chart, plus the export name and the record for the file) and
registers its numbers with `table`; `layout.page_setup` starts the record (`begin`) and the sidebar draws the
button (`button`), whose file is built from the record when it is clicked, after the page has drawn.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import streamlit as st

from . import api, figures, snippets, state

FORMATS = ("png", "svg")
SKIP_KINDS = frozenset({"task_fit", "model_info"})
"""Jobs a page runs for itself (the fit check, loading the model): not among the commands that reproduce it."""


@dataclass
class Record:
    """What a page drew in one run: for its Share as HTML file."""

    page: str
    settings: dict[str, str] = field(default_factory=dict)
    link: str | None = None
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)  # by chart key: a fragment's rerun replaces
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)  # by title
    jobs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    task_file: str | None = None
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)


def begin(page: str) -> Record:
    """A new record for this run of `page` (layout.page_setup calls it first)."""
    r = Record(page)
    st.session_state["_hl_share"] = r
    return r


def current() -> Record:
    r = st.session_state.get("_hl_share")
    return r if isinstance(r, Record) else begin("headlens")


def _part(text: Any) -> str:
    return re.sub(r"[^A-Za-z0-9.+=-]+", "-", str(text)).strip("-") or "x"


def heads_part(heads: Any) -> str:
    """A file name's heads: "L1.H3" for one, "L1.H3+L2.H0" for a few, "5heads" beyond 4, as given for a string."""
    if heads is None:
        return ""
    if isinstance(heads, str):
        return heads
    hs = [(int(h[0]), int(h[1])) for h in heads]
    if not hs:
        return ""
    return "+".join(figures.head_name(h) for h in hs) if len(hs) <= 4 else f"{len(hs)}heads"


def file_stem(what: str, heads: Any = None, s: state.Settings | None = None) -> str:
    """`headlens_<model>_<task>_<shots>shot_<heads>_<what>`: what a figure file shows, in its name. `heads`: the heads
    it is about (a head, a set, or a text like "top4"); default: the top-head set size."""
    s = s or state.get()
    h = heads_part(heads) if heads is not None else (f"top{s.top_k}" if s.top_k else f"top{s.top_pct:g}pct")
    parts = ["headlens", s.model, s.task_title or "no-task", f"{s.shots}shot", h, what]
    return "_".join(_part(p) for p in parts if p)


def image_format() -> str:
    v = state.value("img")
    return v if v in FORMATS else "png"


def config(what: str, heads: Any = None) -> dict[str, Any]:
    """`config=` for st.plotly_chart: the camera button saves `file_stem(what, heads)` as PNG or SVG."""
    return figures.png_config(file_stem(what, heads), fmt=image_format())


def chart(fig: Any, what: str, *, key: str, heads: Any = None, share: bool = True, **kw: Any) -> Any:
    """st.plotly_chart(fig) named for export, and recorded for the page's HTML file (unless `share` is False)."""
    out = st.plotly_chart(fig, key=key, config=config(what, heads), **kw)
    if share:
        current().figures[str(key)] = {"title": _title(fig), "figure": fig, "filename": file_stem(what, heads)}
    return out


def _title(fig: Any) -> str:
    text = str(getattr(getattr(fig.layout, "title", None), "text", "") or "")
    first = text.split("<br>")[0]
    return re.sub(r"<[^>]+>", "", first).strip()


def table(title: str, frame: Any, columns: Sequence[str] | None = None) -> None:
    """Register a table (a pandas DataFrame, or a list of dicts) for the page's HTML file."""
    current().tables[title] = {"title": title, "frame": frame, "columns": list(columns) if columns else None}


def numbers(title: str, values: dict[str, Any]) -> None:
    """Register a few named numbers (a two-column table) for the page's HTML file."""
    current().tables[title] = {"title": title, "frame": [{"what": k, "value": v} for k, v in values.items()],
                               "columns": ["what", "value"]}


def used(kind: str, params: dict[str, Any]) -> None:
    """A job whose result the page got (jobs.py calls it): its CLI command goes into the HTML file."""
    if api.kind_name(kind) in SKIP_KINDS:
        return
    r = current()
    item = (kind, dict(params))
    if item not in r.jobs:
        r.jobs.append(item)


def _rows(t: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    frame = t["frame"]
    if hasattr(frame, "to_dict"):  # a DataFrame
        cols = t["columns"] or [str(c) for c in frame.columns]
        cols = [c for c in cols if c in frame.columns]
        return cols, frame[cols].values.tolist()
    recs = list(frame)
    cols = t["columns"] or list(dict.fromkeys(k for r in recs for k in r))
    return cols, [[r.get(c) for c in cols] for r in recs]


SETTING_LABELS = {"model": "model", "task": "task", "shots": "shots", "prompts": "prompts", "seed": "seed",
                  "heads": "selected heads", "top_pct": "top heads (% of all heads)", "top_k": "top heads",
                  "map": "map", "mode": "ablation mode", "kmax": "ablation curves up to k",
                  "ab_positions": "switched off at", "head": "head", "prompt": "task prompt", "text": "your prompt",
                  "sig_only": "significant heads only", "cscale": "colour scale"}
"""The settings every page shares, then the page's own (by their names in words)."""
PAGE_SETTINGS = {"Home": ("ex_k",), "Head map": ("map", "sig_only", "cscale", "pt", "cmp", "head", "prompt", "all_maps", "top_n"),
                 "Ablation": ("mode", "kmax", "ab_positions", "only_changed"), "Steering & geometry": ("sg_",),
                 "Head drill-down": ("head", "prompt", "text", "lens", "grid"), "Learned task vectors": ("ltv_",),
                 "Soft head selection": ("site_",), "Sweeps": ("sweep", "sw_")}
SHARED_SETTINGS = ("model", "task", "shots", "prompts", "seed", "heads", "top_pct", "top_k")
STATED = {"Head map": ("sig_only", "cscale")}
"""View settings a page's file states even at their default (the link leaves them out): a switch that changes
what the figures show."""


def page_settings(page: str, query: dict[str, str], jobs: list[tuple[str, dict[str, Any]]] = ()) -> dict[str, str]:
    """The settings table of `page`'s HTML file: the shared settings and this page's own (not the other pages'
    URL keys), named in words; `prompts` as the page's jobs ran them (a task of 20 held-out queries asked for 50
    runs 20, as its commands say)."""
    own = PAGE_SETTINGS.get(page, ())
    query = {**{k: state.FIELDS[k].fmt(state.FIELDS[k].default()) for k in STATED.get(page, ())}, **query}
    keep = [k for k in query if k in SHARED_SETTINGS or any(k == p or k.startswith(p if p.endswith("_") else p + "_")
                                                           for p in own)]
    out = {}
    for k in sorted(keep, key=lambda k: (k not in SHARED_SETTINGS, SHARED_SETTINGS.index(k) if k in SHARED_SETTINGS
                                         else 0)):
        name = SETTING_LABELS.get(k) or (k.split("_", 1)[1].replace("_", " ") if "_" in k else k)
        out[name] = str(query[k])
    ran = {int(p["prompts"]) for _, p in jobs if isinstance(p.get("prompts"), int)}
    if len(ran) == 1 and "prompts" in out:
        out["prompts"] = str(ran.pop())
    return out


def build(r: Record) -> str:
    """The page's self-contained HTML file (what the button downloads)."""
    from backend.report.html_export import page_html

    tables = []
    for t in r.tables.values():
        cols, rows = _rows(t)
        tables.append({"title": t["title"], "columns": cols, "rows": rows})
    commands = [snippets.cli(kind, params, r.defaults, r.task_file) for kind, params in r.jobs]
    python = "\n\n".join(snippets.python(kind, params, task_file=r.task_file) for kind, params in r.jobs) or None
    settings = page_settings(r.page, r.settings, r.jobs)
    return page_html(r.page, figures=list(r.figures.values()), settings=settings, tables=tables, commands=commands,
                     link=r.link, python=python,
                     subtitle=" · ".join(x for x in (r.settings.get("model"), r.settings.get("task")) if x))


def button(caps: dict[str, Any], link: str | None) -> None:
    """The sidebar's *Share as HTML* button: the file is built from this run's record when it is clicked."""
    r = current()
    r.settings = {k: str(v) for k, v in state.query().items()}
    r.link = link
    r.defaults = snippets.defaults(caps)
    s = state.get()
    upload = (st.session_state.get("_hl_uploads") or {}).get(str(s.task), {})
    r.task_file = upload.get("filename")
    name = "_".join(_part(p) for p in ("headlens", r.page, s.model, s.task_title or "no-task", f"{s.shots}shot"))
    st.download_button("Share as HTML", data=lambda rec=r: build(rec).encode(), file_name=f"{name}.html",
                       mime="text/html", icon=":material/share:", key="share_html", on_click="ignore",
                       width="stretch", help="One file with this page's figures (interactive), settings, numbers and "
                                            "the commands that reproduce them; it opens in a browser with no server "
                                            "and no network.")


def dataframe(title: str, data: Any, **kw: Any) -> Any:
    """st.dataframe(data, **kw), and the table registered for the page's HTML file under `title`."""
    out = st.dataframe(data, **kw)
    table(title, data, kw.get("column_order"))
    return out
