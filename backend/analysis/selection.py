"""Choosing heads from score maps, and comparing rankings."""
from __future__ import annotations

import math
import random

import numpy as np
from scipy import stats

Head = tuple[int, int]


def n_top(n_layers: int, n_heads: int, pct: float) -> int:
    """Number of heads in the top `pct` percent, at least 1."""
    return max(1, math.ceil(n_layers * n_heads * pct / 100.0 - 1e-9))


def top_heads(scores: np.ndarray, pct: float = 3.0, k: int | None = None) -> list[Head]:
    """Heads with the largest scores, best first; `k` overrides `pct`. scores: (layers, heads)."""
    L, H = scores.shape
    k = n_top(L, H, pct) if k is None else k
    flat = np.argsort(-scores, axis=None, kind="stable")[:k]
    return [(int(i // H), int(i % H)) for i in flat]


def random_heads(n_layers: int, n_heads: int, k: int, seed: int = 0) -> list[Head]:
    """A seeded random set of k distinct heads."""
    allh = [(l, h) for l in range(n_layers) for h in range(n_heads)]
    return random.Random(f"random-heads-{seed}").sample(allh, k)


def ranking(scores: np.ndarray) -> list[Head]:
    """All heads, best first."""
    return top_heads(scores, k=scores.size)


def overlap(a: np.ndarray, b: np.ndarray, pct: float = 3.0) -> dict[str, float]:
    """Jaccard of the top-pct sets, and Spearman / Kendall rank correlations over all heads."""
    ta, tb = set(top_heads(a, pct)), set(top_heads(b, pct))
    rho = stats.spearmanr(a.ravel(), b.ravel()).statistic
    tau = stats.kendalltau(a.ravel(), b.ravel()).statistic
    nan_to_none = lambda x: None if x is None or not np.isfinite(x) else float(x)  # noqa: E731
    return {"jaccard": len(ta & tb) / len(ta | tb), "spearman": nan_to_none(rho), "kendall": nan_to_none(tau)}
