"""The findings' statistics: one test per task (and k), corrected across the tasks, and the rule that turns the
per-task outcomes into holds / partly / does not hold. Pure numpy on per-prompt numbers (no torch, no I/O).

A per-task test is a dict {task, k, test, effect, ci, p, direction, n, sd, parts}: `effect` is the measured difference
in the finding's units (e.g. TR ratio after top-k ablation minus after random ablation), `ci` its 95% interval,
`p` a two-sided p-value (one-sided where the hypothesis is one-sided, e.g. non-inferiority), `direction` +1 or -1,
the sign the paper's finding predicts, `n` the prompts (or heads) it rests on and `sd` the per-unit standard
deviation of the compared quantity (for the detectable difference). A composite finding ("lowers accuracy AND keeps
the TR ratio") is an intersection-union test: every part significant in its direction; its p is the largest part's
(a level-alpha test of the conjunction), and its effect and interval are its main (first) part's.

The rule (`RULE`), applied by `decide` to the tests of one finding on one model after `correct`:
- a task is **for** the finding when its test is significant (BH-adjusted q < 0.05) in the paper's direction,
  **against** when significant the other way;
- **holds**: for on at least 2/3 of the tasks tested and against on none; **partly**: for on at least one task;
  **does not hold**: for on none.
"""
from __future__ import annotations

import math
from itertools import permutations
from typing import Any, Sequence

import numpy as np
from scipy import stats as _st

from ..primitives.stats import (benjamini_hochberg, bootstrap_ci, detectable_difference, paired_comparison,
                                sign_flip_p, wilson)

ALPHA = 0.05
SHARE = 2 / 3
RULE = ("Each finding is tested per task (and per k where a finding has several), and the p-values of one finding on "
        "one model are corrected together by Benjamini-Hochberg (false discovery rate 0.05 across its tasks and ks). "
        "A task is *for* the finding when its adjusted q < 0.05 with the effect in the paper's direction (at some k), "
        "*against* when q < 0.05 the other way. **holds**: for on at least 2/3 of the tasks tested and against on "
        "none; **partly**: for on at least one task; **does not hold**: for on none. A composite finding (\"lowers "
        "accuracy and keeps the TR ratio\") needs every part significant in its direction (intersection-union: its p "
        "is the largest part's). Effects are given with their 95% interval; \"detectable\" is the smallest true "
        "effect the sample finds with 80% power at alpha = 0.05 (two-sided, before the correction).")


# -- per-task tests ---------------------------------------------------------------------------------------------------

def _sd(d: np.ndarray) -> float:
    d = np.asarray(d, float)
    return float(d.std(ddof=1)) if d.size > 1 else float("nan")


