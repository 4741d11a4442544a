"""Statistics on per-prompt numbers: intervals, paired tests, permutation p-values and the false discovery rate.
Pure numpy (and scipy's distributions); no torch, no I/O.

Conventions, everywhere:
- `x` holds one value per prompt on axis 0, e.g. per-prompt TR (prompts, layers, heads); the rest of the shape is
  carried through, so one call gives every head its interval or p-value.
- Resampling is seeded (`np.random.default_rng(seed)`): the same call gives the same numbers.
- Intervals are two-sided at `level` (default 0.95). Bootstrap intervals are percentile intervals over `n_boot`
  resamples of the prompts (with replacement), drawn as multinomial counts so a resample costs one matrix product:
  means (n_boot, ...) = counts (n_boot, prompts) @ x (prompts, ...) / prompts.
- A p-value is never 0: a Monte Carlo p is (1 + #{null at least as extreme}) / (1 + draws).
- Under MIN_PROMPTS prompts there is no standard error, interval or test: NaN (null in JSON), never a p
  (`too_few` says so in a result's warnings).
"""
from __future__ import annotations

import math
from itertools import product
from typing import Literal

import numpy as np
from scipy import stats as _st

Alternative = Literal["two-sided", "greater", "less"]
LEVEL = 0.95
N_BOOT = 1000
N_PERM = 10_000
MIN_PROMPTS = 2


def too_few(n: int) -> str | None:
    """The warning of a result on fewer than MIN_PROMPTS prompts ("1 prompt: no interval and no test ..."), else
    None."""
    if n >= MIN_PROMPTS:
        return None
    return f"{n} prompt{'s' if n != 1 else ''}: no interval and no test (they need {MIN_PROMPTS} prompts or more)"


def _z(level: float) -> float:
    return float(_st.norm.ppf(0.5 + level / 2))


