"""One self-contained HTML file: interactive plotly figures, settings, tables and the commands that reproduce them.

    html = page_html("Head map", figures=[{"title": "TR", "figure": fig_dict_or_json, "filename": "tr"}],
                     settings={"model": "default", ...}, tables=[{"title": ..., "columns": [...], "rows": [...]}],
                     commands=["python -m backend scores --model default ..."])

The file holds plotly.js itself (inlined, ~4.8 MB) and every figure's JSON, so it opens in a browser with no server
and no network: no `<script src>`, no fonts, no MathJax. Each figure keeps plotly's toolbar (zoom, hover) and saves
a PNG (camera) or an SVG (the button beside it). Imports only plotly and the standard library, so the dashboard
(ui/) and the backend (a report from the command line) both build their files here.
"""
from __future__ import annotations

import datetime as _dt
import html
import json
import math
from typing import Any, Iterable, Mapping, Sequence

CSS = """
body {font-family: Inter, 'Source Sans Pro', system-ui, sans-serif; margin: 0; color: #1f2430; background: #fff;}
main {max-width: 1280px; margin: 0 auto; padding: 24px 32px 64px;}
h1 {font-size: 1.7rem; margin: 0 0 4px;} h2 {font-size: 1.2rem; margin: 32px 0 8px; border-bottom: 1px solid #ddd;
  padding-bottom: 4px;} h3 {font-size: 1rem; margin: 20px 0 6px;}
.muted {color: #6b6f80; font-size: .88rem;}
pre {background: #f5f6f8; border: 1px solid #e2e4ea; border-radius: 6px; padding: 10px 12px; overflow-x: auto;
  white-space: pre-wrap; word-break: break-all; font-size: .85rem;}
table {border-collapse: collapse; font-size: .85rem; margin: 4px 0 12px; display: block; max-width: 100%;
  overflow-x: auto;}
code {overflow-wrap: anywhere; word-break: break-all;}
main {overflow-wrap: anywhere;} .figure {overflow-x: auto;}
@media (max-width: 640px) {main {padding: 16px 12px 48px;}}
th, td {border: 1px solid #e2e4ea; padding: 3px 8px; text-align: left;} th {background: #f5f6f8;}
td.num {text-align: right; font-variant-numeric: tabular-nums;}
.figure {border: 1px solid #eceef2; border-radius: 6px; margin: 12px 0; padding: 4px;}
.notes li {margin: 2px 0;}
"""

FIGURE_JS = """
(function () {
  var svgIcon = {width: 1000, height: 1000,
    path: "M100 150h800v700h-800z M200 750l200-250 150 180 100-120 150 190z", transform: "matrix(1 0 0 -1 0 1000)"};
  document.querySelectorAll("script.hl-figure").forEach(function (tag) {
    var fig = JSON.parse(tag.textContent), box = document.getElementById(tag.dataset.target);
    var name = tag.dataset.filename || "figure";
    var config = {displaylogo: false, responsive: true,
      toImageButtonOptions: {format: "png", filename: name, scale: 2},
      modeBarButtonsToAdd: [{name: "svg", title: "Download as SVG", icon: svgIcon,
        click: function (gd) { Plotly.downloadImage(gd, {format: "svg", filename: name}); }}]};
    var layout = fig.layout || {};
    if (layout.height === undefined) { layout.height = 420; }
    Object.keys(layout).forEach(function (k) {  // tick labels inside the figure (the dashboard's theme does this)
      if (/^[xy]axis\d*$/.test(k) && layout[k].automargin === undefined) { layout[k].automargin = true; }
    });
    Plotly.newPlot(box, fig.data || [], layout, config);
  });
})();
"""


def _script_json(obj: Any) -> str:
    """JSON safe inside a <script> element (no `</script>`, no `<!--`): `</` written `<\\/`."""
    text = obj if isinstance(obj, str) else _figure_json(obj)
    return text.replace("</", "<\\/").replace("<!--", "<\\u0021--")


def _figure_json(fig: Any) -> str:
    """A plotly figure (go.Figure, its dict, or its JSON text) as JSON text, numpy arrays included."""
    import plotly.io as pio

    if isinstance(fig, str):
        return fig
    if hasattr(fig, "to_json"):
        return fig.to_json()
    return pio.to_json(fig, validate=False)


def plotly_js() -> str:
    """The plotly.js bundle of the installed plotly (what every figure of the file draws with)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _cell(v: Any) -> tuple[str, bool]:
    """A table cell's text and whether it is a number (right-aligned): 4 significant digits, None as —."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—", False
    if isinstance(v, bool):
        return ("✓" if v else "·"), False
    if isinstance(v, int):
        return str(v), True
    if isinstance(v, float):
        return (f"{v:.4g}" if math.isfinite(v) else str(v)), True
    try:  # numpy scalars
        import numbers

        if isinstance(v, numbers.Integral):
            return str(int(v)), True
        if isinstance(v, numbers.Real):
            return _cell(float(v))
    except Exception:  # pragma: no cover - anything else is text
        pass
    return html.escape(str(v)), False


