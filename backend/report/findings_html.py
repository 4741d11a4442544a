"""The findings report as one self-contained HTML file: the report's markdown (headings, paragraphs, lists and
tables) turned into HTML inside `html_export.page_html` (no server, no network), the summary first, and after each
paper's section its figures (interactive plotly, plotly.js inlined once): per finding a forest plot of the per-task
effects with their 95% intervals coloured by the rule's outcome; TSLA: each task's TR / TL / induction maps with the
top heads marked and its ablation curves with their intervals; LTV and SITE: the methods' accuracies with theirs."""
from __future__ import annotations

import html
import re
from typing import Any

import numpy as np

from .html_export import page_html

_INLINE = [(re.compile(r"`([^`]+)`"), r"<code>\1</code>"), (re.compile(r"\*\*([^*]+)\*\*"), r"<b>\1</b>")]


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    for pat, rep in _INLINE:
        out = pat.sub(rep, out)
    return out


def markdown_html(md: str) -> str:
    """The subset of markdown the report writes: #-headings, paragraphs, `- ` lists (with continuation lines),
    pipe tables, `code` and **bold**."""
    out: list[str] = []
    lines = md.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 4)
            out.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
            i += 1
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
                    rows.append(cells)
                i += 1
            head, body = rows[0], rows[1:]
            out.append("<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
                       + "</table>")
        elif line.startswith("- "):
            items = []
            while i < len(lines) and (lines[i].startswith("- ") or lines[i].startswith("  ")):
                if lines[i].startswith("- "):
                    items.append(lines[i][2:])
                else:
                    items[-1] += " " + lines[i].strip()
                i += 1
            out.append("<ul>" + "".join(f"<li>{_inline(t)}</li>" for t in items) + "</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|", "- ")):
                para.append(lines[i].strip())
                i += 1
            out.append(f"<p>{_inline(' '.join(para))}</p>")
    return "\n".join(out)


COLORS = {"for": "#1b9e77", "against": "#d95f02", "neither": "#7f7f7f"}
ORDER_COLORS = {"tr": "#d62728", "tl": "#1f77b4", "random": "#7f7f7f"}
SECTION_OF = {"TSLA": "tsla", "SITE": "site", "LTV": "ltv"}


def _layout(title: str, height: int, **kw: Any) -> dict[str, Any]:
    return {"title": {"text": title, "font": {"size": 14}}, "height": height, "margin": {"l": 60, "r": 20, "t": 50,
                                                                                          "b": 40},
            "template": "plotly_white", **kw}


def forest(title: str, f: dict[str, Any]) -> dict[str, Any] | None:
    """A finding's per-task effects with their 95% intervals (a forest plot), coloured by the rule's outcome, the
    zero line marked: what the verdict rests on, at a glance."""
    import plotly.graph_objects as go

    ts = [t for t in f.get("tests", []) if t.get("effect") is not None and np.isfinite(t["effect"])]
    if not ts:
        return None
    fig = go.Figure()
    for outcome in ("for", "against", "neither"):
        sel = [t for t in ts if t["outcome"] == outcome]
        if not sel:
            continue
        lo = [t["effect"] - t["ci"][0] if t.get("ci") else 0 for t in sel]
        hi = [t["ci"][1] - t["effect"] if t.get("ci") else 0 for t in sel]
        fig.add_trace(go.Scatter(
            x=[t["effect"] for t in sel], y=[_label(t) for t in sel], mode="markers", name=outcome,
            marker={"color": COLORS[outcome], "size": 9},
            error_x={"type": "data", "symmetric": False, "array": hi, "arrayminus": lo, "thickness": 1.5},
            customdata=[[t["p"], t["q"], t["n"]] for t in sel],
            hovertemplate="%{y}: effect %{x:.3f}<br>p %{customdata[0]:.2g}, q %{customdata[1]:.2g}, n %{customdata[2]}"
                          "<extra>" + outcome + "</extra>"))
    fig.add_vline(x=0, line={"color": "#333", "width": 1, "dash": "dot"})
    direction = "right" if ts[0]["direction"] > 0 else "left"
    fig.update_layout(**_layout(f"{title}: {f['verdict']} (the paper's direction: {direction} of 0)",
                                110 + 26 * len(ts), xaxis={"title": "effect (95% CI)"},
                                yaxis={"autorange": "reversed", "categoryorder": "array",
                                       "categoryarray": [_label(t) for t in ts]}))
    return fig.to_plotly_json()


def _label(t: dict[str, Any]) -> str:
    return str(t["task"]) + (f" k={t['k']}" if t.get("k") is not None else "")