def paired(a: np.ndarray, b: np.ndarray, direction: int, test: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Arm a against arm b on the same prompts (a, b: (prompts,)): effect mean(a - b) with its bootstrap interval;
    exact McNemar when both are 0/1, else a sign-flip permutation test (`stats.paired_comparison`)."""
    r = paired_comparison(a, b, seed=seed)
    return {"test": test or f"paired, {r['test']}", "effect": r["effect"], "ci": [r["ci_low"], r["ci_high"]],
            "p": float(r["p"]), "direction": direction, "n": r["n"], "sd": _sd(np.asarray(a, float) - b)}


def noninferior(a: np.ndarray, b: np.ndarray, margin: float, seed: int = 0) -> dict[str, Any]:
    """Non-inferiority of a to b on the same prompts: H0 mean(a - b) <= -margin against mean(a - b) > -margin, by a
    one-sided sign-flip test of d + margin (d = a - b); effect mean(d) with its bootstrap interval. Significant
    (p < 0.05) means a is at most `margin` below b, with 95% confidence."""
    d = np.asarray(a, float) - np.asarray(b, float)
    lo, hi = bootstrap_ci(d, seed=seed)
    p = float(sign_flip_p(d + margin, "greater", seed=seed)) if d.size else 1.0
    return {"test": f"non-inferiority (margin {margin:.2f}), one-sided sign-flip", "effect": float(d.mean()),
            "ci": [float(lo), float(hi)], "p": p, "direction": +1, "n": int(d.size), "sd": _sd(d), "one_sided": True}


def welch(m1: float, s1: float, n1: int, m2: float, s2: float, n2: int, direction: int,
          test: str = "Welch t-test (unpaired)") -> dict[str, Any]:
    """Two means from their summaries (mean, sample sd, n): effect m1 - m2, its 95% Welch interval and two-sided p."""
    v = s1 * s1 / max(n1, 1) + s2 * s2 / max(n2, 1)
    eff = m1 - m2
    if v <= 0 or n1 < 2 or n2 < 2:
        return {"test": test, "effect": eff, "ci": [eff, eff], "p": 1.0 if eff == 0 else 0.0 if v <= 0 and n1 > 1
                and n2 > 1 else 1.0, "direction": direction, "n": min(n1, n2), "sd": math.sqrt(max(s1 * s1 + s2 * s2, 0) / 2)}
    df = v * v / ((s1 * s1 / n1) ** 2 / (n1 - 1) + (s2 * s2 / n2) ** 2 / (n2 - 1))
    se = math.sqrt(v)
    t = float(_st.t.ppf(0.975, df))
    return {"test": test, "effect": eff, "ci": [eff - t * se, eff + t * se],
            "p": float(2 * _st.t.sf(abs(eff) / se, df)), "direction": direction, "n": min(n1, n2),
            "sd": math.sqrt((s1 * s1 + s2 * s2) / 2)}


def pooled_summary(parts: Sequence[tuple[float, float, int]]) -> tuple[float, float, int]:
    """(mean, sample sd, n) of the union of groups given as (mean, population sd, n) each (seeds pooled)."""
    n = sum(p[2] for p in parts)
    if not n:
        return float("nan"), float("nan"), 0
    m = sum(p[0] * p[2] for p in parts) / n
    ss = sum(p[2] * (p[1] ** 2 + (p[0] - m) ** 2) for p in parts)
    return m, math.sqrt(ss / (n - 1)) if n > 1 else 0.0, n


def two_proportions(k1: int, n1: int, k2: int, n2: int, direction: int,
                    test: str = "Fisher exact (unpaired)") -> dict[str, Any]:
    """Two rates on different prompts: effect k1/n1 - k2/n2 with Newcombe's hybrid score interval (from the two
    Wilson intervals) and Fisher's exact two-sided p."""
    p1, p2 = k1 / max(n1, 1), k2 / max(n2, 1)
    l1, u1 = (float(x) for x in wilson(k1, n1))
    l2, u2 = (float(x) for x in wilson(k2, n2))
    d = p1 - p2
    lo = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    hi = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    p = float(_st.fisher_exact([[k1, n1 - k1], [k2, n2 - k2]]).pvalue) if n1 and n2 else 1.0
    return {"test": test, "effect": d, "ci": [lo, hi], "p": p, "direction": direction, "n": min(n1, n2), "sd": 0.5,
            "unpaired": True}


def head_sets(score: np.ndarray, set_a: Sequence[Sequence[int]], set_b: Sequence[Sequence[int]], direction: int,
              n_perm: int = 10_000, seed: int = 0) -> dict[str, Any]:
    """Do the heads of set a score higher than those of set b on a map (e.g. the induction map, top-TR vs top-TL)?
    Effect: mean score over a's heads minus over b's; p: two-sided permutation of the set labels over the pooled
    heads (a head in both sets is in both samples); interval: percentile bootstrap of the heads within each set."""
    s = np.asarray(score, float)
    xa = np.array([s[l, h] for l, h in set_a], float)
    xb = np.array([s[l, h] for l, h in set_b], float)
    eff = float(xa.mean() - xb.mean()) if xa.size and xb.size else float("nan")
    rng = np.random.default_rng(seed)
    pool = np.concatenate([xa, xb])
    na = xa.size
    perm = np.array([rng.permutation(pool) for _ in range(n_perm)]) if pool.size else np.zeros((0, 0))
    null = perm[:, :na].mean(1) - perm[:, na:].mean(1) if pool.size else np.zeros(0)
    p = float((1 + (np.abs(null) >= abs(eff) - 1e-12).sum()) / (1 + n_perm)) if pool.size else 1.0
    boot = (xa[rng.integers(0, na, (1000, na))].mean(1) - xb[rng.integers(0, xb.size, (1000, xb.size))].mean(1))
    return {"test": "permutation of the set labels over heads", "effect": eff,
            "ci": [float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))], "p": p, "direction": direction,
            "n": int(min(na, xb.size)), "sd": float(pool.std(ddof=1)) if pool.size > 1 else float("nan"),
            "unpaired": True, "units": "heads"}


