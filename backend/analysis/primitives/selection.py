"""Choosing heads from score maps, and comparing rankings."""
from __future__ import annotations

import math
import random
from typing import Iterable, Sequence

import numpy as np

from .options import MIN_TOP_HEADS, TOP_PCT

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


def random_heads(n_layers: int, n_heads: int, k: int, seed: int = 0, exclude: "Iterable[Head] | None" = None, *,
                 draw: int = 0, pool: "Sequence[Head] | None" = None) -> list[Head]:
    """The random control set of every kind: a seeded draw of k distinct heads from `pool` (default: every head)
    outside `exclude` (the top sets it is compared with), so it is disjoint from them. When fewer than k heads are
    outside, all of those come first and the rest is drawn from `exclude` (a random order over all heads, the
    ablation curves' random order, starts with the heads outside it). `draw` numbers several sets of one seed."""
    cand = list(pool) if pool is not None else [(l, h) for l in range(n_layers) for h in range(n_heads)]
    out = set(exclude or ())
    rest = [x for x in cand if x not in out]
    rng = random.Random(f"random-heads-{seed}" + (f"-{draw}" if draw else ""))
    if len(rest) >= k:
        return rng.sample(rest, k)
    return rng.sample(rest, len(rest)) + rng.sample([x for x in cand if x in out], min(k, len(cand)) - len(rest))


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
