"""Plotly figures of the Steering & geometry page: pure functions of the `steer`, `geometry` and `perturb`
job results (plain dicts), no Streamlit, no torch.

Result shapes (see backend/analysis/tsla/: steering.py SteerResult, geometry.py GeometryResult, perturbations.py
PerturbationReportResult; Metrics is {accuracy, label_accuracy, tr_ratio, n}):
- steer: {"layers": [l...], "zero_shot": Metrics, "icl": Metrics,
          "vectors": {name: {"accuracy": [per layer], "label_accuracy": [...], "tr_ratio": [...], "heads", "norm"}}}
- geometry: {"layers", "inject_layer", "conditions": {cond: {metric: {"mean": [L], "std": [L]}}},
             "pca": {"points": {cond: [[x, y, z]...]}, "gold": [...], "label_directions": {label: [x, y, z]},
                     "explained_variance_ratio": [...], "layer"}}
- perturb: {"top_k", "shots", "prompts", "heads": {"tr"|"tl"|"random": [[l, h]...]},
            "perturbations": {"none"|name: {"icl": Metrics, "tr", "tl", "tr_diff", "tl_diff",
                                           "ablation": {"none"|"tr"|"tl"|"random": Metrics}} or {"skipped": reason}}}
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import figures
from .. import metrics as M

METRICS = M.NAMES

FONT = "Inter, 'Source Sans Pro', system-ui, sans-serif"

# bars and lines of the steering report: references first, then the vector types
VECTOR_STYLE: dict[str, dict[str, str]] = {
    "zero_shot": {"name": "zero-shot", "color": "#b0b0b0"},
    "icl": {"name": "ICL", "color": "#2ca02c"},
    "tr": {"name": "TR vector", "color": "#1f77b4"},
    "tl": {"name": "TL vector", "color": "#ff7f0e"},
    "random": {"name": "random-heads vector", "color": "#7f7f7f"},
    "fv": {"name": "function vector", "color": "#9467bd"},
    "vanilla": {"name": "vanilla task vector", "color": "#8c564b"},
    "custom": {"name": "selected heads", "color": "#00acc1"},
}

# the five conditions of the geometry report
CONDITION_STYLE: dict[str, dict[str, Any]] = {
    "zero_shot": {"name": "zero-shot", "color": "#9e9e9e", "dash": "dot", "symbol": "circle"},
    "zero_shot+tr": {"name": "zero-shot + TR", "color": "#1f77b4", "dash": "solid", "symbol": "diamond"},
    "zero_shot+tl": {"name": "zero-shot + TL", "color": "#ff7f0e", "dash": "solid", "symbol": "square"},
    "zero_shot+random": {"name": "zero-shot + random", "color": "#5f5f5f", "dash": "dash", "symbol": "x"},
    "icl": {"name": "ICL", "color": "#2ca02c", "dash": "solid", "symbol": "cross"},
}
GEOMETRY_METRICS: dict[str, dict[str, Any]] = {
    "alignment": {"title": "Subspace alignment", "axis": "‖Ph‖ / ‖h‖", "range": (0.0, 1.0)},
    "ld": {"title": "Logit difference", "axis": "LD"},
    "rotation": {"title": "In-subspace rotation", "axis": "angle to gold direction (°)", "range": (0.0, 180.0)},
}
PERTURBATION_NAMES = {
    "none": "unperturbed",
    "shuffled_inputs": "shuffled inputs",
    "random_labels": "random labels",
    "flipped_labels": "flipped labels",
    "symbol_labels": "symbol labels",
    "number_labels": "number labels",
}
ABLATION_STYLE = {
    "tr": {"name": "top TR ablated", "color": "#1f77b4"},
    "tl": {"name": "top TL ablated", "color": "#ff7f0e"},
    "random": {"name": "random ablated", "color": "#7f7f7f"},
}
LABEL_COLORS = ["#e41a1c", "#377eb8", "#4daf4a", "#984ea3", "#ff7f00", "#a65628", "#f781bf", "#17becf",
                "#bcbd22", "#666666"]


def style(fig: go.Figure, height: int) -> go.Figure:
    two_lines = "<br>" in str(fig.layout.title.text or "")
    fig.update_layout(height=height + (30 if two_lines else 0), margin=dict(l=10, r=10, t=104 if two_lines else 50, b=10),
                      font=dict(family=FONT), hoverlabel=dict(font=dict(family=FONT)),
                      legend=dict(orientation="h", y=-0.18))
    return figures.clear_of_modebar(fig)


def rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def vector_name(key: str) -> str:
    return VECTOR_STYLE.get(key, {"name": key})["name"]


def perturbation_name(key: str) -> str:
    return PERTURBATION_NAMES.get(key, key.replace("_", " "))


# -- steering -----------------------------------------------------------------------------------------------
def steer_rows(res: dict[str, Any], vectors: Sequence[str] | None = None, layer_index: int = 0) -> list[dict[str, Any]]:
    """One row per bar: zero-shot, ICL, then each vector (in `vectors` order when given) at
    `res["layers"][layer_index]`. Values in [0, 1]."""
    rows = [{"key": ref, "name": vector_name(ref), **{m: float(res[ref][m]) for m in METRICS},
             **{f"{m}_ci": M.ci_of(res[ref], m) for m in METRICS},
             "layer": None, "norm": None, "heads": []} for ref in ("zero_shot", "icl")]
    have = res.get("vectors") or {}
    keys = [v for v in (vectors if vectors is not None else have) if v in have]
    for k in keys:
        v = have[k]
        norm = v.get("norm")
        rows.append({"key": k, "name": vector_name(k), **{m: float(v[m][layer_index]) for m in METRICS},
                     **{f"{m}_ci": (v.get(f"{m}_ci") or [None] * (layer_index + 1))[layer_index] for m in METRICS},
                     "layer": int(res["layers"][layer_index]),
                     "norm": None if not norm else float(norm[layer_index]), "heads": v.get("heads") or []})
    return rows


def steer_bars(res: dict[str, Any], vectors: Sequence[str] | None = None, layer_index: int = 0,
               title: str | None = None) -> go.Figure:
    """Accuracy, label accuracy and TR ratio (in %) for zero-shot, ICL and each injected vector, side by side."""
    rows = steer_rows(res, vectors, layer_index)
    fig = make_subplots(rows=1, cols=len(METRICS), subplot_titles=[M.LABEL[m] for m in METRICS],
                        horizontal_spacing=0.06)
    names = [r["name"] for r in rows]
    colors = [VECTOR_STYLE.get(r["key"], {"color": "#17becf"})["color"] for r in rows]
    for col, metric in enumerate(METRICS, start=1):
        y = [100 * r[metric] for r in rows]
        fig.add_trace(go.Bar(x=names, y=y, marker_color=colors, name=metric, showlegend=False,
                             error_y=figures.ci_bars(y, [r.get(f"{metric}_ci") for r in rows], "#444444"),
                             text=[f"{v:.0f}%" for v in y], textposition="outside", cliponaxis=False,
                             customdata=[r["key"] for r in rows],
                             hovertemplate="%{x}: %{y:.1f}%<extra></extra>"), row=1, col=col)
        fig.update_yaxes(title_text="% of prompts" if col == 1 else None, range=[0, 112], row=1, col=col)
    layer = res["layers"][layer_index]
    fig.update_layout(title=dict(text=title or f"Zero-shot prompts steered at layer {layer}, "
                                               f"α = {res['alpha']:g}", x=0.0), bargap=0.25)
    return style(fig, 400)


VECTOR_LINES = {"tr": ("solid", "circle"), "tl": ("dash", "square"), "random": ("dot", "x"),
                "fv": ("dashdot", "diamond"), "vanilla": ("longdash", "triangle-up"), "custom": ("solid", "star")}


def steer_sweep(res: dict[str, Any], vectors: Sequence[str] | None = None, title: str | None = None) -> go.Figure:
    """Accuracy, label accuracy and TR ratio (in %) against the injection layer, one line per vector (each its
    own dash and marker, so overlapping lines stay visible); zero-shot and ICL as flat reference lines drawn
    on top."""
    layers = [int(l) for l in res["layers"]]
    have = res.get("vectors") or {}
    keys = [v for v in (vectors if vectors is not None else have) if v in have]
    fig = make_subplots(rows=1, cols=len(METRICS), subplot_titles=[M.LABEL[m] for m in METRICS],
                        horizontal_spacing=0.06)
    for col, metric in enumerate(METRICS, start=1):
        for rank, k in enumerate(keys):
            st = VECTOR_STYLE.get(k, {"name": k, "color": "#17becf"})
            dash, symbol = VECTOR_LINES.get(k, ("solid", "circle"))
            width, size = max(5.5 - 0.8 * rank, 1.5), max(14 - 1.5 * rank, 6)  # later lines thinner: all show
            y = [100 * float(a) for a in have[k][metric]]
            fig.add_trace(go.Scatter(x=layers, y=y, mode="lines+markers",
                                     name=st["name"], legendgroup=k, showlegend=col == 1,
                                     error_y=figures.ci_bars(y, have[k].get(f"{metric}_ci"), st["color"]),
                                     line=dict(color=st["color"], width=width, dash=dash),
                                     marker=dict(symbol=symbol, size=size, line=dict(width=1, color="white")),
                                     hovertemplate=f"{st['name']}, layer %{{x}}: %{{y:.1f}}%<extra></extra>"),
                          row=1, col=col)
        for ref, dash in (("zero_shot", "dot"), ("icl", "dash")):  # drawn last: on top
            st = VECTOR_STYLE[ref]
            y = 100 * float(res[ref][metric])
            fig.add_trace(go.Scatter(x=layers, y=[y] * len(layers), mode="lines", name=st["name"], legendgroup=ref,
                                     showlegend=col == 1, line=dict(color=st["color"], width=2, dash=dash),
                                     hovertemplate=f"{st['name']}: %{{y:.1f}}%<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="injection layer", dtick=1 if len(layers) <= 40 else None, row=1, col=col)
        fig.update_yaxes(title_text="% of prompts" if col == 1 else None, range=[-3, 103], row=1, col=col)
    fig.update_layout(title=dict(text=title or f"Layer sweep, α = {res['alpha']:g}", x=0.0))
    return style(fig, 420)


# -- geometry -------------------------------------------------------------------------------------------------
def geometry_curves(geo: dict[str, Any], metrics: Sequence[str] = tuple(GEOMETRY_METRICS),
                    title: str | None = None) -> go.Figure:
    """Per-layer mean of each metric for the five conditions, with a ±1 sd band over prompts and the mean's 95%
    bootstrap interval as error bars (where the result has it); the injection layer marked."""
    layers = [int(l) for l in geo["layers"]]
    conds = geo["conditions"]
    order = [c for c in CONDITION_STYLE if c in conds] + [c for c in conds if c not in CONDITION_STYLE]
    raw = geo.get("final_norm") is False  # the raw residual: its "logit difference" is no logit difference
    titles = [("⟨h, ΔW⟩ (no final norm)" if raw and m == "ld" else GEOMETRY_METRICS[m]["title"]) for m in metrics]
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=titles, horizontal_spacing=0.07)
    for col, m in enumerate(metrics, start=1):
        for c in order:
            st = CONDITION_STYLE.get(c, {"name": c, "color": "#17becf", "dash": "solid"})
            mean = np.asarray(conds[c][m]["mean"], dtype=float)
            sd = np.asarray(conds[c][m].get("std") or np.zeros_like(mean), dtype=float)
            lo, hi = GEOMETRY_METRICS[m].get("range", (None, None))
            up, down = np.clip(mean + sd, lo, hi), np.clip(mean - sd, lo, hi)
            fig.add_trace(go.Scatter(x=layers + layers[::-1], y=list(up) + list(down[::-1]), mode="lines",
                                     fill="toself", fillcolor=rgba(st["color"], 0.12), line=dict(width=0),
                                     hoverinfo="skip", showlegend=False, legendgroup=c, name=f"{st['name']} ± sd"),
                          row=1, col=col)
            ci_lo, ci_hi = conds[c][m].get("ci_low"), conds[c][m].get("ci_high")
            bars = None if ci_lo is None or ci_hi is None else dict(
                type="data", symmetric=False, array=np.clip(np.asarray(ci_hi, float) - mean, 0, None).tolist(),
                arrayminus=np.clip(mean - np.asarray(ci_lo, float), 0, None).tolist(), thickness=1, width=2,
                color=st["color"])
            fig.add_trace(go.Scatter(x=layers, y=mean, mode="lines+markers", name=st["name"], legendgroup=c,
                                     showlegend=col == 1, customdata=sd, error_y=bars,
                                     line=dict(color=st["color"], width=2.5, dash=st["dash"]), marker=dict(size=5),
                                     hovertemplate=(f"{st['name']}, layer %{{x}}: %{{y:.4g}} ± %{{customdata:.3g}}"
                                                    "<extra></extra>")), row=1, col=col)
        if geo.get("inject_layer") is not None:
            fig.add_vline(x=int(geo["inject_layer"]), line=dict(color="#bbbbbb", width=1, dash="dot"), row=1, col=col)
        fig.update_xaxes(title_text="layer", dtick=1 if len(layers) <= 24 else None, row=1, col=col)
        fig.update_yaxes(title_text=GEOMETRY_METRICS[m]["axis"], row=1, col=col)
    fig.update_layout(title=dict(text=title or f"Hidden states at the last token, per layer (vectors injected at "
                                               f"layer {geo.get('inject_layer')}, α = {geo['alpha']:g})", x=0.0))
    return style(fig, 400)


MAX_GOLD_GROUPS = 9  # gold labels coloured apart; the rarer ones (generation tasks) share "other"
MAX_DIRECTIONS = 12
OTHER = "other"


def gold_groups(gold: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Each prompt's colour group (its gold label, or "other" past the MAX_GOLD_GROUPS most frequent) and
    each group's colour."""
    counts: dict[str, int] = {}
    for g in gold:
        counts[g] = counts.get(g, 0) + 1
    keep = set(counts) if len(counts) <= MAX_GOLD_GROUPS + 1 else \
        set(sorted(counts, key=lambda g: (-counts[g], g))[:MAX_GOLD_GROUPS])
    groups = [g if g in keep else OTHER for g in gold]
    colors = {g: LABEL_COLORS[i % len(LABEL_COLORS)] for i, g in enumerate(sorted(keep))}
    if OTHER in groups:
        colors[OTHER] = "#c7c7c7"
    return groups, colors