def table_html(columns: Sequence[str], rows: Iterable[Sequence[Any]], max_rows: int = 2000) -> str:
    """An HTML table of `rows` (each a sequence in `columns` order); numbers right-aligned, at most `max_rows`."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body, n = [], 0
    for row in rows:
        n += 1
        if n > max_rows:
            continue
        cells = []
        for v in row:
            text, num = _cell(v)
            cells.append(f'<td class="num">{text}</td>' if num else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = f'<p class="muted">{n - max_rows} more rows left out.</p>' if n > max_rows else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def page_html(title: str, *, figures: Sequence[Mapping[str, Any]] = (), settings: Mapping[str, Any] | None = None,
              tables: Sequence[Mapping[str, Any]] = (), commands: Sequence[str] = (), link: str | None = None,
              notes: Sequence[str] = (), subtitle: str | None = None, python: str | None = None,
              created: str | None = None, include_plotlyjs: bool = True, body_html: str = "") -> str:
    """The whole file as one string.

    figures: {"figure" (a plotly figure, its dict or JSON), "filename" (for its PNG / SVG), "title" (its label),
    "heading" (a heading above it, for figures without a title of their own)}; settings: name
    -> value (shown as a table); tables: {"title", "columns", "rows"}; commands: shell lines that reproduce the
    numbers (`python -m backend ...`); link: the dashboard link of the same view; notes: sentences shown as a list;
    python: notebook lines; created: a timestamp (default: now, UTC). include_plotlyjs=False leaves plotly.js out
    (tests, or a file with no figures); body_html: HTML placed after the tables (already escaped)."""
    created = created or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{html.escape(title)} · headlens</title>", f"<style>{CSS}</style>"]
    if include_plotlyjs:
        out.append(f'<script type="text/javascript">{plotly_js()}</script>')
    out.append("</head><body><main>")
    out.append(f"<h1>{html.escape(title)}</h1>")
    out.append(f'<p class="muted">{html.escape(subtitle) + " · " if subtitle else ""}headlens · saved {created}. '
               "This file is self-contained: it opens with no server and no network.</p>")
    if link:
        out.append(f'<p class="muted">Dashboard link of this view: <code>{html.escape(link)}</code></p>')
    if settings:
        out.append("<h2>Settings</h2>")
        out.append(table_html(["setting", "value"], [(k, v) for k, v in settings.items()]))
    if commands or python:
        out.append("<h2>Reproduce</h2>")
        if commands:
            out.append('<p class="muted">From the repository root (results come from the same cache):</p>')
            out.append("<pre>" + html.escape("\n".join(commands)) + "</pre>")
        if python:
            out.append('<p class="muted">In a notebook:</p><pre>' + html.escape(python) + "</pre>")
    if notes:
        out.append('<h2>Notes</h2><ul class="notes">' + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    if figures:
        out.append("<h2>Figures</h2>")
        for i, f in enumerate(figures):
            out.append(figure_html(f, f"hl-fig-{i}"))
    if tables:
        out.append("<h2>Numbers</h2>")
        for t in tables:
            out.append(f"<h3>{html.escape(str(t.get('title', '')))}</h3>")
            out.append(table_html(list(t["columns"]), t["rows"]))
    out.append(body_html)
    out.append(f"<script>{FIGURE_JS}</script>" if figures or 'class="hl-figure"' in body_html else "")
    out.append("</main></body></html>")
    return "\n".join(out)


def figure_html(f: Mapping[str, Any], target: str) -> str:
    """One figure's block (its optional heading, the box plotly draws in, its JSON): what `page_html` places under
    Figures, and what a page's own body can place anywhere (`page_html` then adds the script that draws it).
    `target`: the box's id, unique in the page."""
    out = []
    if f.get("heading"):
        out.append(f"<h3>{html.escape(str(f['heading']))}</h3>")
    label = html.escape(str(f.get("title") or f.get("heading") or target), quote=True)
    out.append(f'<div class="figure"><div id="{target}" role="img" aria-label="{label}"></div></div>')
    out.append(f'<script type="application/json" class="hl-figure" data-target="{target}" '
               f'data-filename="{html.escape(str(f.get("filename") or target), quote=True)}">'
               f"{_script_json(f['figure'])}</script>")
    return "\n".join(out)


def json_default(o: Any) -> Any:
    """For json.dumps of settings that hold tuples or numpy values."""
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def settings_text(settings: Mapping[str, Any]) -> dict[str, str]:
    """Settings as text values (lists joined with commas), as the table shows them."""
    out = {}
    for k, v in settings.items():
        if isinstance(v, (list, tuple)):
            v = ",".join(json.dumps(x, default=json_default) if isinstance(x, (list, dict)) else str(x) for x in v)
        out[str(k)] = str(v)
    return out
