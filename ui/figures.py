"""Plotly figure builders: pure functions of result dicts, no Streamlit, no torch.

Head maps are drawn as a heatmap with an invisible scatter grid on top (one marker per head): plotly
heatmaps emit no selection events, scatter points do, so clicks, box and lasso select heads through the
grid. A third trace outlines the heads already selected.
"""
from __future__ import annotations

import html
from typing import Any, Iterable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from . import map_colors
from .map_colors import ranks

Head = tuple[int, int]

METRICS: dict[str, dict[str, Any]] = {
    "tr": {"label": "TR", "long": "task recognition",
           "caption": "TR (task recognition): how strongly the head writes into the span of the label tokens' "
                      "unembeddings, i.e. pushes the output towards *some* label of the task.",
           "signed": False},
    "tl": {"label": "TL", "long": "task learning",
           "caption": "TL (task learning): how much of that label-space write points to the *correct* label "
                      "rather than the other labels (per unit of TR).",
           "signed": True},
    "dla_tr": {"label": "DLA-TR", "long": "direct logit attribution to all labels",
               "caption": "DLA-TR: the head's direct logit contribution summed over all label tokens.",
               "signed": True},
    "dla_tl": {"label": "DLA-TL", "long": "direct logit attribution to the gold label",
               "caption": "DLA-TL: the head's direct logit contribution to the gold label's token.",
               "signed": True},
    "induction": {"label": "Induction", "long": "induction score",
                  "caption": "Induction: mean attention to the token after the previous occurrence of the "
                             "current token, on repeated random sequences (0..1).",
                  "signed": False},
}
# other per-head maps drawn with the same heatmap component (never listed among the five head maps)
OTHER_MAPS: dict[str, dict[str, Any]] = {
    "ltv_saliency": {"label": "Saliency", "long": "saliency under the learned task vector",
                     "caption": "Saliency |a · ∂p(gold)/∂a| of each head's last-token output with the LTV injected, "
                                "mean over the scored prompts: how much the gold answer's probability leans on the "
                                "head.",
                     "signed": False},
    "alpha": {"label": "α", "long": "SITE's learned head weight",
              "caption": "α per head: how far SITE moves the head's last-token output towards its task embedding.",
              "signed": False},
    "cie": {"label": "CIE", "long": "causal indirect effect (function vector)",
            "caption": "CIE (causal indirect effect, the function vector's ranking): the gain in p(gold) when the "
                       "head's last-token z is set to its mean over the clean ICL prompts, on prompts whose "
                       "demonstrations have shuffled inputs; here on the maps' own prompts. Positive: the head "
                       "carries the task.",
            "signed": True},
    "recovered": {"label": "Recovered", "long": "share of the gold logit recovered by patching", "unit": "%",
                  "caption": "Recovered share (%): 100 × mean (gold logit patched − target) / mean (gold logit clean "
                             "− target), patching only this head's last-token z from the clean ICL prompts into the "
                             "target prompts. 100% = this head alone restores the clean gold logit; 0% = no effect.",
                  "signed": True},
    "diff": {"label": "A − B", "long": "difference of two maps", "caption": "", "signed": True},
}
EXTRA_MAPS = ("cie",)
"""Head-map-page maps beyond the five of `scores`, computed by another job on request (the patching kind)."""
ORDER_STYLE = {
    "tr": {"name": "top TR", "color": "#1f77b4"},
    "tl": {"name": "top TL", "color": "#ff7f0e"},
    "induction": {"name": "top induction", "color": "#2ca02c"},
    "random": {"name": "random (mean ± sd)", "color": "#7f7f7f"},
}
SELECT_COLOR = "#00e0ff"
TOP_COLOR, TOP_COLOR_NAME = "#ff2d95", "pink"
"""The outline of the top heads of a map (the selection's is SELECT_COLOR, drawn larger around it)."""
FONT = "Inter, 'Source Sans Pro', system-ui, sans-serif"


