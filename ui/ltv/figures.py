"""Plotly figures of the Learned task vectors page: pure functions of the `ltv` and `ltv_tasks` job results (plain
dicts), no Streamlit, no torch.

Result shapes (backend/analysis/ltv/ltv_layers.py: LtvLayersResult, ltv/ltv_tasks.py: LtvAcrossTasksResult; Metrics = {accuracy,
label_accuracy, tr_ratio, n}):
- ltv: {"layers": [l...], "layer", "conditions": [name...], "table": {cond: Metrics},
        "sweep": {cond: {"accuracy": [per layer], "label_accuracy", "tr_ratio"}}, "rotation": [per layer],
        "stretch": [per layer], "per_layer": [{"layers", "conditions", "training": {"loss", "val_accuracy", ...},
        "key_heads": {"saliency": (L, H), "heads", ...}, "ov": {...}, "propagation": {...}}]}
- ltv_tasks: {"tasks": [...], "similarity": [[...]], "table": {task: {cond: Metrics}}, "label_spaces", ...}
- a running training's live data: {"kind": "ltv_vector", "layers", "loss": [per step], "val_accuracy": [per epoch],
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


def ordering(acc: dict[str, float]) -> str:
    """"learned task vector 90.0% > vanilla task vector 60.0% = function vector 60.0%": best first, "=" between
    values that show the same (it once read "LTV 100% > vanilla 100% > FV 100%")."""
    items = sorted(acc.items(), key=lambda kv: -kv[1])
    out = ""
    for i, (c, v) in enumerate(items):
        if i:
            out += " = " if M.pct(v) == M.pct(items[i - 1][1]) else " > "
        out += f"{condition_name(c)} {M.pct(v)}"
    return out


def epoch_sentence(training: dict[str, Any], patience: int) -> str:
    """What the best epoch and the stop mean: early stopping counts epochs without a higher held-out accuracy; the
    kept vector is the epoch of the highest held-out accuracy, ties to the lower held-out loss."""
    acc = list(training.get("val_accuracy") or [])
    if training.get("stopped") == "loaded":
        return "A saved vector: no training here."
    why = (f"stopped after {patience} epochs without a higher held-out accuracy" if training.get("stopped") ==
           "early stopping" else f"ran all {training.get('epochs_run')} epochs (the held-out accuracy still rose "
                                 f"within the last {patience})")
    return (f"Early stopping on held-out accuracy (patience {patience}): {why}. The kept vector is epoch "
            f"{training.get('best_epoch')}'s, the highest held-out accuracy"
            + (f" ({M.pct(max(acc))})" if acc else "") + ", ties broken by the lower held-out loss"
            + (" (epoch 0: the initial vector was never beaten)." if training.get("best_epoch") == 0 else "."))


def _style(fig: go.Figure, height: int, title: str | None) -> go.Figure:
    fig.update_layout(height=height + (30 if title and "<br>" in title else 0), title=title,
                      margin=dict(l=10, r=10, t=76 if title and "<br>" in title else 40, b=10),
                      font=dict(family=FONT), hoverlabel=dict(font=dict(family=FONT)),
                      legend=dict(orientation="h", y=-0.22))
    return figures.clear_of_modebar(fig)


def loss_curve(training: dict[str, Any], title: str | None = None, height: int = 300) -> go.Figure:
    """Training loss per step, and the held-out accuracy (%) after each epoch (right axis)."""
    loss = list(training.get("loss") or [])
    acc = list(training.get("val_accuracy") or [])
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=list(range(1, len(loss) + 1)), y=loss, mode="lines", name="training loss",
                             line=dict(color="#d62728", width=1.5),
                             hovertemplate="step %{x}<br>loss %{y:.3f}<extra></extra>"), secondary_y=False)
    if acc:
        per = training.get("steps") and training.get("epochs") and training["steps"] / max(training["epochs"], 1)
        per = per or (len(loss) / max(len(acc), 1))
        fig.add_trace(go.Scatter(x=[per * (i + 1) for i in range(len(acc))], y=[100 * a for a in acc],
                                 mode="lines+markers", name="held-out accuracy (per epoch)",
                                 line=dict(color="#2ca02c", dash="dot"),
                                 hovertemplate="epoch %{text}<br>accuracy %{y:.1f}%<extra></extra>",
                                 text=[str(i + 1) for i in range(len(acc))]), secondary_y=True)
    if training.get("steps"):
        fig.update_xaxes(range=[0, training["steps"] + 1])
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="cross-entropy (gold first token)", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="held-out accuracy %", secondary_y=True, range=[0, 105], tickmode="array",
                     tickvals=[0, 25, 50, 75, 100], showgrid=False)  # its own ticks, not the loss axis' (0.311...)
    return _style(fig, height, title)


def layer_sweep(result: dict[str, Any], metric: str = "accuracy", title: str | None = None,
                height: int = 380) -> go.Figure:
    """`metric` (in %) against the injection layer, one line per condition, with 95% intervals as error bars (where
    the result has them). Each later line is thinner, with
    smaller markers (`figures.LAYERED`), so lines on top of each other (all at 100%) all still show."""
    layers = list(result["layers"])
    fig = go.Figure()
    for rank, c in enumerate(result["conditions"]):
        ys = [None if y is None or y != y else 100 * y for y in result["sweep"][c][metric]]
        st = CONDITION_STYLE.get(c, {"name": c, "color": None, "dash": "solid", "symbol": "circle"})
        width, size = figures.LAYERED[min(rank, len(figures.LAYERED) - 1)]
        fig.add_trace(go.Scatter(x=layers, y=ys, mode="lines+markers", name=st["name"],
                                 error_y=figures.ci_bars(ys, result["sweep"][c].get(f"{metric}_ci"), st["color"]),
                                 line=dict(color=st["color"], dash=st["dash"], width=width),
                                 marker=dict(symbol=st["symbol"], size=size),
                                 hovertemplate=f"{st['name']}<br>layer %{{x}}: %{{y:.1f}}%<extra></extra>"))
    fig.update_xaxes(title_text="injection layer (input of the decoder layer)", tickmode="array", tickvals=layers)
    fig.update_yaxes(title_text=f"{M.LABEL.get(metric, metric)} %", range=[-3, 103], tickmode="array",
                     tickvals=[0, 20, 40, 60, 80, 100])
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
    if finite and max(finite) / min(finite) > 30:  # powers of ten only: log ticks read "2, 100, 5, 2, 10"
        fig.update_yaxes(type="log", dtick=1, row=1, col=2, title_text="stretch (log)")
    else:
        fig.update_yaxes(row=1, col=2, title_text="stretch", rangemode="tozero")
    fig.update_layout(showlegend=False)
    return _style(fig, height, title)


def similarity(result: dict[str, Any], title: str | None = None, height: int | None = None) -> go.Figure:
    """Cosine similarity of the tasks' LTVs; tasks ordered by label space, then name."""
    names = list(result["tasks"])
    spaces = result.get("label_spaces") or {}
    order = sorted(range(len(names)), key=lambda i: (result["kinds"].get(names[i], ""),
                                                     spaces.get(names[i], ""), names[i]))
    sim = np.asarray(result["similarity"], dtype=float)[np.ix_(order, order)]
    labels = [figures.esc(names[i]) for i in order]
    n = len(labels)
    text = [[f"{v:.2f}" for v in row] for row in sim]
    fig = go.Figure(go.Heatmap(z=sim, x=labels, y=labels, zmin=-1, zmax=1, zmid=0, colorscale="RdBu_r",
                               text=text, texttemplate="%{text}" if n <= 16 else None, xgap=1, ygap=1,
                               colorbar=dict(title=dict(text="cos", side="right"), thickness=14),
                               hovertemplate="%{y} · %{x}<br>cos %{z:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    return _style(fig, height or int(min(760, max(360, 36 * n + 140))), title)


def ablation_bars(key_heads: dict[str, Any], title: str | None = None, height: int = 300) -> go.Figure:
    """LTV accuracy (%): nothing ablated, the key heads ablated, and as many random heads (mean ± sd, each draw)."""
    rand = [100 * r["accuracy"] for r in key_heads.get("random") or []]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=["LTV", "key heads ablated", "random heads ablated"],
                         y=[100 * key_heads["ltv"]["accuracy"], 100 * key_heads["ablated"]["accuracy"],
                            100 * key_heads["random_accuracy_mean"]],
                         error_y=dict(type="data", array=[0, 0, 100 * key_heads["random_accuracy_std"]], visible=True),
                         marker_color=["#d62728", "#111111", "#9e9e9e"], showlegend=False,
                         hovertemplate="%{x}: %{y:.1f}%<extra></extra>"))
    if rand:
        fig.add_trace(go.Scatter(x=["random heads ablated"] * len(rand), y=rand, mode="markers", name="draws",
                                 marker=dict(color="#555", size=6, opacity=0.6), showlegend=False,
                                 hovertemplate="a draw: %{y:.1f}%<extra></extra>"))
    fig.update_yaxes(title_text="accuracy %", range=[0, 105])
    return _style(fig, height, title)


def heads_of(key_heads: dict[str, Any] | None) -> Sequence[Sequence[int]]:
    return [tuple(h) for h in (key_heads or {}).get("heads") or []]
