"""Plotly figures of the `perturb` results on the Steering & geometry page: ICL under each perturbation, what
ablating the original top heads does under it, and how the TR / TL maps move. Pure functions of the result dict
(see backend/analysis/tsla/perturbation_report.py PerturbationReportResult), no Streamlit, no torch."""
from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import metrics as M
from .steering_figures import ABLATION_STYLE, METRICS, perturbation_name, style


# -- perturbations ---------------------------------------------------------------------------------------------
def perturbation_table(rep: dict[str, Any]) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """(rows, skipped): one row per applied perturbation (the unperturbed baseline first) with its ICL metrics
    (accuracy, label_accuracy, tr_ratio) and the ablation outcomes; skipped as (name, reason)."""
    rows, skipped = [], []
    for name, p in (rep.get("perturbations") or {}).items():
        if p.get("skipped"):
            skipped.append((name, str(p["skipped"])))
            continue
        ab = p.get("ablation") or {}
        base = ab.get("none") or {}
        icl = p.get("icl") or {}
        row = {"key": name, "perturbation": perturbation_name(name), **{m: float(icl[m]) for m in METRICS}}
        for s in ("tr", "tl", "random"):
            if s in ab:
                for m in METRICS:
                    row[f"{m}_{s}"] = float(ab[s][m])
                    if base:
                        row[f"d_{m}_{s}"] = float(ab[s][m]) - float(base[m])
        rows.append(row)
    return rows, skipped


def perturbation_bars(rep: dict[str, Any], title: str | None = None) -> go.Figure:
    """Accuracy, label accuracy and TR ratio (in %) per perturbation, the unperturbed baseline first."""
    rows, _ = perturbation_table(rep)
    names = [r["perturbation"] for r in rows]
    fig = go.Figure()
    for metric, color in zip(METRICS, ("#1f77b4", "#9467bd", "#ff7f0e")):
        y = [100 * r[metric] for r in rows]
        fig.add_trace(go.Bar(x=names, y=y, name=M.LABEL[metric], marker_color=color,
                             text=[f"{v:.0f}%" for v in y], textposition="outside", cliponaxis=False,
                             hovertemplate="%{x}: " + M.LABEL[metric] + " %{y:.1f}%<extra></extra>"))
    fig.update_layout(barmode="group", yaxis=dict(title="% of prompts", range=[0, 112]),
                      title=dict(text=title or f"ICL under each perturbation ({rep.get('shots')} demonstrations)",
                                 x=0.0))
    return style(fig, 380)


def ablation_changes(rep: dict[str, Any]) -> dict[str, float]:
    """Largest absolute change (in [0, 1]) per metric over the perturbations and head sets: all 0 means
    ablating the top heads changed nothing."""
    rows, _ = perturbation_table(rep)
    return {m: max((abs(r.get(f"d_{m}_{s}", 0.0)) for r in rows for s in ABLATION_STYLE), default=0.0)
            for m in ("accuracy", "tr_ratio")}


def ablation_effects(rep: dict[str, Any], title: str | None = None) -> go.Figure:
    """Change (in points) of accuracy and TR ratio when the unperturbed top-k TR, top-k TL or k random heads
    are zero-ablated, under each perturbation, relative to no ablation under the same perturbation."""
    rows, _ = perturbation_table(rep)
    names = [r["perturbation"] for r in rows]
    fig = make_subplots(rows=1, cols=2, subplot_titles=["Δ accuracy", "Δ TR ratio"], horizontal_spacing=0.08)
    for col, metric in enumerate(("accuracy", "tr_ratio"), start=1):
        for s, st in ABLATION_STYLE.items():
            y = [100 * r.get(f"d_{metric}_{s}", np.nan) for r in rows]
            fig.add_trace(go.Bar(x=names, y=y, name=st["name"], marker_color=st["color"], legendgroup=s,
                                 showlegend=col == 1, text=[f"{v:+.0f}" if abs(v) >= 0.5 else "" for v in y],
                                 textposition="outside",
                                 cliponaxis=False,
                                 hovertemplate="%{x}, " + st["name"] + ": %{y:+.1f} pts<extra></extra>"),
                          row=1, col=col)
        fig.update_yaxes(title_text="points vs no ablation" if col == 1 else None, zeroline=True,
                         zerolinecolor="#888", row=1, col=col)
    fig.update_layout(barmode="group", title=dict(text=title or f"Ablating the original top {rep.get('top_k')} heads",
                                                  x=0.0))
    return style(fig, 380)


def _sym(z: np.ndarray) -> float:
    m = float(np.nanmax(np.abs(z))) if z.size else 0.0
    return m if m > 0 else 1.0


def map_differences(rep: dict[str, Any], name: str, title: str | None = None) -> go.Figure:
    """TR (top row) and TL (bottom row) maps: unperturbed | under `name` | difference (perturbed − unperturbed).

    The two maps of a row share a colour range; differences use a diverging scale centred at 0."""
    base, pert = rep["perturbations"]["none"], rep["perturbations"][name]
    pname = perturbation_name(name)
    titles = []
    for m in ("TR", "TL"):
        titles += [f"{m} unperturbed", f"{m} · {pname}", f"{m} difference"]
    fig = make_subplots(rows=2, cols=3, subplot_titles=titles, horizontal_spacing=0.12, vertical_spacing=0.16)
    for row, m in enumerate(("tr", "tl"), start=1):
        a = np.asarray(base[m], dtype=float)
        b = np.asarray(pert[m], dtype=float)
        d = np.asarray(pert.get(f"{m}_diff", (b - a).tolist()), dtype=float)
        L, H = a.shape
        if m == "tr":
            lo, hi = float(min(np.nanmin(a), np.nanmin(b))), float(max(np.nanmax(a), np.nanmax(b)))
            scale = dict(colorscale="Viridis", zmin=lo, zmax=hi)
        else:
            r = max(_sym(a), _sym(b))
            scale = dict(colorscale="RdBu_r", zmin=-r, zmax=r, zmid=0.0)
        r = _sym(d)
        for col, (z, sc, cb) in enumerate(((a, scale, None), (b, scale, 0.635),
                                           (d, dict(colorscale="RdBu_r", zmin=-r, zmax=r, zmid=0.0), 1.01)), start=1):
            label = titles[(row - 1) * 3 + col - 1]
            fig.add_trace(go.Heatmap(z=z, x=list(range(H)), y=list(range(L)), xgap=1, ygap=1, name=label,
                                     showscale=cb is not None,
                                     colorbar=dict(x=cb, y=0.79 if row == 1 else 0.21, len=0.4, thickness=10)
                                     if cb is not None else None,
                                     hovertemplate=f"L%{{y}}.H%{{x}}<br>{label} = %{{z:.4g}}<extra></extra>", **sc),
                          row=row, col=col)
    L, H = len(base["tr"]), len(base["tr"][0]) if base["tr"] else 0
    fig.update_yaxes(autorange="reversed", showgrid=False, zeroline=False, dtick=1 if L <= 32 else None)
    fig.update_xaxes(showgrid=False, zeroline=False, dtick=1 if H <= 32 else None)
    for row in (1, 2):
        fig.update_yaxes(title_text="layer", row=row, col=1)
    for col in (1, 2, 3):
        fig.update_xaxes(title_text="head", row=2, col=col)
    fig.update_layout(title=dict(text=title or f"Head maps: unperturbed vs {pname}", x=0.0))
    return style(fig, int(min(900, max(460, 2 * (18 * L + 90)))))
