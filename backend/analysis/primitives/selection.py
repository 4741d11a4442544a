"""Choosing heads from score maps, and comparing rankings."""
from __future__ import annotations

import math
import random

import numpy as np

from ...options import MIN_TOP_HEADS, TOP_PCT

Head = tuple[int, int]


def n_top(n_layers: int, n_heads: int, pct: float = TOP_PCT, k: int | None = None) -> int:
    """Size of a top-head set: `k` when given (capped at all heads), else the top `pct` percent of the
    heads, and never fewer than MIN_TOP_HEADS (or all heads, when the model has fewer)."""
    total = n_layers * n_heads
    if k is not None:
        return min(int(k), total)
    return min(total, max(MIN_TOP_HEADS, math.ceil(total * pct / 100.0 - 1e-9)))


def top_heads(scores: np.ndarray, pct: float = TOP_PCT, k: int | None = None) -> list[Head]:
    """Heads with the largest scores, best first; `k` overrides `pct` (see `n_top`). scores: (layers, heads)."""
    L, H = scores.shape
    k = n_top(L, H, pct, k)
    flat = np.argsort(-scores, axis=None, kind="stable")[:k]
    return [(int(i // H), int(i % H)) for i in flat]


def random_heads(n_layers: int, n_heads: int, k: int, seed: int = 0, exclude: "set[Head] | None" = None) -> list[Head]:
    """A seeded random set of k distinct heads, drawn from the heads not in `exclude` (a control set disjoint
    from the top heads) when at least k remain, else from all heads."""
    allh = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    rest = [x for x in allh if x not in (exclude or set())]
    return random.Random(f"random-heads-{seed}").sample(rest if len(rest) >= k else allh, k)


def ranking(scores: np.ndarray) -> list[Head]:
    """All heads, best first."""
    return top_heads(scores, k=scores.size)


def overlap(a: np.ndarray, b: np.ndarray, k: int) -> dict[str, float | None]:
    """Jaccard of the top-k sets, and Spearman / Kendall rank correlations over all heads."""
    from scipy import stats  # imported on first use: scipy.stats takes a second, and the CLI imports every kind

    ta, tb = set(top_heads(a, k=k)), set(top_heads(b, k=k))
    rho = stats.spearmanr(a.ravel(), b.ravel()).statistic
    tau = stats.kendalltau(a.ravel(), b.ravel()).statistic
    nan_to_none = lambda x: None if x is None or not np.isfinite(x) else float(x)  # noqa: E731
    return {"jaccard": len(ta & tb) / len(ta | tb), "spearman": nan_to_none(rho), "kendall": nan_to_none(tau)}
