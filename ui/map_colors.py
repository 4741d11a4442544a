"""How a head map's values become colours (one head far above the rest saturates a linear scale): linear, log,
rank or clipped; the Head map's `cscale`, kept in the link and drawn into the HTML file. Pure numpy."""
from __future__ import annotations

from typing import Any

import numpy as np

CLIP_PCT = 95
SCALES = {"linear": "linear", "log": "log", "rank": "rank", "clip": f"clipped at the {CLIP_PCT}th percentile"}


def ranks(values: np.ndarray) -> np.ndarray:
    """Rank of each head, 1 = largest value, ties broken by position (as the backend's top-k lists are)."""
    v = np.asarray(values, dtype=float)
    flat = np.nan_to_num(v.ravel(), nan=-np.inf)
    order = np.argsort(-flat, kind="stable")
    r = np.empty(flat.size, dtype=int)
    r[order] = np.arange(1, flat.size + 1)
    return r.reshape(v.shape)


def base(signed: bool) -> dict[str, Any]:
    """A map's colour scale: diverging around 0 for a signed map, else sequential."""
    return {"colorscale": "RdBu_r", "zmid": 0.0} if signed else {"colorscale": "Viridis"}


def color_values(z: np.ndarray, signed: bool, scale: str) -> tuple[np.ndarray, dict[str, Any]]:
    """A map's colour values and its heatmap's colour settings: z (linear); sign(z) log10(1 + |z| / m), m the
    median nonzero |z| (log, symmetric, so signed maps too); the rank as a share, 1 = largest (rank; signed maps
    rank |z| and keep z's sign); z with the colour range cut at the CLIP_PCT-th percentile of |z| (clip). The
    colour bar's ticks stay in z's units (log) or name ranks (rank)."""
    kw, a = base(signed), np.abs(z[np.isfinite(z)])
    if scale == "clip" and a.size:
        hi = float(np.percentile(a if signed else z[np.isfinite(z)], CLIP_PCT))
        return z, {**kw, "zmin": -hi if signed else float(np.nanmin(z)), "zmax": hi}
    if scale == "log" and a.size:
        m = float(np.median(a[a > 0])) if (a > 0).any() else 1.0
        c = np.sign(z) * np.log10(1 + np.abs(z) / m)
        ticks = np.linspace(np.nanmin(c), np.nanmax(c), 5)
        return c, {**kw, "colorbar": dict(tickvals=ticks, ticktext=[f"{np.sign(t) * m * (10 ** abs(t) - 1):.3g}"
                                                                   for t in ticks])}
    if scale == "rank":
        n = z.size
        c = (1 - (ranks(np.abs(z) if signed else z) - 1) / max(n - 1, 1)) * (np.sign(z) if signed else 1)
        ends = ([-1, 0, 1], ["rank 1 (−)", "0", "rank 1 (+)"]) if signed else ([0, 1], [f"rank {n}", "rank 1"])
        return c, {**kw, "colorbar": dict(tickvals=ends[0], ticktext=ends[1])}
    return z, kw