def trend(xs: Sequence[float], ys: dict[str, Sequence[float]], direction: int) -> dict[str, Any]:
    """Do the series ys rise with xs (e.g. rotation and stretch along depth)? Statistic: the mean over the series
    of Spearman's rho with xs; p: exact permutation of the order of xs (every ordering, all series permuted together),
    two-sided. With m points the smallest p is 2/m!; no interval (a rank statistic on so few points)."""
    xs = np.asarray(xs, float)
    m = xs.size
    if m < 3:
        return {"test": "exact permutation of the layer order (Spearman)", "effect": float("nan"), "ci": None,
                "ci_note": f"{m} layers: no trend can be tested", "p": 1.0, "direction": direction, "n": m, "sd": None,
                "untestable": f"{m} layers measured: no trend can be tested"}
    series = [np.asarray(v, float) for v in ys.values()]

    def stat(order: Sequence[int]) -> float:
        x = xs[list(order)]
        return float(np.mean([_st.spearmanr(x, y).statistic for y in series]))

    obs = stat(range(m))
    null = np.array([stat(o) for o in permutations(range(m))])
    p = float((np.abs(null) >= abs(obs) - 1e-12).mean())
    return {"test": "exact permutation of the layer order (mean Spearman rho)", "effect": obs, "ci": None,
            "ci_note": f"no interval: {m} layers; the smallest possible p is {2 / math.factorial(m):.2g}", "p": p,
            "direction": direction, "n": m, "sd": None, "units": "layers"}


def group_permutation(matrix: np.ndarray, groups: Sequence[str], direction: int) -> dict[str, Any]:
    """Transfer: is task A's entry on task B higher when A and B share a group? Statistic: the mean of the
    off-diagonal entries of same-group pairs minus that of different-group pairs; p: exact permutation of the
    group labels over the tasks (every distinct relabelling with the same group sizes), two-sided."""
    a = np.asarray(matrix, float)
    g = list(groups)
    m = len(g)

    def stat(lab: Sequence[str]) -> float | None:
        same = [a[i, j] for i in range(m) for j in range(m) if i != j and lab[i] == lab[j]]
        diff = [a[i, j] for i in range(m) for j in range(m) if lab[i] != lab[j]]
        return float(np.mean(same) - np.mean(diff)) if same and diff else None

    obs = stat(g)
    if obs is None:
        return {"test": "exact permutation of the group labels over tasks", "effect": float("nan"), "ci": None,
                "ci_note": "no similar and dissimilar pairs both", "p": 1.0, "direction": direction, "n": m,
                "sd": None, "untestable": "the tasks hold no similar pair and dissimilar pair both"}
    labs = {tuple(g[i] for i in o) for o in permutations(range(m))}
    null = np.array([s for s in (stat(lab) for lab in labs) if s is not None])
    p = float((np.abs(null) >= abs(obs) - 1e-12).mean())
    return {"test": "exact permutation of the group labels over tasks", "effect": obs, "ci": None,
            "ci_note": f"no interval: {m} tasks, {len(labs)} distinct relabellings (the smallest p is "
                       f"{1 / len(labs):.2g})", "p": p, "direction": direction, "n": m, "sd": None, "units": "tasks"}


