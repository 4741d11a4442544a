"""The findings report as one self-contained HTML file: the report's markdown (headings, paragraphs, lists and
tables) turned into HTML inside `html_export.page_html` (no server, no network), the summary first."""
from __future__ import annotations

import html
import re
from typing import Any

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


def report_html(result: Any, include_plotlyjs: bool = False) -> str:
    """One HTML file of a `findings` result: the summary table (paper, finding, the paper's figure, ours), then the
    whole report."""
    r = result if isinstance(result, dict) else result.model_dump()
    rows = [(s["paper"], s["finding"], s["paper_figure"], s["ours"]) for s in r["summary"]]
    body = markdown_html(r["markdown"].split("\n", 1)[1] if r["markdown"].startswith("# ") else r["markdown"])
    return page_html(f"Findings on {r['model']}", subtitle=f"{r['shape']}; tasks {', '.join(r['tasks'])}",
                     settings={"model": r["model"], "tasks": ", ".join(r["tasks"]), "sections": ", ".join(r["sections"])},
                     tables=[{"title": "Summary", "columns": ["paper", "finding", "paper's figure", f"{r['model']}"],
                              "rows": rows}],
                     commands=[r["command"]] if r.get("command") else [], body_html=body,
                     notes=list(r.get("warnings") or []), include_plotlyjs=include_plotlyjs)
