"""A head map's uncertainty on its figure (the `scores` result's `stats`, `stability`): every head's SE, 95% interval,
p and q in its hover; the heads that are not significant hidden (a switch); the stable top heads outlined.

Works on the figure `figures.head_heatmap` draws (its heatmap and its "heads" hover trace), so that module keeps
one job. Results cached before the statistics lack them: the figure is then left as it is."""
from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from .. import metrics as M

STABLE_COLOR = "#ffffff"
"""The stable top heads' inner outline (inside the top heads' pink one)."""
TESTED = ("tr", "tl")
"""The maps with a test against a null (TR: random label subspaces; TL: per-prompt TL > 0)."""


def _grid(v: Any) -> np.ndarray | None:
    return None if v is None else np.asarray(v, dtype=float)


def too_few(scores: dict[str, Any]) -> str:
    """"1 prompt: no interval and no test (they need 2 prompts or more)" for a result (or an anytime view) of one
    prompt, else "" (`metrics.too_few`)."""
    return M.too_few(int(scores.get("prompts_done", scores.get("prompts")) or 0))


def p_text(p: float, st: dict[str, Any], metric: str) -> str:
    """"p = 0.012", or at the test's floor (no draw as extreme) the bound: "p ≤ 0.00037 (2,700 draws)"."""
    floor, draws = st.get("p_floor"), st.get("draws")
    if floor and draws and p <= floor * (1 + 1e-9):
        return f"p ≤ {floor:.2g} ({int(draws):,} {'draws' if metric == 'tr' else 'sign flips'})"
    return f"p = {p:.3g}"


def hover_lines(scores: dict[str, Any], metric: str) -> list[str] | None:
    """One hover line per head (row-major, as the figure's hover trace): SE, 95% CI and, for TR / TL, p, q and
    top-k stability; None when the result has no statistics for this map."""
    st = (scores.get("stats") or {}).get(metric)
    if not st:
        return None
    se, lo, hi = _grid(st.get("se")), _grid(st.get("ci_low")), _grid(st.get("ci_high"))
    p, q = _grid(st.get("p")), _grid(st.get("q"))
    stab = _grid((scores.get("stability") or {}).get(metric))
    # an anytime view's interval is normal (mean ± 1.96 SE over the prompts done); the final one a bootstrap
    ci = "95% normal CI so far" if scores.get("interval") == "normal" else "95% CI"
    out = []
    for (l, h), s in np.ndenumerate(se):
        if not np.isfinite(s):
            out.append(too_few(scores) or "no interval")
            continue
        line = f"SE {s:.3g} · {ci} [{lo[l, h]:.4g}, {hi[l, h]:.4g}]"
        if p is not None and q is not None and np.isfinite(p[l, h]):
            line += f"<br>{p_text(p[l, h], st, metric)} · q = {q[l, h]:.3g}"
        if stab is not None and np.isfinite(stab[l, h]):
            line += f"<br>in the top {scores.get('top_k')} in {100 * stab[l, h]:.0f}% of resamples"
        out.append(line)
    return out


def significant(scores: dict[str, Any], metric: str) -> list[tuple[int, int]] | None:
    """The map's heads with q <= the result's FDR, or None when the map has no test (or the result no stats)."""
    st = (scores.get("stats") or {}).get(metric) if metric in TESTED else None
    if not st or st.get("significant") is None:
        return None
    return [(int(l), int(h)) for l, h in st["significant"]]


def stable(scores: dict[str, Any], metric: str) -> list[tuple[int, int]]:
    """The map's stable top heads (top-k stability >= the result's `stable_at`)."""
    return [(int(l), int(h)) for l, h in scores.get(f"stable_{metric}") or []] if metric in TESTED else []