def head_maps(task: str, r: dict[str, Any]) -> dict[str, Any] | None:
    """The TR, TL and induction maps of one task (mean over seeds), the top-TR heads circled and the top-TL heads
    squared on each."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    maps = r.get("maps")
    if not maps:
        return None
    names = [("tr", "TR"), ("tl", "TL"), ("induction", "induction")]
    fig = make_subplots(rows=1, cols=3, subplot_titles=[n for _, n in names], horizontal_spacing=0.08)
    for i, (key, name) in enumerate(names, start=1):
        z = np.asarray(maps[key], float)
        fig.add_trace(go.Heatmap(z=z, colorscale="RdBu_r" if key != "induction" else "Viridis",
                                 zmid=0 if key != "induction" else None, showscale=False,
                                 hovertemplate=f"L%{{y}} H%{{x}}: {name} %{{z:.3g}}<extra></extra>"), 1, i)
        for heads, sym, col, label in ((r.get("top_tr", []), "circle-open", "#000", "top TR"),
                                       (r.get("top_tl", []), "square-open", "#ff7f0e", "top TL")):
            if heads:
                fig.add_trace(go.Scatter(x=[h for _, h in heads], y=[l for l, _ in heads], mode="markers",
                                         name=label, showlegend=i == 1, legendgroup=label,
                                         marker={"symbol": sym, "size": 11, "color": col, "line": {"width": 2}},
                                         hovertemplate=f"{label}: L%{{y}} H%{{x}}<extra></extra>"), 1, i)
        fig.update_xaxes(title_text="head", row=1, col=i)
    fig.update_yaxes(title_text="layer", row=1, col=1)
    n_layers = len(maps["tr"])
    fig.update_layout(**_layout(f"{task}: head maps (mean over seeds), top 3% heads marked", 160 + 14 * n_layers))
    return fig.to_plotly_json()


def ablation(task: str, r: dict[str, Any]) -> dict[str, Any] | None:
    """Accuracy and TR ratio against k heads ablated, per order (top TR, top TL, random), with 95% intervals."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ab, ci, ks = r.get("ablation"), r.get("ablation_ci") or {}, r.get("ks")
    if not ab or not ks:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=["accuracy", "TR ratio"])
    for col, m in enumerate(("accuracy", "tr_ratio"), start=1):
        for o, name in (("tr", "top TR"), ("tl", "top TL"), ("random", "random (mean of sets)")):
            y = ab[o][m]
            c = (ci.get(o) or {}).get(m)
            err = ({"type": "data", "symmetric": False, "array": [b - v for v, (_, b) in zip(y, c)],
                    "arrayminus": [v - a for v, (a, _) in zip(y, c)]} if c else None)
            fig.add_trace(go.Scatter(x=ks, y=y, mode="lines+markers", name=name, legendgroup=o, showlegend=col == 1,
                                     line={"color": ORDER_COLORS[o], "dash": "dot" if o == "random" else "solid"},
                                     error_y=err), 1, col)
        fig.update_xaxes(title_text="heads ablated (k)", row=1, col=col)
        fig.update_yaxes(range=[-0.02, 1.02], row=1, col=col)
    fig.update_layout(**_layout(f"{task}: ablation, 95% intervals (seeds pooled)", 340))
    return fig.to_plotly_json()


def methods(title: str, rows: dict[str, dict[str, Any]], order: list[str]) -> dict[str, Any] | None:
    """Each method's accuracy per task with its 95% Wilson interval (grouped bars)."""
    import plotly.graph_objects as go

    if not rows:
        return None
    fig = go.Figure()
    tasks = list(rows)
    for c in order:
        y, lo, hi = [], [], []
        for t in tasks:
            v, iv = rows[t]["acc"].get(c), rows[t]["ci"].get(c)
            y.append(v)
            lo.append(v - iv[0] if v is not None and iv else 0)
            hi.append(iv[1] - v if v is not None and iv else 0)
        if all(v is None for v in y):
            continue
        fig.add_trace(go.Bar(x=tasks, y=y, name=c, error_y={"type": "data", "symmetric": False, "array": hi,
                                                            "arrayminus": lo}))
    fig.update_layout(**_layout(title, 380, barmode="group", yaxis={"title": "accuracy", "range": [0, 1.05]}))
    return fig.to_plotly_json()


