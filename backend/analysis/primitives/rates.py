"""Intervals and paired tests of the three rates (accuracy, label accuracy, TR ratio) from per-prompt outcomes.

A rate is the mean of a per-prompt 0/1 outcome: accuracy of `correct`, label accuracy of `label_correct`, the TR
ratio of `in_labels` (`predict`). From `predict.Outcomes` (configs, prompts), with no extra forward pass:
- a configuration's rate gets a 95% Wilson interval (independent prompts);
- a mean over random head sets gets a two-level bootstrap interval (sets and prompts resampled, `stats.set_mean_ci`);
- two configurations on the same prompts get a paired test (`stats.paired_comparisons`): the effect mean(a - b),
  its bootstrap interval and p (exact McNemar for 0/1 arms; sign flips when an arm is a mean over random sets).
Plain dicts out; the kinds' result models read them (`results.PairedTest`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .predict import Outcomes
from .stats import paired_comparisons, rate_ci, rate_ci_of, set_mean_ci, unpack_outcomes

RATE_OUTCOME = {"accuracy": "correct", "label_accuracy": "label_correct", "tr_ratio": "in_labels"}


def config_outcomes(out: Outcomes, c: int | Sequence[int]) -> dict[str, np.ndarray]:
    """{rate: (prompts,) float} of configuration c; several configurations: their mean per prompt (a random
    baseline's per-prompt rate over its sets)."""
    idx = [c] if isinstance(c, (int, np.integer)) else list(c)
    return {r: getattr(out, o)[idx].astype(float).mean(0) for r, o in RATE_OUTCOME.items()}


def metrics_outcomes(m: Any) -> dict[str, np.ndarray] | None:
    """{rate: (prompts,) float} from a metrics dict or `Metrics` with `per_prompt`; None when it has none."""
    code = m.get("per_prompt") if isinstance(m, dict) else getattr(m, "per_prompt", None)
    if not code:
        return None
    u = unpack_outcomes(code)
    return {r: u[o].astype(float) for r, o in RATE_OUTCOME.items()}


def curve_intervals(out: Outcomes, configs: Sequence[int]) -> dict[str, list[tuple[float, float]]]:
    """{"<rate>_ci": [(lo, hi) per configuration]}: 95% Wilson intervals."""
    return {f"{r}_ci": [rate_ci(getattr(out, o)[c]) for c in configs] for r, o in RATE_OUTCOME.items()}


def set_curve_intervals(out: Outcomes, rows: Sequence[Sequence[int]], seed: int = 0) -> dict[str, list]:
    """{"<rate>_ci": [(lo, hi) per point]} of a mean over random sets: rows[s][j] is set s's configuration at
    point j; each interval resamples the sets and the prompts (`stats.set_mean_ci`), widened where needed to the
    Wilson interval of the mean rate on as many prompts (a bootstrap of 0/1 outcomes all equal has zero width; the
    baseline is never surer than one set of the same rate)."""
    idx = np.asarray(rows, dtype=np.int64)  # (sets, points)
    res = {}
    for r, o in RATE_OUTCOME.items():
        x = getattr(out, o)[idx].astype(float).transpose(0, 2, 1)  # (sets, prompts, points)
        lo, hi = set_mean_ci(x, seed=seed)
        n = x.shape[1]
        w = [rate_ci_of(m, n) for m in x.mean((0, 1))]
        res[f"{r}_ci"] = [(min(float(a), wl), max(float(b), wh)) for a, b, (wl, wh) in zip(lo, hi, w)]
    return res


def paired_rates(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """{rate: paired test of a against b} for per-prompt arms {rate: (prompts,)} on the same prompts."""
    names = [r for r in RATE_OUTCOME if r in a and r in b]
    tests = paired_comparisons(np.column_stack([a[r] for r in names]), np.column_stack([b[r] for r in names]))
    return dict(zip(names, tests))


def paired_along(arms_a: Sequence[dict[str, np.ndarray]], arms_b: Sequence[dict[str, np.ndarray]]
                 ) -> dict[str, list[dict[str, Any]]]:
    """{rate: [paired test of arms_a[j] against arms_b[j] per point j]}: a curve against another, point by point,
    in one vectorised call per rate."""
    res = {}
    for r in RATE_OUTCOME:
        res[r] = paired_comparisons(np.column_stack([a[r] for a in arms_a]),
                                    np.column_stack([b[r] for b in arms_b])) if len(arms_a) else []
    return res


def paired_metrics(a: Any, b: Any) -> dict[str, dict[str, Any]] | None:
    """Paired tests of two metrics (dicts or `Metrics`) that kept their outcomes on the same prompts; None when
    either did not, or they hold different numbers of prompts."""
    oa, ob = metrics_outcomes(a), metrics_outcomes(b)
    if oa is None or ob is None or len(oa["accuracy"]) != len(ob["accuracy"]):
        return None
    return paired_rates(oa, ob)