def both(*parts: dict[str, Any]) -> dict[str, Any]:
    """Intersection-union test of parts that must all hold in their directions (the first is the main one: the
    finding's headline comparison): p = the largest part's p (a part the wrong way counts 1); effect, interval and
    direction the main part's; every part kept under `parts`."""
    parts = tuple(x for x in parts if x is not None)
    out = {k: v for k, v in parts[0].items() if k != "parts"}
    out["p"] = max(_directed_p(x) for x in parts)
    out["test"] = " and ".join(x["test"] for x in parts) + " (intersection-union: the largest p)"
    out["parts"] = [dict(x) for x in parts]
    return out


def _directed_p(x: dict[str, Any]) -> float:
    """A part's p when its effect is in its direction (a one-sided test: its p as it is); 1 otherwise (a part the
    wrong way cannot support the whole)."""
    if x.get("one_sided"):
        return float(x["p"])
    e = x.get("effect")
    if e is None or not np.isfinite(e) or np.sign(e) != x["direction"]:
        return 1.0
    return float(x["p"])


# -- correction and the rule ------------------------------------------------------------------------------------------

def correct(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Benjamini-Hochberg across one finding's tests on one model: each gets `q` (of its p, the paper's direction
    required) and `outcome`: for (q < ALPHA), against (the main part, BH-adjusted among the main parts, q < ALPHA
    the other way: a composite's first part, a plain test itself), else neither."""
    if not tests:
        return []
    q = benjamini_hochberg(np.array([_directed_p(t) if not t.get("parts") else t["p"] for t in tests], float))
    mains = [t["parts"][0] if t.get("parts") else t for t in tests]
    q_main = benjamini_hochberg(np.array([m["p"] for m in mains], float))
    out = []
    for t, qi, m, qm in zip(tests, q, mains, q_main):
        t = dict(t)
        t["q"] = float(qi)
        e = m.get("effect")
        against = (not m.get("one_sided") and qm < ALPHA and e is not None and np.isfinite(e) and e != 0
                   and np.sign(e) != m["direction"])
        t["outcome"] = "for" if qi < ALPHA else "against" if against else "neither"
        out.append(t)
    return out


def task_outcomes(tests: list[dict[str, Any]]) -> dict[str, str]:
    """{task: for / against / neither} from corrected tests (several ks per task: for when any k is for, against when
    any is against and none is for)."""
    res: dict[str, str] = {}
    for t in tests:
        cur, new = res.get(t["task"], "neither"), t["outcome"]
        res[t["task"]] = "for" if "for" in (cur, new) else "against" if "against" in (cur, new) else "neither"
    return res


def decide(outcomes: Sequence[str]) -> str:
    """The rule: per-task outcomes (for / against / neither) -> holds / partly / does not hold (`RULE`)."""
    n = len(outcomes)
    n_for, n_against = sum(o == "for" for o in outcomes), sum(o == "against" for o in outcomes)
    if n and n_for >= math.ceil(SHARE * n - 1e-9) and n_against == 0:
        return "holds"
    return "partly" if n_for else "does not hold"


def detectable(tests: list[dict[str, Any]]) -> str:
    """What the sample could detect: the smallest true effect found with 80% power at alpha 0.05 (two-sided) at the
    tests' median n, per-unit sd the tests' median (0.5 for a rate where not measured); '' when no test has an sd."""
    sds = [t["sd"] for t in tests if t.get("sd") is not None and np.isfinite(t["sd"])]
    ns = [t["n"] for t in tests if t.get("n")]
    if not sds or not ns:
        return ""
    n, sd = int(np.median(ns)), float(np.median(sds))
    if sd <= 0:  # every per-prompt difference equal (e.g. both arms always right): a rate's worst case instead
        sd = 0.5
    unpaired = any(t.get("unpaired") for t in tests)
    d = detectable_difference(n, sd=max(sd, 1e-9), paired=not unpaired)
    units = next((t["units"] for t in tests if t.get("units")), "prompts")
    return f"{d:.2f} ({n} {units} per {'arm' if unpaired else 'task'}, sd {sd:.2f})"


def finding(tests: list[dict[str, Any]]) -> dict[str, Any]:
    """One finding on one model: the corrected tests, the per-task outcomes, the verdict and what was detectable.
    Tests that could not be run on what was measured (`untestable`: too few layers or task pairs) are left out of
    the correction and named in `untested`; with none left the verdict is "not tested"."""
    untested = [f"{t['task']}: {t['untestable']}" for t in tests if t.get("untestable")]
    ct = correct([t for t in tests if not t.get("untestable")])
    per_task = task_outcomes(ct)
    return {"verdict": decide(list(per_task.values())) if ct else "not tested", "tests": ct, "per_task": per_task,
            "untested": untested,
            "n_for": sum(o == "for" for o in per_task.values()),
            "n_against": sum(o == "against" for o in per_task.values()), "n_tasks": len(per_task),
            "detectable": detectable(ct), "correction": "Benjamini-Hochberg"}


def fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:+.{digits}f}"