def esc(text: Any) -> str:
    """Text from a tokenizer, a task file or a user, fit for a plotly label, title or hover: plotly reads `<s>`,
    `<b>`, `<i>`... in them as tags (a tokenizer's `<s>` vanished as a strikethrough); escaped, it shows as is."""
    return html.escape(str(text), quote=False)


def caption(model: str, task: str | None, shots: int | None = None, k: int | str | None = None) -> str:
    """What a figure was computed on, for its title (exported PNGs carry it): "default · syn-sentiment · 8 shots ·
    top 4 heads" (the names escaped: see `esc`)."""
    parts = [esc(model), esc(task)]
    if shots is not None:
        parts.append(f"{shots} shot{'s' if shots != 1 else ''}")
    if k is not None:
        parts.append(f"top {k} heads" if isinstance(k, int) else str(k))
    return " · ".join(parts)


def subtitle(text: str) -> str:
    """A figure title's second, smaller line (what it was computed on), clear of the modebar."""
    return f"<br><span style='font-size:11px;color:#777'>{text}</span>"


def png_config(filename: str, scale: int = 2, fmt: str = "png") -> dict[str, Any]:
    """`config=` for st.plotly_chart: the modebar's camera button saves `filename`.<fmt> (png at `scale`x, or svg)."""
    return {"displaylogo": False, "toImageButtonOptions": {"format": fmt, "filename": filename, "scale": scale},
            "modeBarButtonsToRemove": ["autoScale2d", "toggleSpikelines"]}


def head_name(h: Sequence[int]) -> str:
    return f"L{int(h[0])}.H{int(h[1])}"