def pca_scatter(geo: dict[str, Any], dims: int = 2, color_by: str = "condition", arrows: bool = False,
                conditions: Sequence[str] | None = None, label_directions: bool = True,
                title: str | None = None) -> go.Figure:
    """PCA of the hidden states at `pca.layer`, one trace per condition (or per condition and gold label);
    optional arrows from each zero-shot point to its steered counterparts; label unembedding directions
    drawn from the origin (the cloud's mean), scaled to the cloud."""
    pca = geo["pca"]
    pts = {c: np.asarray(p, dtype=float).reshape(len(p), -1) for c, p in pca["points"].items()}
    # the references (zero-shot, ICL) drawn last, on top of the steered clouds they would hide under
    refs = ("zero_shot", "icl")
    order = [c for c in CONDITION_STYLE if c in pts and c not in refs] + [c for c in pts if c not in CONDITION_STYLE] \
        + [c for c in refs if c in pts]
    if conditions is not None:
        order = [c for c in order if c in conditions]
    ncomp = min(p.shape[1] for p in pts.values()) if pts else 0
    dims = 3 if dims == 3 and ncomp >= 3 else 2
    evr = list(pca.get("explained_variance_ratio") or [])

    def xyz(a: np.ndarray) -> dict[str, Any]:
        a = np.pad(a, ((0, 0), (0, max(0, dims - a.shape[1]))))
        d = {"x": a[:, 0], "y": a[:, 1]}
        if dims == 3:
            d["z"] = a[:, 2]
        return d

    gold = [str(g) for g in pca.get("gold") or []]
    group, gcol = gold_groups(gold)
    Scatter = go.Scatter3d if dims == 3 else go.Scatter
    fig = go.Figure()
    for c in order:
        st = CONDITION_STYLE.get(c, {"name": c, "color": "#17becf", "symbol": "circle"})
        p = pts[c]
        ok = len(gold) == len(p)
        g = gold if ok else ["?"] * len(p)
        grp = group if ok else ["?"] * len(p)
        symbol = st["symbol"] if dims == 2 else {"x": "x", "cross": "cross", "square": "square",
                                                  "diamond": "diamond"}.get(st["symbol"], "circle")
        hover = "%{text}<extra>" + st["name"] + "</extra>"
        if color_by == "gold":
            for lab in sorted(set(grp), key=lambda x: (x == OTHER, x)):
                idx = [i for i, x in enumerate(grp) if x == lab]
                fig.add_trace(Scatter(**xyz(p[idx]), mode="markers", name=f"{st['name']} · {figures.esc(lab.strip())}",
                                      legendgroup=c, text=[f"prompt {i} · gold {figures.esc(repr(g[i].strip()))}"
                                                           for i in idx],
                                      hovertemplate=hover,
                                      marker=dict(color=gcol.get(lab, "#17becf"), symbol=symbol,
                                                  size=9 if dims == 2 else 4, opacity=0.85,
                                                  line=dict(width=0.5, color="white") if dims == 2 else None)))
        else:
            fig.add_trace(Scatter(**xyz(p), mode="markers", name=st["name"], legendgroup=c,
                                  text=[f"prompt {i} · gold {figures.esc(repr(x.strip()))}" for i, x in enumerate(g)],
                                  hovertemplate=hover,
                                  marker=dict(color=st["color"], symbol=symbol, size=9 if dims == 2 else 4,
                                              opacity=0.85,
                                              line=dict(width=0.5, color="white") if dims == 2 else None)))
    if arrows and "zero_shot" in pts:
        z0 = pts["zero_shot"]
        for c in [c for c in order if c.startswith("zero_shot+")]:
            p = pts[c]
            n = min(len(p), len(z0))
            if not n:
                continue
            st = CONDITION_STYLE.get(c, {"name": c, "color": "#17becf"})
            if dims == 2:
                for i in range(n):
                    fig.add_annotation(x=p[i, 0], y=p[i, 1], ax=z0[i, 0], ay=z0[i, 1], xref="x", yref="y",
                                       axref="x", ayref="y", showarrow=True, arrowhead=2, arrowsize=1,
                                       arrowwidth=1.2, arrowcolor=rgba(st["color"], 0.6), text="")
            else:
                seg = np.full((3 * n, 3), np.nan)
                a0, a1 = np.pad(z0[:n], ((0, 0), (0, max(0, 3 - z0.shape[1])))), \
                    np.pad(p[:n], ((0, 0), (0, max(0, 3 - p.shape[1]))))
                seg[0::3], seg[1::3] = a0[:, :3], a1[:, :3]
                fig.add_trace(go.Scatter3d(x=seg[:, 0], y=seg[:, 1], z=seg[:, 2], mode="lines", hoverinfo="skip",
                                           name=f"→ {st['name']}", legendgroup=c, showlegend=False,
                                           line=dict(color=rgba(st["color"], 0.6), width=3)))
            # the arrows' legend entry, so they can be told apart (and are visible in the data)
            fig.add_trace(Scatter(**xyz(np.full((1, dims), np.nan)), mode="lines", name=f"zero-shot → {st['name']}",
                                  legendgroup=c, line=dict(color=st["color"], width=2), hoverinfo="skip"))
    if label_directions:
        dirs = pca.get("label_directions") or {}
        if len(dirs) > MAX_DIRECTIONS:  # the labels coloured apart first
            first = [k for k in dirs if k in gcol] + [k for k in dirs if k not in gcol]
            dirs = {k: dirs[k] for k in first[:MAX_DIRECTIONS]}
        for i, (lab, d) in enumerate(dirs.items()):
            v = np.pad(np.asarray(d, dtype=float), (0, max(0, dims - len(d))))[:dims]
            color = gcol.get(lab, LABEL_COLORS[i % len(LABEL_COLORS)])  # each label direction its own colour
            line = np.stack([np.zeros(dims), v])
            fig.add_trace(Scatter(**xyz(line), mode="lines+text", text=["", figures.esc(lab.strip())],
                                  textposition="top center", name=f"label {figures.esc(repr(lab.strip()))}",
                                  legendgroup="labels",
                                  legendgrouptitle_text="label directions" if i == 0 else None,
                                  line=dict(color=color, width=3 if dims == 2 else 5,
                                            dash="dot" if dims == 2 else None),
                                  hovertemplate=f"unembedding direction of {figures.esc(repr(lab.strip()))}"
                                                "<extra></extra>"))
    axis = [f"PC{i + 1}" + (f" ({100 * evr[i]:.0f}%)" if i < len(evr) else "") for i in range(dims)]
    main, br, sub = (title or f"PCA of hidden states after layer {pca.get('layer')}").partition("<br>")
    title = f"{main} ({dims}D){br}{sub}"
    if dims == 3:
        fig.update_layout(scene=dict(xaxis_title=axis[0], yaxis_title=axis[1], zaxis_title=axis[2]),
                          title=dict(text=title, x=0.0))
    else:
        fig.update_layout(xaxis_title=axis[0], yaxis_title=axis[1], title=dict(text=title, x=0.0),
                          hovermode="closest")
        fig.update_yaxes(scaleanchor="x", scaleratio=1)
    fig = style(fig, 560)
    fig.update_layout(legend=dict(orientation="v", y=1.0, x=1.02))
    return fig