def annotate(fig: go.Figure, scores: dict[str, Any], metric: str, significant_only: bool = False) -> go.Figure:
    """Add the statistics to a `figures.head_heatmap` figure of `metric`: the hover lines, the stable top heads'
    outline, and (`significant_only`) the heatmap's cells of the heads that are not significant left blank."""
    lines = hover_lines(scores, metric)
    heads = next((t for t in fig.data if t.name == "heads"), None)
    if lines is not None and heads is not None:
        custom = [[*row, extra] for row, extra in zip(np.asarray(heads.customdata).tolist(), lines)]
        heads.customdata = custom
        heads.hovertemplate = heads.hovertemplate.replace("<extra></extra>", "<br>%{customdata[2]}<extra></extra>")
    sig = significant(scores, metric)
    heat = next((t for t in fig.data if t.type == "heatmap"), None)
    if significant_only and sig is not None and heat is not None:
        z = np.asarray(heat.z, dtype=float)
        keep = np.zeros(z.shape, dtype=bool)
        for l, h in sig:
            keep[l, h] = True
        heat.z = [[float(v) if k else None for v, k in zip(zr, kr)] for zr, kr in zip(z, keep)]
    tops = stable(scores, metric)
    if tops:
        size = max(4.0, float(np.max(heads.marker.size)) * 0.42) if heads is not None else 8.0
        fig.add_trace(go.Scatter(
            x=[h for _, h in tops], y=[l for l, _ in tops], mode="markers", showlegend=True, hoverinfo="skip",
            name=f"stable top heads (≥{100 * float(scores['stable_at']):.0f}% of resamples)",
            marker=dict(symbol="square-open", size=size, color=STABLE_COLOR, line=dict(width=2, color=STABLE_COLOR))))
    return fig


def caption(scores: dict[str, Any], metric: str, significant_only: bool) -> str:
    """What the statistics on the map mean, in a sentence or two ("" when the result has none)."""
    st = (scores.get("stats") or {}).get(metric)
    if not st:
        return ""
    if too_few(scores):
        return too_few(scores) + "."
    n = int(scores["prompts"])
    text = (f"Hover a head for its standard error and 95% bootstrap interval over the {n} prompts (1000 resamples of "
            f"the prompts, seeded)")
    sig = significant(scores, metric)
    if sig is not None:
        fdr = float(scores["fdr"])
        null = ("TR onto random label subspaces of the same size (frequency-matched vocabulary rows)" if metric == "tr"
                else "per-prompt TL centred on 0 (a sign-flip test)")
        text += (f", and its p against {null}, with the Benjamini-Hochberg q across all heads: **{len(sig)}** "
                 f"head{'s' if len(sig) != 1 else ''} significant at FDR {fdr:g}")
        if significant_only:
            text += " (the others left blank)"
        tops = {(int(l), int(h)) for l, h in scores.get(f"top_{metric}") or []}
        if tops:
            text += f"; **{len(tops & set(sig))}** of the top {len(tops)} are significant (q ≤ {fdr:g})"
        text += (f". White inner outline: the stable top heads, in the top {scores.get('top_k')} in at least "
                 f"{100 * float(scores['stable_at']):.0f}% of the resamples")
    return text + "."


def table_columns(scores: dict[str, Any]) -> dict[str, np.ndarray]:
    """The per-head table's extra columns, each (layers, heads): `<map>_se`, `<map>_ci_low`, `<map>_ci_high` of
    every map with statistics, `<map>_p`, `<map>_q` and `<map>_stability` of TR and TL ({} without statistics)."""
    out: dict[str, np.ndarray] = {}
    for name, st in (scores.get("stats") or {}).items():
        for field in ("se", "ci_low", "ci_high", "p", "q"):
            if st.get(field) is not None:
                out[f"{name}_{field}"] = np.asarray(st[field], dtype=float)
    for name, v in (scores.get("stability") or {}).items():
        out[f"{name}_stability"] = np.asarray(v, dtype=float)
    return out


STAT_FIELDS = ("se", "ci_low", "ci_high", "p", "q", "stability")


def stat_columns(metric: str, columns: Any) -> list[str]:
    """`metric`'s interval and test columns among `columns` (`table_columns`' names), in STAT_FIELDS' order."""
    return [c for c in (f"{metric}_{f}" for f in STAT_FIELDS) if c in columns]