def top_k(values: np.ndarray, k: int) -> list[Head]:
    """The k heads with the largest values, best first."""
    v = np.asarray(values, dtype=float)
    H = v.shape[1]
    order = np.argsort(-np.nan_to_num(v.ravel(), nan=-np.inf), kind="stable")[:k]
    return [(int(i // H), int(i % H)) for i in order]


MODEBAR_PX = 34
"""Height of the band at a figure's top that plotly's toolbar (the modebar: camera, zoom, ...) covers."""


def clear_of_modebar(fig: go.Figure) -> go.Figure:
    """Put the title (and the subplots' titles) below the toolbar's band: it covered the titles' right ends. The
    title hangs from MODEBAR_PX below the top; the top margin grows to hold it (at least the band when untitled)."""
    text = str(fig.layout.title.text or "")
    lines = (1 + text.count("<br>")) if text else 0
    need = MODEBAR_PX + (8 + 22 * lines if lines else 0) + (18 if fig.layout.annotations else 0)
    fig.update_layout(title=dict(yref="container", y=1, yanchor="top", pad=dict(t=MODEBAR_PX)),
                      margin=dict(t=max(int(fig.layout.margin.t or 0), need)))
    return fig


def style_figure(fig: go.Figure, height: int) -> go.Figure:
    """A figure's height, margins, font and legend as every chart of the product has them."""
    two_lines = "<br>" in str(fig.layout.title.text or "")
    fig.update_layout(height=height + (30 if two_lines else 0), margin=dict(l=10, r=10, t=96 if two_lines else 40, b=10),
                      font=dict(family=FONT), hoverlabel=dict(font=dict(family=FONT)),
                      legend=dict(orientation="h", y=-0.2))
    return clear_of_modebar(fig)


def map_spec(metric: str) -> dict[str, Any]:
    """The label, long name, caption and sign of a per-head map: one of the five head maps or another heatmap."""
    return METRICS[metric] if metric in METRICS else OTHER_MAPS[metric]


def _top_legend(fig: go.Figure) -> go.Figure:
    """The top heads' legend entry above the plot's right end (below it, it sat on the axis title)."""
    fig.update_layout(legend=dict(orientation="h", x=1.0, xanchor="right", y=1.0, yanchor="bottom",
                                  bgcolor="rgba(0,0,0,0)", font=dict(size=11)))
    return fig


def _colorscale(metric: str) -> dict[str, Any]:
    return map_colors.base(map_spec(metric)["signed"])


def color_values(z: np.ndarray, metric: str, scale: str = "linear") -> tuple[np.ndarray, dict[str, Any]]:
    return map_colors.color_values(z, map_spec(metric)["signed"], scale)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def top_set(values: Any, top: "int | Iterable[Sequence[int]] | None") -> list[Head]:
    """The heads to outline as a map's top heads: `top` heads given, or the `top` largest of `values` (ties by
    position, as the backend's top-k lists are), or none."""
    if top is None:
        return []
    if isinstance(top, (int, np.integer)):
        return top_k(np.asarray(values, dtype=float), int(top)) if int(top) > 0 else []
    return [(int(l), int(h)) for l, h in top]


def head_heatmap(values: Any, metric: str, selected: Iterable[Sequence[int]] = (), title: str | None = None,
                 height: int | None = None, top: "int | Iterable[Sequence[int]] | None" = None,
                 top_name: str | None = None, scale: str = "linear") -> go.Figure:
    """Layer (rows, layer 0 on top) x head (columns) heatmap of one (L, H) map, selectable by head.

    Hover shows the head, the value and its rank among all L*H heads (1 = largest). `top` (a count, or the heads)
    outlines the map's top heads in TOP_COLOR (legend: `top_name`, default "top k"); the selection's outline is
    drawn larger, so a head that is both shows both. `scale`: the colour scale (`color_values`)."""
    z = np.asarray(values, dtype=float)
    L, H = z.shape
    rk = ranks(z)
    label = map_spec(metric)["label"]
    height = height or int(min(760, max(320, 40 * L + 120)))
    fig = go.Figure()
    colors, kw = color_values(z, metric, scale)
    bar = dict(title=dict(text=label + ("" if scale == "linear" else f" ({scale})"), side="right"), thickness=14)
    fig.add_trace(go.Heatmap(z=colors, x=list(range(H)), y=list(range(L)), hoverinfo="skip", xgap=1, ygap=1,
                             name=label, **{**kw, "colorbar": {**bar, **kw.get("colorbar", {})}}))
    ll, hh = np.meshgrid(np.arange(L), np.arange(H), indexing="ij")
    cell = max(6.0, min(40.0, (height - 80) / max(L, 1) * 0.9))
    custom = np.stack([z.ravel(), rk.ravel()], axis=1)
    fig.add_trace(go.Scatter(
        x=hh.ravel(), y=ll.ravel(), mode="markers", name="heads", showlegend=False,
        marker=dict(symbol="square", size=cell, color="rgba(0,0,0,0)"), customdata=custom,
        hovertemplate=(f"<b>L%{{y}}.H%{{x}}</b><br>{label} = %{{customdata[0]:.4g}}"
                       f"<br>rank %{{customdata[1]}} of {L * H}<extra></extra>"),
        selected=dict(marker=dict(opacity=1)), unselected=dict(marker=dict(opacity=1))))
    sel = [(int(l), int(h)) for l, h in selected if 0 <= int(l) < L and 0 <= int(h) < H]
    fig.add_trace(go.Scatter(
        x=[h for _, h in sel], y=[l for l, _ in sel], mode="markers", name="selected", showlegend=False,
        hoverinfo="skip", marker=dict(symbol="square-open", size=cell, color=SELECT_COLOR,
                                      line=dict(width=3, color=SELECT_COLOR))))
    tops = [(l, h) for l, h in top_set(z, top) if 0 <= l < L and 0 <= h < H]
    if tops:
        fig.add_trace(go.Scatter(
            x=[h for _, h in tops], y=[l for l, _ in tops], mode="markers", showlegend=True,
            name=top_name or f"top {len(tops)} by {label}", hoverinfo="skip",
            marker=dict(symbol="square-open", size=max(4.0, cell * 0.7), color=TOP_COLOR,
                        line=dict(width=2, color=TOP_COLOR))))
        _top_legend(fig)
    fig.update_xaxes(title_text="head", tickmode="linear" if H <= 40 else "auto", dtick=1 if H <= 40 else None,
                     range=[-0.5, H - 0.5], showgrid=False, zeroline=False)
    fig.update_yaxes(title_text="layer", range=[L - 0.5, -0.5], tickmode="linear" if L <= 40 else "auto",
                     dtick=1 if L <= 40 else None, showgrid=False, zeroline=False)
    fig.update_layout(title=dict(text=title or f"{label}: {map_spec(metric)['long']}", x=0.0, xanchor="left"),
                      clickmode="event+select", dragmode="zoom", hovermode="closest",
                      plot_bgcolor="rgba(0,0,0,0)")
    style_figure(fig, height)
    return _top_legend(fig) if tops else fig


def all_maps(result: dict[str, Any], selected: Iterable[Sequence[int]] = (), title: str | None = None,
             top: int | None = None, scale: str = "linear") -> go.Figure:
    """The five maps side by side, each on its own colour scale with its own colour bar (hover for value and
    rank); `top` (default: the result's `top_k`) outlines each map's top heads."""
    top = int(result.get("top_k") or 0) if top is None else int(top)
    return maps_row([(m, result[m], METRICS[m]["label"]) for m in METRICS], selected, title, top, scale=scale)


def maps_row(maps: Sequence[tuple[str, Any, str]], selected: Iterable[Sequence[int]] = (), title: str | None = None,
             top: "int | Sequence[Iterable[Sequence[int]] | None] | None" = None,
             shared_scale: bool = False, scale: str = "linear") -> go.Figure:
    """Head maps side by side: (metric spec, values (layers, heads), subplot title) each, on its own colour scale
    with its own colour bar; `top` outlines each map's top heads (a count, or per map its heads); `shared_scale`:
    the maps of the first map's metric on one colour range (two runs of the same map); `scale`: each map's colour
    scale when not shared (`color_values`)."""
    names = [m for m, _, _ in maps]
    sel = [(int(l), int(h)) for l, h in selected]
    zs = [np.asarray(v, dtype=float) for _, v, _ in maps]
    same = [z for m, z in zip(names, zs) if m == names[0]]
    lo, hi = min(float(np.nanmin(z)) for z in same), max(float(np.nanmax(z)) for z in same)
    if map_spec(names[0])["signed"]:
        lo, hi = -max(abs(lo), abs(hi)), max(abs(lo), abs(hi))
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=[t for _, _, t in maps],
                        shared_yaxes=len({z.shape for z in zs}) == 1, horizontal_spacing=0.055 if len(names) > 3
                        else 0.08)
    for i, m in enumerate(names, start=1):
        spec = map_spec(m)
        z = zs[i - 1]
        L, H = z.shape
        rk = ranks(z)
        unit = spec.get("unit", "")  # a map given in percent (the recovered share) says so on its bar and hover
        text = [[f"L{l}.H{h}<br>{spec['label']} = {_fmt(z[l, h])}{unit}<br>rank {rk[l, h]} of {L * H}"
                 for h in range(H)] for l in range(L)]
        right = fig.layout[f"xaxis{i if i > 1 else ''}"].domain[1]
        colors, kw = (z, _colorscale(m)) if shared_scale else color_values(z, m, scale)
        if shared_scale and m == names[0] and hi > lo:
            kw.update(zmin=lo, zmax=hi)
        bar = dict(x=right + 0.004, xanchor="left", thickness=9, len=0.9, tickfont=dict(size=9), ticksuffix=unit)
        fig.add_trace(go.Heatmap(z=colors, showscale=True, text=text, hovertemplate="%{text}<extra></extra>",
                                 name=spec["label"], xgap=1, ygap=1,
                                 **{**kw, "colorbar": {**bar, **kw.get("colorbar", {})}}), row=1, col=i)
        if sel:
            fig.add_trace(go.Scatter(x=[h for _, h in sel], y=[l for l, _ in sel], mode="markers",
                                     hoverinfo="skip", showlegend=False,
                                     marker=dict(symbol="square-open", size=9, color=SELECT_COLOR,
                                                 line=dict(width=2, color=SELECT_COLOR))), row=1, col=i)
        tops = top_set(z, top if top is None or isinstance(top, (int, np.integer)) else top[i - 1])
        if tops:
            fig.add_trace(go.Scatter(x=[h for _, h in tops], y=[l for l, _ in tops], mode="markers",
                                     hoverinfo="skip", showlegend=i == 1, legendgroup="top",
                                     name=f"top {len(tops)} of each map" if isinstance(top, (int, np.integer))
                                     else f"top {len(tops)} heads",
                                     marker=dict(symbol="square-open", size=6, color=TOP_COLOR,
                                                 line=dict(width=1.5, color=TOP_COLOR))), row=1, col=i)
        fig.update_xaxes(showgrid=False, zeroline=False, title_text="head", row=1, col=i)
    fig.update_yaxes(autorange="reversed", showgrid=False, zeroline=False)
    fig.update_yaxes(title_text="layer", row=1, col=1)
    L = max(z.shape[0] for z in zs)
    if title:
        fig.update_layout(title=dict(text=title, x=0.0))
    style_figure(fig, int(min(520, max(260, 22 * L + 140))) + (36 if top else 0))
    fig.update_layout(margin=dict(t=96 if title else 60, r=40, b=90 if top else 10))
    if top:  # below the axis titles (above the maps it sat on the last subplot's title)
        fig.update_layout(legend=dict(orientation="h", x=1.0, xanchor="right", y=-0.36, yanchor="top",
                                      bgcolor="rgba(0,0,0,0)", font=dict(size=11)))
    return clear_of_modebar(fig)


def layer_distribution(result: dict[str, Any], k: int, title: str | None = None) -> go.Figure:
    """How many of the top-k heads by TR, TL and induction sit in each layer."""
    L = int(result["n_layers"])
    fig = go.Figure()
    most = 0
    for m in ("tr", "tl", "induction"):
        counts = np.zeros(L, dtype=int)
        for l, _ in top_k(np.asarray(result[m], dtype=float), k):
            counts[l] += 1
        most = max(most, int(counts.max(initial=0)))
        fig.add_trace(go.Bar(x=list(range(L)), y=counts, name=ORDER_STYLE[m]["name"],
                             marker_color=ORDER_STYLE[m]["color"],
                             hovertemplate="layer %{x}: %{y} head(s)<extra>" + ORDER_STYLE[m]["name"] + "</extra>"))
    fig.update_layout(barmode="group", title=dict(text=title or f"Layer of the top {k} heads", x=0.0),
                      xaxis=dict(title="layer", dtick=1 if L <= 16 else 2), yaxis=dict(title="heads", rangemode="tozero", dtick=1 if most <= 8 else None))  # whole heads
    style_figure(fig, 320)
    # the legend at the figure's bottom edge, below the axis title (at y=-0.2 of the plot it sat on the title)
    fig.update_layout(height=int(fig.layout.height) + 40, margin=dict(b=80),
                      legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", x=0.0))
    return fig


METRIC_STYLE: dict[str, dict[str, Any]] = {
    "accuracy": {"name": "accuracy", "title": "Accuracy", "color": "#1f77b4", "dash": "solid", "symbol": "circle"},
    "label_accuracy": {"name": "label accuracy", "title": "Label accuracy", "color": "#9467bd", "dash": "dash",
                       "symbol": "square"},
    "tr_ratio": {"name": "TR ratio", "title": "TR ratio", "color": "#ff7f0e", "dash": "dot", "symbol": "diamond"},
}
ORDER_LINES = {"tr": ("solid", "circle"), "tl": ("dash", "square"), "induction": ("dashdot", "diamond"),
               "random": ("dot", "x")}
LAYERED = [(5.0, 13), (3.5, 10), (2.5, 8), (2.0, 7)]
"""(line width, marker size) by drawing order: a line drawn over an equal one stays thinner, so both show."""


def ci_bars(y: Any, cis: Any, color: str | None = None) -> dict[str, Any] | None:
    """Plotly `error_y` of asymmetric 95% intervals: y (points, in %) and cis [(lo, hi) as rates, per point; None:
    no bar there]; None when there are none (a result without intervals draws no bars)."""
    if not cis or len(cis) != len(y) or all(c is None for c in cis):
        return None
    yv = np.array([np.nan if v is None else float(v) for v in y])
    lo = np.array([np.nan if c is None else 100 * float(c[0]) for c in cis])
    hi = np.array([np.nan if c is None else 100 * float(c[1]) for c in cis])
    up, down = np.nan_to_num(np.clip(hi - yv, 0, None)), np.nan_to_num(np.clip(yv - lo, 0, None))  # none: no bar
    return dict(type="data", symmetric=False, array=up.tolist(), arrayminus=down.tolist(), thickness=1.2, width=3,
                **({"color": color} if color else {}))


def ci_hover(cis: Any) -> list[str] | None:
    """Per point " [71–91%]" for a hover template's %{customdata}; None without intervals."""
    if not cis or any(c is None for c in cis):
        return None
    return [f" [{100 * c[0]:.0f}–{100 * c[1]:.0f}%]" for c in cis]


def icl_curve(icl: dict[str, Any], title: str | None = None) -> go.Figure:
    """Accuracy, label accuracy and TR ratio (in %) against the number of demonstrations k, with their 95%
    intervals as error bars (where the result has them)."""
    k = list(icl["shots"])
    fig = go.Figure()
    for rank, (m, stl) in enumerate((m, stl) for m, stl in METRIC_STYLE.items() if m in icl):
        width, size = LAYERED[min(rank, len(LAYERED) - 1)]
        y = [100 * a for a in icl[m]]
        hov = ci_hover(icl.get(f"{m}_ci"))
        fig.add_trace(go.Scatter(x=k, y=y, mode="lines+markers", name=stl["name"],
                                 line=dict(color=stl["color"], width=width, dash=stl["dash"]),
                                 marker=dict(symbol=stl["symbol"], size=size),
                                 error_y=ci_bars(y, icl.get(f"{m}_ci"), stl["color"]), customdata=hov,
                                 hovertemplate=f"k=%{{x}}: {stl['name']} %{{y:.1f}}%"
                                               + ("%{customdata}" if hov else "") + "<extra></extra>"))
    fig.update_layout(title=dict(text=title or "In-context learning curve", x=0.0),
                      xaxis=dict(title="demonstrations in the prompt (k)", tickmode="array", tickvals=k),
                      yaxis=dict(title="% of prompts", range=[-3, 103]))
    return style_figure(fig, 360)


def rises(abl: dict[str, Any], tol: float = 0.01) -> list[str]:
    """Where a top-head ablation curve goes up as k grows (by more than `tol`), its largest rise per measure:
    "top TL, TR ratio: k 4 → 8 (20% → 40%)" (the random curves' means wander by chance: left out)."""
    ks = list(abl["ks"])
    out = []
    for name, c in abl["curves"].items():
        if name == "random":
            continue
        for m in METRIC_STYLE:
            ys = c.get(m) or []
            ups = [i for i in range(1, len(ys)) if ys[i] > ys[i - 1] + tol]
            if ups:
                i = max(ups, key=lambda j: ys[j] - ys[j - 1])
                out.append(f"{ORDER_STYLE.get(name, {'name': name})['name']}, {METRIC_STYLE[m]['name']}: k {ks[i - 1]} → "
                           f"{ks[i]} ({100 * ys[i - 1]:.0f}% → {100 * ys[i]:.0f}%)")
    return out


def ablation_curves(abl: dict[str, Any], title: str | None = None) -> go.Figure:
    """Accuracy, label accuracy and TR ratio (in %) against the number of top heads ablated, per order, with 95%
    intervals as error bars; random as its mean with its 95% band over the random sets and the prompts (a result
    without intervals: a ±sd band over the sets, clipped to 0..100)."""
    ks = list(abl["ks"])
    metrics = [m for m in METRIC_STYLE if all(m in c for c in abl["curves"].values())]
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[METRIC_STYLE[m]["title"]
                                                                    for m in metrics], horizontal_spacing=0.06)
    curves = abl["curves"]
    for col, metric in enumerate(metrics, start=1):
        names = [o for o in ORDER_STYLE if o in curves] + [o for o in curves if o not in ORDER_STYLE]
        for rank, name in enumerate(names):
            c = curves[name]
            style = ORDER_STYLE.get(name, {"name": name, "color": "#9467bd"})
            dash, symbol = ORDER_LINES.get(name, ("solid", "circle"))
            # each later line thinner, with smaller markers, so equal curves still show every order
            width, size = LAYERED[min(rank, len(LAYERED) - 1)]
            y = 100 * np.asarray(c[metric], dtype=float)
            sd = c.get(f"{metric}_std")
            cis = c.get(f"{metric}_ci")
            band = sd is not None and cis is not None and len(cis) == len(ks)
            if band:  # the random sets' 95% interval as the band
                lo, hi = (np.array([100 * float(ci[j]) for ci in cis]) for j in (0, 1))
                fig.add_trace(go.Scatter(x=ks + ks[::-1], y=list(hi) + list(lo[::-1]), fill="toself", mode="lines",
                                         fillcolor="rgba(127,127,127,0.22)", line=dict(width=0), hoverinfo="skip",
                                         name=f"{style['name']} band", showlegend=False, legendgroup=name),
                              row=1, col=col)
            elif sd is not None:
                sd = 100 * np.asarray(sd, dtype=float)
                hi, lo = np.clip(y + sd, 0, 100), np.clip(y - sd, 0, 100)
                fig.add_trace(go.Scatter(x=ks + ks[::-1], y=list(hi) + list(lo[::-1]), fill="toself", mode="lines",
                                         fillcolor="rgba(127,127,127,0.22)", line=dict(width=0), hoverinfo="skip",
                                         name=f"{style['name']} band", showlegend=False, legendgroup=name),
                              row=1, col=col)
            hov = ci_hover(cis)
            label = f"{name} (mean, 95% interval)" if band and name == "random" else style["name"]
            fig.add_trace(go.Scatter(
                x=ks, y=y, mode="lines+markers", name=label, legendgroup=name, showlegend=col == 1,
                line=dict(color=style["color"], width=width, dash=dash),
                marker=dict(symbol=symbol, size=size),
                error_y=None if band else ci_bars(y, cis, style["color"]),
                customdata=hov if hov else (sd if sd is not None else None),
                hovertemplate=(f"{label}, k=%{{x}}: %{{y:.1f}}%"
                               + ("%{customdata}" if hov else " ± %{customdata:.1f}" if sd is not None else "")
                               + "<extra></extra>")),
                row=1, col=col)
        fig.update_xaxes(title_text="top heads ablated (k)", type="category", row=1, col=col)
        fig.update_yaxes(title_text="% of prompts" if col == 1 else None, range=[-3, 103], row=1, col=col)
    if title:
        fig.update_layout(title=dict(text=title, x=0.0))
    return style_figure(fig, 400)
