"""Uncertainty and significance of per-head maps, from per-prompt values. Pure numpy (on `stats`).

x holds one map per prompt, (prompts, layers, heads); the map is its mean over prompts.
- Standard error: sd(x, ddof 1) / sqrt(prompts) per head (`stats.stderr`).
- 95% interval: percentile bootstrap of the mean, resampling prompts (seeded). Several seeds (`groups`: each
  prompt's seed): the prompts of all seeds are pooled into one mean, and a resample draws each seed's prompts from
  that seed's own (a stratified bootstrap: every resample keeps each seed's share). One group: `stats.bootstrap_ci`.
- While prompts are still being scored (an anytime map): SE as above and a normal interval mean +- z SE
  (`normal_interval`: no bootstrap per view; it narrows as prompts finish). The final result's interval is the
  bootstrap's.
- Top-k stability: the share of the same resamples in which a head is among the top k by mean.
- TR significance: the head's mean TR against the means of TR onto random label subspaces of the same size
  (`tr_null`), a one-sided Monte Carlo p; TL significance: per-prompt TL > 0 by a one-sided sign-flip permutation
  test (`stats.sign_flip_p`). Either map's p-values are corrected across all heads by Benjamini-Hochberg (q).
- Under `stats.MIN_PROMPTS` prompts: SE, interval, stability, p and q are NaN and no head is significant (None).
"""
from __future__ import annotations

from statistics import NormalDist

import numpy as np

from .stats import LEVEL, MIN_PROMPTS, N_BOOT, benjamini_hochberg, permutation_p, resample_counts, sign_flip_p, stderr, top_k_share

FDR = 0.05  # a head is significant where q <= FDR
STABLE_AT = 0.8  # a top head is stable where it is in the top k in at least this share of resamples

Head = tuple[int, int]


def counts(n: int, groups: np.ndarray | None = None, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """(n_boot, n) bootstrap counts of n prompts: multinomial over all of them, or within each group (seed) when
    `groups` (n,) is given (a stratified bootstrap)."""
    if groups is None or len(np.unique(groups)) <= 1:
        return resample_counts(n, n_boot, seed)
    groups = np.asarray(groups)
    rng = np.random.default_rng(seed)
    out = np.zeros((n_boot, n))
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        out[:, idx] = rng.multinomial(len(idx), np.full(len(idx), 1.0 / len(idx)), size=n_boot)
    return out


def boot_means(x: np.ndarray, groups: np.ndarray | None = None, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """(n_boot, ...) means of x (prompts, ...) over prompt resamples (`counts`)."""
    x = np.asarray(x, dtype=float)
    n = x.shape[0]
    return (counts(n, groups, n_boot, seed) @ x.reshape(n, -1) / n).reshape(n_boot, *x.shape[1:])


def uncertainty(x: np.ndarray, groups: np.ndarray | None = None, n_boot: int = N_BOOT, seed: int = 0,
                level: float = LEVEL) -> dict[str, np.ndarray]:
    """{se, ci_low, ci_high} of the mean map of x (prompts, layers, heads), each (layers, heads)."""
    x = np.asarray(x, dtype=float)
    a = (1 - level) / 2
    if x.shape[0] < MIN_PROMPTS:
        nan = np.full(x.shape[1:], np.nan)
        return {"se": nan, "ci_low": nan, "ci_high": nan}
    means = boot_means(x, groups, n_boot, seed)
    return {"se": stderr(x), "ci_low": np.quantile(means, a, axis=0), "ci_high": np.quantile(means, 1 - a, axis=0)}


def normal_interval(x: np.ndarray, mean: np.ndarray | None = None, level: float = LEVEL) -> dict[str, np.ndarray]:
    """{se, ci_low, ci_high} of the mean map of x (prompts, layers, heads), each (layers, heads): SE as
    `uncertainty`'s, the interval mean +- z SE (normal approximation; z = 1.96 at 95%) around `mean` (default: x's
    mean over prompts). Cheap enough for every anytime view; NaN under 2 prompts."""
    x = np.asarray(x, dtype=float)
    se = stderr(x)
    m = np.asarray(mean, dtype=float) if mean is not None else (x.mean(axis=0) if len(x) else se)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    return {"se": se, "ci_low": m - z * se, "ci_high": m + z * se}


def stability(x: np.ndarray, k: int, groups: np.ndarray | None = None, n_boot: int = N_BOOT,
              seed: int = 0) -> np.ndarray:
    """The share of bootstrap resamples (the same ones as `uncertainty`'s) in which each head is among the top k
    by mean: x (prompts, layers, heads) -> (layers, heads) in [0, 1]; NaN under MIN_PROMPTS prompts."""
    if len(x) < MIN_PROMPTS:
        return np.full(np.shape(x)[1:], np.nan)
    return top_k_share(boot_means(np.asarray(x, dtype=float), groups, n_boot, seed), k)


def tr_p(tr_mean: np.ndarray, null_means: np.ndarray) -> np.ndarray:
    """One-sided Monte Carlo p of each head's mean TR (layers, heads) against its mean TR onto R random label
    subspaces of the same size, null_means (R, layers, heads): (1 + #{null >= observed}) / (1 + R_h), R_h the head's
    draws (NaN: a draw a head did not take, `tr_null.sequential_null`)."""
    null = np.asarray(null_means, dtype=float)
    taken = np.isfinite(null)
    if taken.all():
        return permutation_p(tr_mean, null, "greater")
    p = permutation_p(tr_mean, np.where(taken, null, -np.inf), "greater")  # a draw not taken never exceeds
    return p * (1 + null.shape[0]) / (1 + taken.sum(0))


def tl_p(tl: np.ndarray, seed: int = 0) -> np.ndarray:
    """One-sided sign-flip p of mean TL > 0 per head, tl (prompts, layers, heads) -> (layers, heads)."""
    return sign_flip_p(tl, "greater", seed=seed)


def significant(q: np.ndarray, alpha: float = FDR) -> list[Head]:
    """The heads with q <= alpha, by q then position."""
    q = np.asarray(q, dtype=float)
    ok = np.argwhere(np.nan_to_num(q, nan=2.0) <= alpha)
    return sorted(((int(l), int(h)) for l, h in ok), key=lambda lh: (q[lh], lh))


def stable(stab: np.ndarray, at: float = STABLE_AT) -> list[Head]:
    """The heads in the top k in at least `at` of the resamples, most stable first."""
    stab = np.asarray(stab, dtype=float)
    return sorted(((int(l), int(h)) for l, h in np.argwhere(stab >= at)), key=lambda lh: (-stab[lh], lh))


def significance(p: np.ndarray, n: int, alpha: float = FDR) -> dict[str, object]:
    """{p, q, significant}: the p-values, their Benjamini-Hochberg q across all heads, and the heads with
    q <= alpha; on n < MIN_PROMPTS prompts no test: p and q NaN, significant None."""
    if n < MIN_PROMPTS:
        return {"p": np.full(np.shape(p), np.nan), "q": np.full(np.shape(p), np.nan), "significant": None}
    q = benjamini_hochberg(p)
    return {"p": p, "q": q, "significant": significant(q, alpha)}
