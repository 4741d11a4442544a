"""Figures and tables of the Soft head selection page: pure functions of result dicts, no Streamlit, no torch.

The alpha map is the Head map's component (`figures.head_heatmap`: the same grid, hover and click selection),
relabelled for alpha on a fixed 0..1 scale.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go

from .. import figures

FONT = figures.FONT
COLORS = {"site": "#d62728", "zero_shot": "#7f7f7f", "icl": "#1f77b4", "fv": "#9467bd", "vanilla": "#8c564b",
          "all_ones": "#e377c2", "ltv": "#2ca02c", "top": "#d62728", "bottom": "#7f7f7f"}
METHOD_NAMES = {"zero_shot": "0-shot", "fv": "function vector", "vanilla": "vanilla task vector",
                "all_ones": "every α = 1", "ltv": "LTV", "site": "SITE", "site_hard": "SITE, α rounded"}


def _style(fig: go.Figure, height: int) -> go.Figure:
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=50, b=10), font=dict(family=FONT),
                      legend=dict(orientation="h", yanchor="top", y=-0.3))  # below the x axis' title
    return figures.clear_of_modebar(fig)


def alpha_map(alpha: Any, selected: Sequence[Sequence[int]] = (), title: str | None = None,
              top: int | None = None) -> go.Figure:
    """The alpha map with the Head map's heatmap (clickable the same way), on a 0..1 scale labelled α; `top`
    outlines the top heads by α."""
    fig = figures.head_heatmap(np.asarray(alpha, dtype=float), "alpha", selected=selected, title=title, top=top)
    fig.data[0].update(zmin=0.0, zmax=1.0)
    return fig


def alpha_histogram(alpha: Any) -> go.Figure:
    a = np.ravel(np.asarray(alpha, dtype=float))
    fig = go.Figure(go.Histogram(x=a, xbins=dict(start=0, end=1.0001, size=0.05), marker_color=COLORS["site"],
                                 hovertemplate="α in %{x}: %{y} heads<extra></extra>"))
    for x in (0.1, 0.9):
        fig.add_vline(x=x, line_dash="dot", line_color="#888")
    fig.update_xaxes(title_text="α", range=[0, 1])
    fig.update_yaxes(title_text="heads")
    fig.update_layout(title="α of all heads (dotted: 0.1 and 0.9)", showlegend=False)
    return _style(fig, 260)


def loss_curve(loss: Sequence[float], val: Sequence[dict[str, Any]] = (), steps: int | None = None,
               title: str = "Training loss", smooth: int = 10) -> go.Figure:
    """Per-step training loss (and a running mean), validation losses as markers; log scale."""
    y = np.asarray(loss, dtype=float)
    x = np.arange(1, len(y) + 1)
    fig = go.Figure()
    if len(y):
        fig.add_trace(go.Scatter(x=x, y=np.maximum(y, 1e-8), mode="lines", name="loss (per step)",
                                 line=dict(color="rgba(214,39,40,0.35)", width=1)))
        k = max(1, min(smooth, len(y)))
        run = np.convolve(y, np.ones(k) / k, mode="valid")
        fig.add_trace(go.Scatter(x=x[k - 1:], y=np.maximum(run, 1e-8), mode="lines", name=f"mean of {k} steps",
                                 line=dict(color=COLORS["site"], width=2)))
    if val:
        fig.add_trace(go.Scatter(x=[v["step"] for v in val], y=[max(float(v["loss"]), 1e-8) for v in val],
                                 mode="markers+lines", name="validation loss", marker=dict(size=8, color="#1f77b4"),
                                 line=dict(dash="dot", color="#1f77b4"),
                                 customdata=[v.get("accuracy") for v in val],
                                 hovertemplate="step %{x}: %{y:.4g} (accuracy %{customdata:.0%})<extra></extra>"))
    fig.update_yaxes(type="log", title_text="cross-entropy (gold first token)")
    fig.update_xaxes(title_text="step", range=[0, steps or max(len(y), 1)])
    fig.update_layout(title=title)
    return _style(fig, 320)


def comparison_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of the comparison table: the baselines in their order, then SITE and SITE with rounded alphas."""
    rows = []
    for key, b in (res.get("baselines") or {}).items():
        m = b.get("metrics") or {}
        rows.append({"key": key, "method": b.get("label") or METHOD_NAMES.get(key, key), **_metric_cols(m),
                     "params": b.get("params"), "trainable": b["trainable"], "seconds": b.get("seconds"),
                     "note": b["note"], "ran": bool(m)})
    pc = res.get("params_count") or {}
    for key in ("site", "site_hard"):
        m = res.get(key) or {}
        rows.append({"key": key, "method": METHOD_NAMES[key], **_metric_cols(m),
                     "params": pc.get("site", 0) + pc.get("task_embedding", 0), "trainable": pc.get("site"),
                     "seconds": res.get("train_seconds"), "ran": bool(m),
                     "note": "learned α" if key == "site" else "α < 0.5 -> 0, α >= 0.5 -> 1"})
    return rows


def _metric_cols(m: dict[str, Any]) -> dict[str, Any]:
    return {"accuracy": m.get("accuracy"), "exact_match": m.get("exact_match"), "label_accuracy": m.get("label_accuracy"),
            "tr_ratio": m.get("tr_ratio"), "strict_match": m.get("strict_match"),
            **{f"{k}_ci": m.get(f"{k}_ci") for k in ("accuracy", "exact_match", "label_accuracy", "tr_ratio")}}