def section_figures(models: dict[str, Any], summary: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """{section: [figure blocks]}: per model, the forest plot of each finding, then the section's own figures (TSLA:
    head maps and ablation curves per task; LTV and SITE: the methods' accuracies)."""
    out: dict[str, list[dict[str, Any]]] = {"tsla": [], "site": [], "ltv": []}
    for label, e in models.items():
        for row in summary:
            f = (row.get("stats") or {}).get(label)
            sec = SECTION_OF.get(row["paper"])
            fig = forest(f"{row['paper']} · {row['finding']}", f) if f else None
            if fig is not None and sec:
                out[sec].append({"figure": fig, "title": row["finding"], "filename": f"{label}-{row.get('key')}"})
        tsla = e.get("tsla")
        if tsla:
            for t, r in tsla["rows"].items():
                for fig, what in ((head_maps(t, r), "maps"), (ablation(t, r), "ablation")):
                    if fig is not None:
                        out["tsla"].append({"figure": fig, "title": f"{t} {what}", "filename": f"{label}-{t}-{what}"})
        ltv = e.get("ltv")
        if ltv:
            rows = {t: {"acc": x["table"], "ci": x.get("ci", {})} for t, x in ltv["rows"].items()}
            fig = methods(f"LTV section on {label}: accuracy at the middle layer with 95% intervals", rows,
                          ["zero_shot", "icl", "vanilla", "fv", "tr", "tl", "ltv", "ltv+icl"])
            if fig:
                out["ltv"].append({"figure": fig, "title": "LTV methods", "filename": f"{label}-ltv-methods"})
        site = e.get("site")
        if site:
            rows = {t: {"acc": {c: (x["methods"].get(c) or {}).get("accuracy") for c in x["methods"]},
                        "ci": x.get("ci", {})} for t, x in site["rows"].items()}
            fig = methods(f"SITE section on {label}: first-token accuracy with 95% intervals", rows,
                          ["zero_shot", "icl_10", "fv", "vanilla", "all_ones", "site", "site_hard"])
            if fig:
                out["site"].append({"figure": fig, "title": "SITE methods", "filename": f"{label}-site-methods"})
    return out


def findings_body(markdown: str, models: dict[str, Any], summary: list[dict[str, Any]]) -> str:
    """The report's HTML: the markdown, each paper's section followed by its figures."""
    from .html_export import figure_html

    figs = section_figures(models, summary)
    parts = re.split(r"(?m)^(?=## )", markdown)
    out, n = [], 0
    for part in parts:
        out.append(markdown_html(part))
        head = part.split("\n", 1)[0]
        sec = next((v for k, v in SECTION_OF.items() if head.startswith(f"## {k}")), None)
        if sec and figs.get(sec):
            out.append(f"<h3>Figures: {html.escape(head[3:].split(':')[0])}</h3>")
            for f in figs[sec]:
                out.append(figure_html(f, f"hl-fig-{n}"))
                n += 1
    return "\n".join(out)


def findings_page(markdown: str, models: dict[str, Any], summary: list[dict[str, Any]], title: str,
                  command: str = "", include_plotlyjs: bool = True) -> str:
    """The multi-model report (`bench/real_findings.py --html`) as one self-contained HTML file: the markdown with
    each section's figures (`summary`: the sections' summary rows, their `stats` per model)."""
    md = markdown.split("\n", 1)[1] if markdown.startswith("# ") else markdown
    return page_html(title, commands=[command] if command else [], body_html=findings_body(md, models, summary),
                     include_plotlyjs=include_plotlyjs)


def report_html(result: Any, include_plotlyjs: bool = True) -> str:
    """One HTML file of a `findings` result: the summary table (paper, finding, the paper's figure, the test, the
    verdict on this model), then the whole report with its figures (plotly.js inlined once unless
    include_plotlyjs=False, for tests)."""
    r = result if isinstance(result, dict) else result.model_dump(mode="json")
    rows = [(s["paper"], s["finding"], s["paper_figure"], s.get("test", ""), s["ours"]) for s in r["summary"]]
    md = r["markdown"].split("\n", 1)[1] if r["markdown"].startswith("# ") else r["markdown"]
    models = (r.get("data") or {}).get("models") or {}
    summary = [{"paper": s["paper"], "finding": s["finding"], "key": s.get("key"),
                "stats": {r["model"]: {"verdict": s.get("verdict"), "tests": s.get("tests") or []}}}
               for s in r["summary"]]
    body = findings_body(md, models, summary)
    return page_html(f"Findings on {r['model']}", subtitle=f"{r['shape']}; tasks {', '.join(r['tasks'])}",
                     settings={"model": r["model"], "tasks": ", ".join(r["tasks"]), "sections": ", ".join(r["sections"])},
                     tables=[{"title": "Summary", "columns": ["paper", "finding", "paper's figure", "test (per task)",
                                                             f"{r['model']}"], "rows": rows}],
                     commands=[r["command"]] if r.get("command") else [], body_html=body,
                     notes=list(r.get("warnings") or []), include_plotlyjs=include_plotlyjs)
