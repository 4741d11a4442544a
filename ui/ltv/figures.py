"""Plotly figures of the Learned task vectors page: pure functions of the `ltv` and `ltv_tasks` job results (plain
dicts), no Streamlit, no torch.

Result shapes (backend/analysis/ltv/ltv.py: LtvResult, ltv/ltv_tasks.py: LtvTasksResult; Metrics = {accuracy,
label_accuracy, tr_ratio, n}):
- ltv: {"layers": [l...], "layer", "conditions": [name...], "table": {cond: Metrics},
        "sweep": {cond: {"accuracy": [per layer], "label_accuracy", "tr_ratio"}}, "rotation": [per layer],
        "stretch": [per layer], "per_layer": [{"layers", "conditions", "training": {"loss", "val_accuracy", ...},
        "key_heads": {"saliency": (L, H), "heads", ...}, "ov": {...}, "propagation": {...}}]}
- ltv_tasks: {"tasks": [...], "similarity": [[...]], "table": {task: {cond: Metrics}}, "label_spaces", ...}
- a running training's live data: {"kind": "ltv_train", "layers", "loss": [per step], "val_accuracy": [per epoch],
  "epoch", "epochs", "step", "steps"}
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import figures
from .. import metrics as M

FONT = figures.FONT
CONDITION_STYLE: dict[str, dict[str, Any]] = {
    "zero_shot": {"name": "zero-shot", "color": "#9e9e9e", "dash": "dot", "symbol": "circle"},
    "icl": {"name": "ICL (k-shot)", "color": "#2ca02c", "dash": "dash", "symbol": "cross"},
    "vanilla": {"name": "vanilla task vector", "color": "#8c564b", "dash": "solid", "symbol": "square"},
    "fv": {"name": "function vector", "color": "#9467bd", "dash": "solid", "symbol": "diamond"},
    "tr": {"name": "TR-head vector", "color": "#1f77b4", "dash": "solid", "symbol": "triangle-up"},
    "tl": {"name": "TL-head vector", "color": "#ff7f0e", "dash": "solid", "symbol": "triangle-down"},
    "ltv": {"name": "learned task vector", "color": "#d62728", "dash": "solid", "symbol": "star"},
    "ltv+icl": {"name": "LTV + ICL", "color": "#e377c2", "dash": "dashdot", "symbol": "star-open"},
}

def condition_name(c: str) -> str:
    return CONDITION_STYLE.get(c, {"name": c})["name"]


def _style(fig: go.Figure, height: int, title: str | None) -> go.Figure:
    fig.update_layout(height=height + (30 if title and "<br>" in title else 0), title=title,
                      margin=dict(l=10, r=10, t=76 if title and "<br>" in title else 40, b=10),
                      font=dict(family=FONT), hoverlabel=dict(font=dict(family=FONT)),
                      legend=dict(orientation="h", y=-0.22))
    return fig


def loss_curve(training: dict[str, Any], title: str | None = None, height: int = 300) -> go.Figure:
    """Training loss per step, and the held-out accuracy after each epoch (right axis)."""
    loss = list(training.get("loss") or [])
    acc = list(training.get("val_accuracy") or [])
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=list(range(1, len(loss) + 1)), y=loss, mode="lines", name="training loss",
                             line=dict(color="#d62728", width=1.5),
                             hovertemplate="step %{x}<br>loss %{y:.3f}<extra></extra>"), secondary_y=False)
    if acc:
        per = training.get("steps") and training.get("epochs") and training["steps"] / max(training["epochs"], 1)
        per = per or (len(loss) / max(len(acc), 1))
        fig.add_trace(go.Scatter(x=[per * (i + 1) for i in range(len(acc))], y=acc, mode="lines+markers",
                                 name="held-out accuracy (per epoch)", line=dict(color="#2ca02c", dash="dot"),
                                 hovertemplate="epoch %{text}<br>accuracy %{y:.2f}<extra></extra>",
                                 text=[str(i + 1) for i in range(len(acc))]), secondary_y=True)
    if training.get("steps"):
        fig.update_xaxes(range=[0, training["steps"] + 1])
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="cross-entropy (gold first token)", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="held-out accuracy", secondary_y=True, range=[0, 1.05])
    return _style(fig, height, title)


def layer_sweep(result: dict[str, Any], metric: str = "accuracy", title: str | None = None,
                height: int = 380) -> go.Figure:
    """`metric` against the injection layer, one line per condition."""
    layers = list(result["layers"])
    fig = go.Figure()
    for c in result["conditions"]:
        ys = result["sweep"][c][metric]
        st = CONDITION_STYLE.get(c, {"name": c, "color": None, "dash": "solid", "symbol": "circle"})
        fig.add_trace(go.Scatter(x=layers, y=ys, mode="lines+markers", name=st["name"],
                                 line=dict(color=st["color"], dash=st["dash"], width=3 if c == "ltv" else 2),
                                 marker=dict(symbol=st["symbol"], size=10 if c == "ltv" else 7),
                                 hovertemplate=f"{st['name']}<br>layer %{{x}}: %{{y:.2f}}<extra></extra>"))
    fig.update_xaxes(title_text="injection layer (input of the decoder layer)", tickmode="array", tickvals=layers)
    fig.update_yaxes(title_text=M.LABEL.get(metric, metric), range=[-0.03, 1.03])
    return _style(fig, height, title)


def rotation_stretch(result: dict[str, Any], title: str | None = None, height: int = 340) -> go.Figure:
    """cos(θ, Qθ) and ‖Sθ‖/‖θ‖ against the injection layer (W = QS, the fitted linear propagation)."""
    layers = list(result["layers"])
    rot, stretch = result.get("rotation") or [], result.get("stretch") or []
    fig = make_subplots(rows=1, cols=2, subplot_titles=("Rotation: cos(θ, Qθ)", "Stretch: ‖Sθ‖ / ‖θ‖"),
                        horizontal_spacing=0.12)
    fig.add_trace(go.Scatter(x=layers, y=rot, mode="lines+markers", name="cos(θ, Qθ)",
                             line=dict(color="#1f77b4"), hovertemplate="layer %{x}: cos %{y:.3f}<extra></extra>"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=layers, y=stretch, mode="lines+markers", name="‖Sθ‖ / ‖θ‖",
                             line=dict(color="#d62728"), hovertemplate="layer %{x}: %{y:.3g}×<extra></extra>"),
                  row=1, col=2)
    fig.update_xaxes(title_text="injection layer", tickmode="array", tickvals=layers)
    fig.update_yaxes(range=[-1.02, 1.02], row=1, col=1, title_text="cosine (1 = no rotation)")
    finite = [s for s in stretch if s is not None and np.isfinite(s) and s > 0]
    if finite and max(finite) / min(finite) > 30:
        fig.update_yaxes(type="log", row=1, col=2, title_text="stretch (log)")
    else:
        fig.update_yaxes(row=1, col=2, title_text="stretch", rangemode="tozero")
    fig.update_layout(showlegend=False)
    return _style(fig, height, title)


def similarity(result: dict[str, Any], title: str | None = None, height: int | None = None) -> go.Figure:
    """Cosine similarity of the tasks' LTVs; tasks ordered by label space, then name."""
    names = list(result["tasks"])
    spaces = result.get("label_spaces") or {}
    order = sorted(range(len(names)), key=lambda i: (result.get("kinds", {}).get(names[i], ""),
                                                     spaces.get(names[i], ""), names[i]))
    sim = np.asarray(result["similarity"], dtype=float)[np.ix_(order, order)]
    labels = [names[i] for i in order]
    n = len(labels)
    text = [[f"{v:.2f}" for v in row] for row in sim]
    fig = go.Figure(go.Heatmap(z=sim, x=labels, y=labels, zmin=-1, zmax=1, zmid=0, colorscale="RdBu_r",
                               text=text, texttemplate="%{text}" if n <= 16 else None, xgap=1, ygap=1,
                               colorbar=dict(title=dict(text="cos", side="right"), thickness=14),
                               hovertemplate="%{y} · %{x}<br>cos %{z:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return _style(fig, height or int(min(760, max(360, 36 * n + 140))), title)


def ablation_bars(key_heads: dict[str, Any], title: str | None = None, height: int = 300) -> go.Figure:
    """LTV accuracy: nothing ablated, the key heads ablated, and as many random heads (mean ± sd, each draw)."""
    rand = [r["accuracy"] for r in key_heads.get("random") or []]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=["LTV", "key heads ablated", "random heads ablated"],
                         y=[key_heads["ltv"]["accuracy"], key_heads["ablated"]["accuracy"],
                            key_heads["random_accuracy_mean"]],
                         error_y=dict(type="data", array=[0, 0, key_heads["random_accuracy_std"]], visible=True),
                         marker_color=["#d62728", "#111111", "#9e9e9e"], showlegend=False,
                         hovertemplate="%{x}: %{y:.2f}<extra></extra>"))
    if rand:
        fig.add_trace(go.Scatter(x=["random heads ablated"] * len(rand), y=rand, mode="markers", name="draws",
                                 marker=dict(color="#555", size=6, opacity=0.6), showlegend=False,
                                 hovertemplate="a draw: %{y:.2f}<extra></extra>"))
    fig.update_yaxes(title_text="accuracy", range=[0, 1.05])
    return _style(fig, height, title)


def heads_of(key_heads: dict[str, Any] | None) -> Sequence[Sequence[int]]:
    return [tuple(h) for h in (key_heads or {}).get("heads") or []]