def comparison_bars(res: dict[str, Any], title: str | None = None) -> go.Figure:
    rows = [r for r in comparison_rows(res) if r["ran"]]
    names = [r["method"] for r in rows]
    fig = go.Figure()
    for metric, label, color in (("accuracy", "first-token accuracy", "#1f77b4"), ("exact_match", "exact match",
                                                                                   "#ff7f0e"),
                                 ("tr_ratio", "TR ratio", "#2ca02c")):
        vals = [None if r[metric] is None else 100 * r[metric] for r in rows]
        fig.add_trace(go.Bar(x=names, y=vals, name=label, marker_color=color,
                             error_y=figures.ci_bars(vals, [r.get(f"{metric}_ci") for r in rows], "#444444"),
                             hovertemplate="%{x}: %{y:.1f}%<extra>" + label + "</extra>"))
    fig.update_yaxes(title_text="%", range=[0, 105])
    fig.update_layout(barmode="group", title=title or "Zero-shot prompts: SITE against the baselines")
    return _style(fig, 360)


def patching_curves(patching: dict[str, Any], reference: dict[str, float] | None = None,
                    title: str | None = None) -> go.Figure:
    """Accuracy against k for the top-k and bottom-k heads by α (injected outright), with 95% intervals."""
    ks = patching["ks"]
    fig = go.Figure()
    for which, name in (("top", "top-k heads by α"), ("bottom", "bottom-k heads by α")):
        c = patching[which]
        y = [100 * a for a in c["accuracy"]]
        fig.add_trace(go.Scatter(x=ks, y=y, mode="lines+markers", name=name,
                                 error_y=figures.ci_bars(y, c.get("accuracy_ci"), COLORS[which]),
                                 line=dict(color=COLORS[which], width=2, dash=None if which == "top" else "dash"),
                                 hovertemplate="k = %{x}: %{y:.1f}%<extra>" + name + "</extra>"))
    for key, value in (reference or {}).items():
        if value is not None:
            fig.add_hline(y=100 * value, line_dash="dot", line_color=COLORS.get(key, "#888"),
                          annotation_text=METHOD_NAMES.get(key, key), annotation_position="top left")
    fig.update_xaxes(title_text="k (heads injected with α = 1)", type="log", tickvals=ks, ticktext=[str(k) for k in ks])
    fig.update_yaxes(title_text="first-token accuracy %", range=[0, 105])
    fig.update_layout(title=title or "Patching: top-k or bottom-k heads by α")  # a half-width chart: short
    return _style(fig, 340)


def budget_curve(budget: dict[str, Any], reference: dict[str, float] | None = None,
                 title: str | None = None) -> go.Figure:
    ms = budget["m"]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=ms, y=[100 * a for a in budget["accuracy"]], mode="lines+markers",
                             name="first-token accuracy", line=dict(color=COLORS["site"], width=2)))
    fig.add_trace(go.Scatter(x=ms, y=[100 * a for a in budget["exact_match"]], mode="lines+markers",
                             name="exact match", line=dict(color="#ff7f0e", width=2, dash="dash")))
    fig.add_trace(go.Scatter(x=ms, y=[100 * a for a in budget["decided"]], mode="lines+markers",
                             name="α decided (< 0.1 or > 0.9)", line=dict(color="#7f7f7f", width=1, dash="dot")))
    for key, value in (reference or {}).items():
        if value is not None:
            fig.add_hline(y=100 * value, line_dash="dot", line_color=COLORS.get(key, "#888"),
                          annotation_text=METHOD_NAMES.get(key, key), annotation_position="bottom right")
    fig.update_xaxes(title_text="M (few-shot prompts in the task embedding)", type="log", tickvals=ms,
                     ticktext=[str(m) for m in ms])
    fig.update_yaxes(title_text="%", range=[0, 105])
    fig.update_layout(title=title or "Budget: SITE with M embedding prompts")
    return _style(fig, 340)


def transfer_heatmap(tr: dict[str, Any], title: str | None = None, which: str = "accuracy") -> go.Figure:
    """The transfer matrix: `accuracy` (A's learned alphas) or `accuracy_top_k` (A's top-k heads only)."""
    names = tr["tasks"]
    z = 100 * np.asarray(tr[which], dtype=float)
    short = [figures.esc(n.removeprefix("syn-")) for n in names]
    fig = go.Figure(go.Heatmap(z=z, x=short, y=short, colorscale="Viridis", zmin=0, zmax=100, xgap=1, ygap=1,
                               text=np.round(z).astype(int), texttemplate="%{text}",
                               colorbar=dict(title=dict(text="accuracy %", side="right"), thickness=14),
                               hovertemplate="α of <b>%{y}</b> with the embedding of <b>%{x}</b>: %{z:.0f}%"
                                             "<extra></extra>"))
    fig.update_xaxes(title_text="task B (embedding t and test prompts)", side="bottom")
    fig.update_yaxes(title_text="task A (α)", autorange="reversed")
    fig.update_layout(title=title or "Transfer: task A's α with task B's embedding, on B")
    return _style(fig, 120 + 42 * len(names))


def methods_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(r) for r in res.get("rows") or []]


def methods_bars(res: dict[str, Any], title: str | None = None) -> go.Figure:
    rows = methods_rows(res)
    names = [r["name"] for r in rows]
    fig = go.Figure()
    for metric, label, color in (("accuracy", "accuracy", "#1f77b4"), ("tr_ratio", "TR ratio", "#2ca02c")):
        vals = [None if r.get(metric) is None else 100 * r[metric] for r in rows]
        fig.add_trace(go.Bar(x=names, y=vals, error_y=figures.ci_bars(vals, [r.get(f"{metric}_ci") for r in rows],
                                                                      "#444444"),
                             name=label, marker_color=color, hovertemplate="%{x}: %{y:.1f}%<extra>" + label
                                                                           + "</extra>"))
    fig.update_yaxes(title_text="%", range=[0, 105])
    fig.update_layout(barmode="group", title=title or "Every steering method on the same zero-shot prompts")
    return _style(fig, 340)