def wilson(k: np.ndarray | int, n: np.ndarray | int, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval of a rate k / n (elementwise): the interval of choice for a proportion on few prompts
    (it stays inside [0, 1] and is not degenerate at 0 or n). n = 0 gives (0, 1)."""
    k, n = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
    z = _z(level)
    safe = np.where(n > 0, n, 1.0)
    p = k / safe
    denom = 1 + z * z / safe
    centre = (p + z * z / (2 * safe)) / denom
    half = z * np.sqrt(p * (1 - p) / safe + z * z / (4 * safe * safe)) / denom
    lo, hi = np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)
    lo, hi = np.where(k <= 0, 0.0, lo), np.where(k >= n, 1.0, hi)  # exact at the edges (no 1e-17 from rounding)
    return np.where(n > 0, lo, 0.0), np.where(n > 0, hi, 1.0)


def stderr(x: np.ndarray) -> np.ndarray:
    """Standard error of the mean over axis 0 (sample sd with ddof 1, / sqrt(prompts)); NaN under 2 prompts."""
    x = np.asarray(x, dtype=float)
    n = x.shape[0]
    if n < MIN_PROMPTS:
        return np.full(x.shape[1:], np.nan)
    return x.std(axis=0, ddof=1) / math.sqrt(n)


def resample_counts(n: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """(n_boot, n) multinomial counts: how often each of n prompts is drawn in each bootstrap resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(float)


def bootstrap_means(x: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """(n_boot, ...) means of x over prompt resamples (x: (prompts, ...))."""
    x = np.asarray(x, dtype=float)
    n = x.shape[0]
    counts = resample_counts(n, n_boot, seed)
    return (counts @ x.reshape(n, -1) / n).reshape(n_boot, *x.shape[1:])


def bootstrap_ci(x: np.ndarray, n_boot: int = N_BOOT, seed: int = 0,
                 level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of the mean over axis 0, per trailing element: (lo, hi), each x.shape[1:];
    NaN under MIN_PROMPTS prompts (resampling one prompt gives it back: a zero-width interval)."""
    x = np.asarray(x, dtype=float)
    if x.shape[0] < MIN_PROMPTS:
        return np.full(x.shape[1:], np.nan), np.full(x.shape[1:], np.nan)
    means = bootstrap_means(x, n_boot, seed)
    a = (1 - level) / 2
    return np.quantile(means, a, axis=0), np.quantile(means, 1 - a, axis=0)


def topk_stability(x: np.ndarray, k: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """The share of bootstrap resamples of the prompts in which each head is among the top k by mean.
    x: (prompts, layers, heads) -> (layers, heads) in [0, 1]."""
    return top_k_share(bootstrap_means(np.asarray(x, dtype=float), n_boot, seed), k)


def top_k_share(means: np.ndarray, k: int) -> np.ndarray:
    """The share of resamples in which each head is among the top k: means (resamples, layers, heads) ->
    (layers, heads) in [0, 1]."""
    n = means.shape[0]
    flat = means.reshape(n, -1)
    k = max(0, min(int(k), flat.shape[1]))
    hits = np.zeros(flat.shape[1])
    if k:
        top = np.argpartition(-flat, k - 1, axis=1)[:, :k]
        np.add.at(hits, top.ravel(), 1.0)
    return (hits / n).reshape(means.shape[1:])


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (q-values), same shape as p: reject at FDR alpha where q <= alpha.
    q_(i) = min_{j >= i} p_(j) m / j over the sorted p, capped at 1. NaN entries are left out and stay NaN."""
    p = np.asarray(p, dtype=float)
    flat = p.ravel()
    ok = ~np.isnan(flat)
    q = np.full(flat.shape, np.nan)
    vals = flat[ok]
    m = vals.size
    if m:
        order = np.argsort(vals, kind="stable")
        ranked = vals[order] * m / np.arange(1, m + 1)
        ranked = np.minimum.accumulate(ranked[::-1])[::-1]
        out = np.empty(m)
        out[order] = np.minimum(ranked, 1.0)
        q[ok] = out
    return q.reshape(p.shape)


def _exceed(null: np.ndarray, obs: np.ndarray, alternative: Alternative) -> np.ndarray:
    """Per element, how many rows of null (draws, ...) are at least as extreme as obs (...); ties count."""
    scale = np.maximum(np.abs(obs), 1.0) * 1e-12  # float ties (e.g. identical arms) count as at least as extreme
    if alternative == "greater":
        return (null >= obs - scale).sum(axis=0)
    if alternative == "less":
        return (null <= obs + scale).sum(axis=0)
    return (np.abs(null) >= np.abs(obs) - scale).sum(axis=0)


def sign_flips(n: int, n_perm: int = N_PERM) -> tuple[int, float]:
    """(sign vectors, the smallest p) of `sign_flip_p` on n prompts: all 2^n (p >= 2^-n), or n_perm seeded draws
    (p >= 1 / (1 + n_perm))."""
    return (2 ** n, 2.0 ** -n) if n <= 20 and 2 ** n <= n_perm else (n_perm, 1 / (1 + n_perm))


def sign_flip_p(d: np.ndarray, alternative: Alternative = "two-sided", n_perm: int = N_PERM,
                seed: int = 0) -> np.ndarray:
    """Paired / one-sample permutation test of mean(d) = 0 by flipping the signs of the per-prompt values
    d (prompts, ...): exact (every sign vector) when 2^prompts <= n_perm, else n_perm seeded draws.
    All-zero d (identical arms) gives p = 1."""
    d = np.asarray(d, dtype=float)
    n = d.shape[0]
    flat = d.reshape(n, -1)
    obs = flat.mean(axis=0)
    if n == 0:
        return np.ones(d.shape[1:])
    exact = n <= 20 and 2 ** n <= n_perm  # as `sign_flips` says
    if exact:
        signs = np.array(list(product((1.0, -1.0), repeat=n)))
    else:
        signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(n_perm, n))
    null = signs @ flat / n
    hits = _exceed(null, obs, alternative)
    p = hits / len(signs) if exact else (1 + hits) / (1 + len(signs))
    return np.minimum(p, 1.0).reshape(d.shape[1:])


def permutation_p(observed: np.ndarray, null: np.ndarray, alternative: Alternative = "greater") -> np.ndarray:
    """Monte Carlo p of `observed` (...) against null draws (draws, ...): (1 + #{null at least as extreme}) /
    (1 + draws)."""
    observed, null = np.asarray(observed, dtype=float), np.asarray(null, dtype=float)
    return (1 + _exceed(null, observed, alternative)) / (1 + null.shape[0])


def mcnemar_p(a: np.ndarray, b: np.ndarray) -> float:
    """Exact McNemar test of two paired 0/1 outcomes on the same prompts (two-sided binomial on the discordant
    pairs); 1.0 when no pair is discordant."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    n01, n10 = int((~a & b).sum()), int((a & ~b).sum())
    if n01 + n10 == 0:
        return 1.0
    return float(_st.binomtest(n10, n01 + n10, 0.5).pvalue)


def paired_comparison(a: np.ndarray, b: np.ndarray, n_boot: int = N_BOOT, seed: int = 0,
                      level: float = LEVEL) -> dict[str, float | int | str]:
    """Arm a against arm b on the same prompts (a, b: (prompts,) per-prompt values, e.g. 0/1 correct): the effect
    mean(a - b), its bootstrap interval, and a two-sided p (exact McNemar for 0/1 outcomes, else a sign-flip test).
    Identical arms give effect 0 and p = 1; under MIN_PROMPTS prompts the interval and p are NaN (no test)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired arms need one value per prompt each, of the same length (got {a.shape}, {b.shape})")
    d = a - b
    binary = bool(np.isin(a, (0.0, 1.0)).all() and np.isin(b, (0.0, 1.0)).all())
    lo, hi = bootstrap_ci(d, n_boot, seed, level)
    p = mcnemar_p(a, b) if binary else float(sign_flip_p(d, "two-sided", seed=seed))
    p = p if len(d) >= MIN_PROMPTS else float("nan")
    return {"effect": float(d.mean()) if len(d) else float("nan"), "ci_low": float(lo), "ci_high": float(hi),
            "p": p, "n": int(len(d)), "test": "exact McNemar" if binary else "sign-flip permutation"}


def noise_floor(n: int, level: float = LEVEL) -> float:
    """The half-width of a rate's interval at its widest (p = 0.5) on n prompts: differences of a rate smaller
    than this are within noise (30 prompts: about 0.18)."""
    return _z(level) * 0.5 / math.sqrt(max(n, 1))


def detectable_difference(n: int, sd: float = 0.5, alpha: float = 0.05, power: float = 0.8,
                          paired: bool = True) -> float:
    """The smallest true difference of means a two-sided test at `alpha` detects with probability `power` on n
    prompts: (z_{1-alpha/2} + z_power) sd sqrt(k / n), k = 1 for a paired difference of per-prompt sd `sd`,
    2 for two independent arms (sd 0.5 is a rate's worst case)."""
    z = _z(1 - alpha) + float(_st.norm.ppf(power))
    return z * sd * math.sqrt((1 if paired else 2) / max(n, 1))


def rate_ci(x: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """Wilson interval of the rate of per-prompt 0/1 outcomes x (prompts,): the interval of independent prompts."""
    x = np.asarray(x, dtype=float)
    lo, hi = wilson(float(x.sum()), x.size, level)
    return float(lo), float(hi)


def rate_ci_of(rate: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson interval of a rate already reduced to its value and count (k = round(rate n) successes of n)."""
    lo, hi = wilson(round(float(rate) * n), n, level)
    return float(lo), float(hi)


def set_mean_ci(x: np.ndarray, n_boot: int = N_BOOT, seed: int = 0,
                level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """Interval of a mean over random sets and prompts, x (sets, prompts, ...): a two-level percentile bootstrap
    that resamples the sets and the prompts (both with replacement), so the interval holds the spread between
    random sets as well as the prompts' noise. One set: the prompts' bootstrap alone. Returns (lo, hi), each
    x.shape[2:]. Each resample b's mean is w_b (sets,) X c_b (prompts,) / (sets prompts)."""
    x = np.asarray(x, dtype=float)
    s, n = x.shape[:2]
    flat = x.reshape(s, n, -1)
    rng = np.random.default_rng(seed)
    w = rng.multinomial(s, np.full(s, 1.0 / s), size=n_boot).astype(float) if s > 1 else np.ones((n_boot, 1))
    c = resample_counts(n, n_boot, seed + 1)
    means = np.einsum("bs,snm,bn->bm", w, flat, c) / (s * n)
    a = (1 - level) / 2
    lo, hi = np.quantile(means, a, axis=0), np.quantile(means, 1 - a, axis=0)
    return lo.reshape(x.shape[2:]), hi.reshape(x.shape[2:])


def paired_comparisons(a: np.ndarray, b: np.ndarray, n_boot: int = N_BOOT, seed: int = 0,
                       level: float = LEVEL) -> list[dict[str, float | int | str]]:
    """`paired_comparison` of each column: a, b (prompts, m) on the same prompts -> m results (arm a minus arm b),
    the bootstrap and the sign flips drawn once for all columns (the same numbers as one call per column)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"paired arms need (prompts, comparisons) values each, of the same shape (got {a.shape}, "
                         f"{b.shape})")
    n, m = a.shape
    if m == 0:
        return []
    if n < MIN_PROMPTS:
        return [paired_comparison(a[:, j], b[:, j], n_boot, seed, level) for j in range(m)]
    d = a - b
    lo, hi = bootstrap_ci(d, n_boot, seed, level)
    binary = np.isin(a, (0.0, 1.0)).all(0) & np.isin(b, (0.0, 1.0)).all(0)
    flip = sign_flip_p(d[:, ~binary], "two-sided", seed=seed) if (~binary).any() else np.empty(0)
    out, fi = [], 0
    for j in range(m):
        if binary[j]:
            p, test = mcnemar_p(a[:, j], b[:, j]), "exact McNemar"
        else:
            p, test = float(flip[fi]), "sign-flip permutation"
            fi += 1
        out.append({"effect": float(d[:, j].mean()), "ci_low": float(lo[j]), "ci_high": float(hi[j]), "p": p,
                    "n": int(n), "test": test})
    return out


def noise_sentence(n: int, level: float = LEVEL) -> str:
    """One plain sentence on what n prompts can tell apart: "30 prompts: differences under about 0.18 are within
    noise" (the widest rate interval's half-width, `noise_floor`)."""
    return f"{n} prompt{'s' if n != 1 else ''}: differences under about {noise_floor(n, level):.2f} are within noise"


def pack_outcomes(correct: np.ndarray, label_correct: np.ndarray, in_labels: np.ndarray) -> str:
    """Per-prompt 0/1 outcomes (prompts,) each as one digit per prompt: 1 correct + 2 label_correct + 4 in_labels."""
    code = (np.asarray(correct, dtype=np.int64) + 2 * np.asarray(label_correct, dtype=np.int64)
            + 4 * np.asarray(in_labels, dtype=np.int64))
    return "".join(str(int(c)) for c in code)


def unpack_outcomes(code: str) -> dict[str, np.ndarray]:
    """`pack_outcomes` undone: {correct, label_correct, in_labels}, each (prompts,) bool."""
    v = np.array([int(c) for c in code], dtype=np.int64)
    return {"correct": (v & 1) > 0, "label_correct": (v & 2) > 0, "in_labels": (v & 4) > 0}
