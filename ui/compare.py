"""Two runs of the same head map side by side (two tasks, two models or two seeds): their difference and their
rank correlation. Pure functions of the maps (numpy only), no Streamlit.

Same shape (layers, heads): the difference A − B per head, Spearman's ρ and Kendall's τ-b over all L·H heads
(ties get average ranks) and the Jaccard overlap of the two top-k sets (SITE's task specificity, TSLA's
cross-dataset consistency). Different shapes (two models): per-layer profiles at relative depth, each layer's mean
over its heads placed at layer / (layers − 1) and read on a common grid of max(L_A, L_B) depths by linear
interpolation; the profiles' difference and rank correlation.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of a flat array, ties sharing their average rank (what Spearman's ρ ranks by)."""
    x = np.asarray(x, dtype=float).ravel()
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size)
    ranks[order] = np.arange(1, x.size + 1)
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inv, weights=ranks)
    return (sums / counts)[inv]


def spearman(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's ρ: the Pearson correlation of the average ranks; None when either is constant."""
    ra, rb = average_ranks(a), average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((ra ** 2).sum() * (rb ** 2).sum()))
    return None if den == 0 else float((ra * rb).sum() / den)


def kendall(a: np.ndarray, b: np.ndarray) -> float | None:
    """Kendall's τ-b over all pairs (O(n²), fine for a few thousand heads); None when either is constant."""
    a, b = np.asarray(a, dtype=float).ravel(), np.asarray(b, dtype=float).ravel()
    i, j = np.triu_indices(a.size, 1)
    da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    n0 = float(len(i))
    ta, tb = float((da == 0).sum()), float((db == 0).sum())
    den = np.sqrt((n0 - ta) * (n0 - tb))
    return None if den == 0 else float((da * db).sum() / den)


def top_set(values: np.ndarray, k: int) -> set[tuple[int, int]]:
    """The k largest heads (ties by position, as the backend's top-k lists are)."""
    v = np.asarray(values, dtype=float)
    H = v.shape[1]
    order = np.argsort(-np.nan_to_num(v.ravel(), nan=-np.inf), kind="stable")[:k]
    return {(int(x // H), int(x % H)) for x in order}


def depth_profile(values: np.ndarray, n: int) -> np.ndarray:
    """A map's per-layer mean over heads, at relative depth layer / (L − 1), read at n evenly spaced depths."""
    v = np.asarray(values, dtype=float).mean(1)
    x = np.linspace(0.0, 1.0, len(v)) if len(v) > 1 else np.zeros(1)
    grid = np.linspace(0.0, 1.0, n)
    return np.full(n, v[0]) if len(v) == 1 else np.interp(grid, x, v)


def compare_maps(a: Any, b: Any, k: int) -> dict[str, Any]:
    """A against B: {"same_shape", "diff" (A − B, (layers, heads); or the depth profiles' difference), "spearman",
    "kendall", "jaccard" (top-k sets; None for different shapes), "max_abs_diff", "top_a", "top_b", "profile_a",
    "profile_b", "depth"}."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape == b.shape:
        ta, tb = top_set(a, k), top_set(b, k)
        d = a - b
        return {"same_shape": True, "diff": d, "spearman": spearman(a, b), "kendall": kendall(a, b),
                "jaccard": len(ta & tb) / len(ta | tb) if ta | tb else None, "max_abs_diff": float(np.abs(d).max()),
                "top_a": sorted(ta), "top_b": sorted(tb), "k": int(k)}
    n = max(a.shape[0], b.shape[0])
    pa, pb = depth_profile(a, n), depth_profile(b, n)
    d = pa - pb
    return {"same_shape": False, "diff": d, "spearman": spearman(pa, pb), "kendall": kendall(pa, pb),
            "jaccard": None, "max_abs_diff": float(np.abs(d).max()), "profile_a": pa, "profile_b": pb,
            "depth": np.linspace(0.0, 1.0, n), "top_a": sorted(top_set(a, k)), "top_b": sorted(top_set(b, k)),
            "k": int(k)}


def profile_figure(c: dict[str, Any], label_a: str, label_b: str, metric_label: str, title: str | None = None):
    """Two maps of different shapes: their per-layer means at relative depth, and the difference."""
    import plotly.graph_objects as go

    from . import figures

    fig = go.Figure()
    x = list(c["depth"])
    for y, name, color, dash in ((c["profile_a"], label_a, "#1f77b4", "solid"), (c["profile_b"], label_b, "#ff7f0e",
                                                                                 "dash")):
        fig.add_trace(go.Scatter(x=x, y=list(y), mode="lines+markers", name=figures.esc(name),
                                 line=dict(color=color, dash=dash),
                                 hovertemplate="depth %{x:.2f}: %{y:.4g}<extra>" + figures.esc(name) + "</extra>"))
    fig.add_trace(go.Bar(x=x, y=list(c["diff"]), name="A − B", marker_color="rgba(120,120,120,0.45)",
                         hovertemplate="depth %{x:.2f}: A − B = %{y:.4g}<extra></extra>"))
    fig.update_layout(title=dict(text=title or f"{metric_label} per layer at relative depth", x=0.0),
                      xaxis=dict(title="relative depth: layer / (layers − 1)", range=[-0.03, 1.03]),
                      yaxis=dict(title=f"mean {metric_label} over the layer's heads"))
    return figures.style_figure(fig, 360)