def fmt_p(p: float | None) -> str:
    if p is None or not np.isfinite(p):
        return "n/a"
    return f"{p:.1e}" if p < 1e-3 else f"{p:.3f}"


def ci_text(t: dict[str, Any]) -> str:
    ci = t.get("ci")
    return f"[{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else (t.get("ci_note") or "n/a")


def cell(f: dict[str, Any]) -> str:
    """A summary cell: the verdict, how many tasks are for / against, the strongest task's effect with its interval
    and q, and the detectable effect."""
    ts = f["tests"]
    if not ts:
        return "not tested" + (f" ({'; '.join(f['untested'])})" if f.get("untested") else "")
    best = min(ts, key=lambda t: (t["q"], -abs(t["effect"]) if t["effect"] is not None and np.isfinite(t["effect"])
                                  else 0))
    ex = best["task"] + (f" k={best['k']}" if best.get("k") is not None else "")
    return (f"{f['verdict']}: for on {f['n_for']}/{f['n_tasks']} tasks, against on {f['n_against']}; strongest "
            f"{ex}: {fmt(best['effect'])} {ci_text(best)}, q {fmt_p(best['q'])}"
            + (f"; detectable {f['detectable']}" if f["detectable"] else ""))


def test_table(title: str, f: dict[str, Any]) -> list[str]:
    """A finding's per-task tests as markdown: the verdict, the rule's counts, the detectable effect and one row per
    test (task, k, effect with its 95% interval, p, BH q, outcome)."""
    ts = f["tests"]
    if not ts:
        return [f"**{title}**: not tested ({'; '.join(f.get('untested') or ['nothing measured'])}).", ""]
    composite = any(t.get("parts") for t in ts)
    out = [f"**{title}**: **{f['verdict']}** (for on {f['n_for']}/{f['n_tasks']} tasks, against on "
           f"{f['n_against']}; Benjamini-Hochberg across the {len(ts)} tests"
           + (f"; detectable effect {f['detectable']}" if f["detectable"] else "") + "). Test: "
           + ts[0]["test"] + ".", "",
           "| task | k | effect | 95% CI | p | q (BH) | outcome |" + (" parts: effect [95% CI] p |" if composite else ""),
           "|---|---|---|---|---|---|---|" + ("---|" if composite else "")]
    for t in ts:
        parts = "; ".join(f"{fmt(x['effect'])} {ci_text(x)} p {fmt_p(x['p'])}" for x in t.get("parts") or [])
        out.append(f"| {t['task']} | {t.get('k', '') if t.get('k') is not None else ''} | {fmt(t['effect'])} | "
                   f"{ci_text(t)} | {fmt_p(t['p'])} | {fmt_p(t['q'])} | {t['outcome']} |"
                   + (f" {parts} |" if composite else ""))
    return out + [""]
