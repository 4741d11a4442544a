"""Figures and tables of the Sweeps page, from a sweep's summary (plain dicts; no torch).

`summary["rows"]`: one row per (model, task) with means over seeds; `summary["models"]`: one row per model with
the means over tasks and the depth distribution of the top TR / TL heads (`tr_depth_hist`, `tl_depth_hist`).
"""
from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from .figures import clear_of_modebar, esc

METRICS = {  # summary field -> (label, help, range or None, signed)
    "tr_depth": ("TR depth", "mean relative depth (layer / (layers - 1)) of the top TR heads: 0 first layer, 1 last",
                 (0.0, 1.0), False),
    "tl_depth": ("TL depth", "mean relative depth of the top TL heads", (0.0, 1.0), False),
    "tr_induction": ("TR ∩ induction", "Jaccard overlap of the top TR heads with the top induction heads",
                     (0.0, 1.0), False),
    "tl_induction": ("TL ∩ induction", "Jaccard overlap of the top TL heads with the top induction heads",
                     (0.0, 1.0), False),
    "accuracy": ("accuracy", "ICL accuracy (full-vocabulary argmax = gold) of the scores job", (0.0, 1.0), False),
    "zero_shot_accuracy": ("0-shot accuracy", "accuracy without demonstrations", (0.0, 1.0), False),
    "icl_accuracy": ("ICL accuracy", "accuracy at the most shots of the icl job", (0.0, 1.0), False),
    "icl_gain": ("ICL gain", "accuracy at the most shots minus at the fewest (icl job)", None, True),
    "ablation_drop_tr": ("drop, top TR ablated", "accuracy lost with the most top TR heads ablated", None, True),
    "ablation_drop_tl": ("drop, top TL ablated", "accuracy lost with the most top TL heads ablated", None, True),
}


def short(name: Any, n: int = 28) -> str:
    """A model name for a label: the last part of a path, clipped."""
    text = str(name)
    text = text.rstrip("/").rsplit("/", 1)[-1] if text.startswith(("/", ".", "~")) else text
    return text if len(text) <= n else "…" + text[-(n - 1):]


def metrics_present(summary: dict[str, Any]) -> list[str]:
    rows = summary.get("rows") or []
    return [m for m in METRICS if any(r.get(m) is not None for r in rows)]


def pivot(summary: dict[str, Any], metric: str) -> pd.DataFrame:
    """models (rows) x tasks (columns) of one metric; NaN where a cell has no value."""
    rows = summary.get("rows") or []
    models = list(dict.fromkeys(r["model"] for r in rows))
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    df = pd.DataFrame(index=[short(m) for m in models], columns=[str(t) for t in tasks], dtype=float)
    for r in rows:
        v = r.get(metric)
        if v is not None:
            df.loc[short(r["model"]), str(r["task"])] = float(v)
    df.index.name = "model"
    return df


def models_table(summary: dict[str, Any]) -> pd.DataFrame:
    """One row per model: tasks, accuracy, TR/TL depth and their overlap with induction heads."""
    cols = ["tasks", "n_layers", "accuracy", "zero_shot_accuracy", "tr_depth", "tl_depth", "tr_induction",
            "tl_induction", "icl_accuracy"]
    out = []
    for m in summary.get("models") or []:
        out.append({"model": short(m["model"], 40), **{c: m.get(c) for c in cols if any(c in x for x in
                                                                                         summary["models"])}})
    return pd.DataFrame(out)


def table_heatmap(summary: dict[str, Any], metric: str, table: pd.DataFrame | None = None) -> go.Figure:
    """The models x tasks table of `metric` as a heatmap, values written in the cells (`table`: that table when
    the caller already has it from `pivot`)."""
    df = pivot(summary, metric) if table is None else table
    label, help_text, rng, signed = METRICS.get(metric, (metric, "", None, False))
    z = df.to_numpy(dtype=float)
    text = [["" if pd.isna(v) else f"{v:.2f}" for v in row] for row in z]
    kw: dict[str, Any] = {"zmin": rng[0], "zmax": rng[1]} if rng else {}
    if signed:
        kw["zmid"] = 0.0
    fig = go.Figure(go.Heatmap(z=z, x=[esc(c) for c in df.columns], y=[esc(i) for i in df.index], text=text,
                               texttemplate="%{text}",
                               colorscale="RdBu_r" if signed else "Viridis", colorbar={"title": {"text": label}},
                               hovertemplate="model %{y}<br>task %{x}<br>" + label + " = %{z:.3f}<extra></extra>",
                               **kw))
    fig.update_layout(title={"text": f"{label}: models × tasks", "x": 0}, height=140 + 42 * max(len(df.index), 1),
                      margin={"l": 10, "r": 10, "t": 50, "b": 10}, yaxis={"autorange": "reversed"})
    return clear_of_modebar(fig)


def depth_profile(summary: dict[str, Any]) -> go.Figure:
    """Per model, where the top TR and TL heads sit by relative depth: the share of them in each depth bin."""
    bins = int(summary.get("depth_bins") or 5)
    edges = [f"{i / bins:.1f}–{(i + 1) / bins:.1f}" for i in range(bins)]
    fig = go.Figure()
    for m in summary.get("models") or []:
        for kind, dash in (("tr", "solid"), ("tl", "dot")):
            h = m.get(f"{kind}_depth_hist")
            if h:
                name = esc(short(m["model"]))
                fig.add_trace(go.Scatter(x=edges, y=h, mode="lines+markers", name=f"{name} {kind.upper()}",
                                         line={"dash": dash}, legendgroup=str(m["model"]),
                                         hovertemplate=f"{name}<br>{kind.upper()} heads at depth %{{x}}: "
                                                       "%{y:.0%}<extra></extra>"))
    fig.update_layout(title={"text": "Top TR (solid) and TL (dotted) heads by relative depth", "x": 0},
                      xaxis_title="relative depth (0 = first layer, 1 = last)", yaxis_title="share of top heads",
                      yaxis={"tickformat": ".0%", "rangemode": "tozero"}, height=360,
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return clear_of_modebar(fig)


def overlap_scatter(summary: dict[str, Any]) -> go.Figure:
    """Per model: mean relative depth of the top heads (x) against their overlap with induction heads (y)."""
    fig = go.Figure()
    for kind, symbol in (("tr", "circle"), ("tl", "diamond")):
        ms = [m for m in summary.get("models") or [] if m.get(f"{kind}_depth") is not None]
        fig.add_trace(go.Scatter(x=[m[f"{kind}_depth"] for m in ms], y=[m.get(f"{kind}_induction") for m in ms],
                                 text=[esc(short(m["model"])) for m in ms], mode="markers+text", textposition="top center",
                                 marker={"symbol": symbol, "size": 11}, name=f"top {kind.upper()}",
                                 hovertemplate="%{text}<br>depth %{x:.2f}<br>∩ induction %{y:.2f}<extra></extra>"))
    fig.update_layout(title={"text": "Depth and overlap with induction heads, per model", "x": 0},
                      xaxis={"title": "mean relative depth", "range": [-0.05, 1.05]},
                      yaxis={"title": "Jaccard with top induction heads", "range": [-0.05, 1.05]}, height=360,
                      margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return clear_of_modebar(fig)
