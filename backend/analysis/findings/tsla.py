"""TSLA on a real model (a section of the findings report, `report.py`): the 0-shot -> k-shot TR ratio, ablation of the top TR /
TL heads against random heads (F1, F2), the overlap with induction heads (F3), and the steering geometry.

Per task and seed (`--seeds`, `--prompts` each, `--shots` demonstrations): `icl` at 0 and k shots; `scores` (top 3%
sets); `ablation_curves` (zero ablation at every position, k = 3% and 10% of the heads, `--random-sets` random sets);
`geometry` (TR / TL / random vectors of the top 10% heads at the middle layer's input, read at the last layer,
before the final norm: `final_norm=False`, the residual stream itself).
Seeds are pooled weighting by prompts.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import verdicts as V
from ...errors import BadInput
from ..primitives.stats import rate_ci, set_mean_ci, unpack_outcomes
from .common import section_analyze

PAPER = "TSLA"
QUAL = "qualitative (the paper's figures; no single number)"


def ks(lm: Any) -> tuple[int, int]:
    from backend.analysis.primitives.selection import n_top

    return n_top(lm.n_layers, lm.n_heads, 3.0), n_top(lm.n_layers, lm.n_heads, 10.0)


def outline(a: Any, tasks: list) -> str:
    n = len(tasks) * len(a.seeds)
    return (f"{len(tasks)} tasks x {len(a.seeds)} seeds = {n} x (icl [0, {a.shots}], scores, ablation_curves "
            f"(tr, tl, {a.random_sets} random sets; k = 3%, 10%; all positions), geometry), {a.prompts} prompts each")


def pooled(results: list, get: Callable) -> np.ndarray:
    w = np.array([r.prompts for r in results], float)
    return np.tensordot(w / w.sum(), np.array([get(r) for r in results], float), axes=1)


ORDERS = ("tr", "tl", "random")
OUTCOME = {"accuracy": "correct", "label_accuracy": "label_correct", "tr_ratio": "in_labels"}


def _outcomes(abl: list, order: str) -> dict[str, np.ndarray]:
    """{rate: (sets, prompts of every seed, ks)} per-prompt 0/1 outcomes of one order, the seeds' prompts joined."""
    per_seed = []
    for r in abl:
        pp = r.curves[order].per_prompt
        if not pp:
            raise BadInput("this ablation_curves result keeps no per-prompt outcomes (cached before they existed); "
                             "clear the cache or rerun")
        per_seed.append([[unpack_outcomes(code) for code in row] for row in pp])
    sets = min(len(x) for x in per_seed)
    return {rate: np.concatenate([np.array([[u[o] for u in row] for row in x[:sets]], float).transpose(0, 2, 1)
                                  for x in per_seed], axis=1) for rate, o in OUTCOME.items()}


def measure(lm: Any, tasks: list, a: Any, log: Callable[[str], None]) -> dict[str, Any]:
    analyze = section_analyze(a)

    k3, k10 = ks(lm)
    rows = {}
    for name, task in tasks:
        icl, sc, abl, geo = [], [], [], []
        for s in a.seeds:
            common = dict(prompts=a.prompts, seed=s)
            # examples: every prompt's outcome at 0 and k shots (the same queries), for the paired test of the rise
            icl.append(analyze("icl_curve", lm, task, shots=[0, a.shots], examples=min(a.prompts, EXAMPLES_MAX), **common))
            sc.append(analyze("head_scores", lm, task, shots=a.shots, top_k=k3, **common))
            abl.append(analyze("ablation_curves", lm, task, orders=list(ORDERS), ks=[0, k3, k10],
                               shots=a.shots, random_seeds=list(range(a.random_sets)), **common))
            geo.append(analyze("geometry", lm, task, shots=a.shots, top_pct=10.0, final_norm=False, **common))
            log(f"{name} seed {s}: done")
        last = lm.n_layers - 1
        rows[name] = {
            "kind": task.kind, "prompts": int(sum(r.prompts for r in abl)),
            "icl": {m: pooled(icl, lambda r, m=m: getattr(r, m)).tolist()
                    for m in ("accuracy", "label_accuracy", "tr_ratio")},
            "ablation": {o: {m: pooled(abl, lambda r, o=o, m=m: getattr(r.curves[o], m)).tolist()
                             for m in ("accuracy", "label_accuracy", "tr_ratio")} for o in ORDERS},
            "ks": abl[0].ks,
            "jaccard": {p: float(np.mean([r.overlap[p].jaccard for r in sc])) for p in ("tr_induction", "tl_induction")},
            "top_tr": sc[0].top_tr, "top_tl": sc[0].top_tl,
            "geometry": {m: {c: float(np.mean([g.conditions[c][m].mean[last] for g in geo])) for c in geo[0].conditions}
                         for m in ("alignment", "ld", "rotation")},
            "inject_layer": geo[0].inject_layer,
            "maps": {m: np.mean([getattr(r, m) for r in sc], axis=0).round(5).tolist() for m in ("tr", "tl")}
            | {"induction": np.asarray(sc[0].induction).round(5).tolist()}}
        rows[name].update(task_tests(icl, sc, abl, geo, last))
    return {"k3": k3, "k10": k10, "heads": lm.n_layers * lm.n_heads, "rows": rows}


EXAMPLES_MAX = 50  # the icl kind keeps at most 50 example rows per k: the rise's test uses the first 50 prompts


def task_tests(icl: list, sc: list, abl: list, geo: list, last: int) -> dict[str, Any]:
    """One task's tests, its seeds' prompts pooled (`verdicts`), and the ablation curves' 95% intervals."""
    def rows_of(r: Any, j: int) -> np.ndarray:
        return np.array([x.in_labels for x in r.examples[j]], float) if r.examples else np.zeros(0)

    zero = np.concatenate([rows_of(r, 0) for r in icl])
    kshot = np.concatenate([rows_of(r, 1) for r in icl])
    tests: dict[str, Any] = {"rise": V.paired(kshot, zero, +1, "paired, exact McNemar (TR outcome, k vs 0 shots)")}
    out = {o: _outcomes(abl, o) for o in ORDERS}
    rand = {m: x.mean(0) for m, x in out["random"].items()}  # (prompts, ks): each prompt's mean over the sets
    ks_ = abl[0].ks
    base_tr = out["tl"]["tr_ratio"][0, :, 0]
    margin = round(0.2 * float(base_tr.mean()), 4)
    tests["f1"], tests["f2"] = [], []
    for j, k in enumerate(ks_):
        if not j:
            continue
        f1 = V.paired(out["tr"]["tr_ratio"][0, :, j], rand["tr_ratio"][:, j], -1,
                      "paired sign-flip (TR ratio, top-TR vs the random sets' mean)")
        acc = V.paired(out["tl"]["accuracy"][0, :, j], rand["accuracy"][:, j], -1,
                       "paired sign-flip (accuracy, top-TL vs the random sets' mean)")
        kept = V.noninferior(out["tl"]["tr_ratio"][0, :, j], base_tr, margin)
        tests["f1"].append(f1 | {"k": k})
        tests["f2"].append(V.both(acc, kept) | {"k": k})
    ind = np.asarray(sc[0].induction, float)
    tests["f3"] = V.head_sets(ind, [h for r in sc for h in r.top_tr], [h for r in sc for h in r.top_tl], +1)
    tests["f3"]["test"] = "permutation over heads (induction score, top-TR vs top-TL heads)"

    def summ(metric: str, cond: str) -> tuple[float, float, int]:
        return V.pooled_summary([(g.conditions[cond][metric].mean[last], g.conditions[cond][metric].std[last],
                                  g.prompts) for g in geo])

    def vs(metric: str, a_: str, b_: str) -> dict[str, Any]:
        (m1, s1, n1), (m2, s2, n2) = summ(metric, a_), summ(metric, b_)
        return V.welch(m1, s1, n1, m2, s2, n2, +1, f"Welch t ({metric}, {a_} vs {b_}; unpaired, conservative)")

    tests["g1"] = V.both(vs("alignment", "zero_shot+tr", "zero_shot+tl"), vs("alignment", "zero_shot+tr", "zero_shot"))
    tests["g2"] = V.both(vs("ld", "zero_shot+tl", "zero_shot+tr"), vs("ld", "zero_shot+tl", "zero_shot"))
    ci: dict[str, Any] = {}
    for o in ORDERS:
        x = out[o]
        ci[o] = {m: ([list(rate_ci(x[m][0, :, j])) for j in range(len(ks_))] if o != "random" else
                     [list(map(float, c)) for c in zip(*set_mean_ci(x[m]))]) for m in OUTCOME}
    return {"tests": tests, "ablation_ci": ci, "margin": margin}


FINDINGS = ("rise", "f1", "f2", "f3", "g1", "g2")
TESTS = {"rise": "McNemar, paired (TR outcome, k vs 0 shots)",
         "f1": "sign-flip, paired (TR ratio, top-TR vs random sets), per k",
         "f2": "sign-flip, paired (accuracy, top-TL vs random) and non-inferiority of the TR ratio (margin 20%), per k",
         "f3": "permutation over heads (induction score, top-TR vs top-TL)",
         "g1": "Welch t (alignment, +TR vs +TL and vs 0-shot)", "g2": "Welch t (LD, +TL vs +TR and vs 0-shot)"}


def _tests(res: dict, key: str) -> list[dict[str, Any]]:
    out = []
    for t, r in res["rows"].items():
        x = r.get("tests", {}).get(key)
        for one in (x if isinstance(x, list) else [x] if x else []):
            out.append(one | {"task": t})
    return out


def findings_of(res: dict) -> dict[str, dict[str, Any]]:
    """{finding: `verdicts.finding`} of one model's TSLA measurements."""
    return {key: V.finding(_tests(res, key)) for key in FINDINGS}


def summary(models: dict, a: dict) -> list[dict[str, Any]]:
    per = {key: {} for key in FINDINGS}
    stats = {key: {} for key in FINDINGS}
    for m, e in models.items():
        if "tsla" not in e:
            continue
        f = findings_of(e["tsla"])
        for key in FINDINGS:
            per[key][m] = V.cell(f[key])
            stats[key][m] = f[key]
    meta = {
        "rise": ("0-shot -> k-shot TR ratio (zero-shot failure is a TR failure)",
                 "TR ratio low at 0 shots, near 1 with demonstrations (figures)"),
        "f1": ("F1: ablating the top TR heads lowers the TR ratio more than random heads", QUAL),
        "f2": ("F2: ablating the top TL heads lowers accuracy (vs random heads), TR ratio kept (non-inferior, "
               "margin 20%)", QUAL),
        "f3": ("F3: TR heads are more induction-like than TL heads (overlap with induction heads)", QUAL),
        "g1": ("Geometry 4a: TR vectors raise the alignment with the label subspace (more than TL)", QUAL),
        "g2": ("Geometry 4b: TL vectors raise the logit difference (more than TR)", QUAL)}
    return [{"paper": PAPER, "key": key, "finding": meta[key][0], "paper_figure": meta[key][1], "test": TESTS[key],
             "ours": per[key],
             "stats": stats[key]} for key in FINDINGS]


def render(models: dict, a: dict) -> list[str]:
    out = ["## TSLA: task recognition and task learning heads", "",
           f"Seeds {a['seeds']}, {a['prompts']} held-out queries per seed (each its own demonstration/query split), "
           f"{a['shots']}-shot prompts, in-context label sets (classification: the task's labels; generation: each "
           f"prompt's candidates, the gold answer, the demonstrations' outputs and padding words). Ablation: zero at "
           f"every position; random: mean of {a['random_sets']} random sets of k heads. The paper (Yang, Cho, Inoue "
           f"2025) shows these findings on larger models in figures; we quote no number for it.", ""]
    for m, e in models.items():
        if "tsla" not in e:
            continue
        res = e["tsla"]
        rows = res["rows"]
        out += [f"### `{m}` ({e['shape']}; top 3% = {res['k3']} heads, 10% = {res['k10']} of {res['heads']})", "",
                "| task | kind | prompts | 0-shot acc. | 0-shot TR ratio | k-shot acc. | k-shot label acc. | "
                "k-shot TR ratio |", "|---|---|---|---|---|---|---|---|"]
        for t, r in rows.items():
            i = r["icl"]
            out.append(f"| {t} | {r['kind']} | {r['prompts']} | {i['accuracy'][0]:.2f} | {i['tr_ratio'][0]:.2f} | "
                       f"{i['accuracy'][1]:.2f} | {i['label_accuracy'][1]:.2f} | {i['tr_ratio'][1]:.2f} |")
        out += ["", "Ablation (accuracy / TR ratio after removing k heads, with 95% intervals: Wilson for the "
                "ranked orders, a bootstrap over the random sets and the prompts for random):", "",
                "| task | k | none | top-TR | random | top-TL |", "|---|---|---|---|---|---|"]
        for t, r in rows.items():
            ab, ci = r["ablation"], r.get("ablation_ci", {})

            def cell(o: str, j: int, ab=ab, ci=ci) -> str:
                c = ci.get(o, {})
                iv = lambda m: (f" [{c[m][j][0]:.2f}-{c[m][j][1]:.2f}]" if c.get(m) else "")  # noqa: E731
                return (f"{ab[o]['accuracy'][j]:.2f}{iv('accuracy')} / {ab[o]['tr_ratio'][j]:.2f}"
                        f"{iv('tr_ratio')}")
            for j, k in enumerate(r["ks"]):
                if j:
                    out.append(f"| {t} | {k} | {cell('tl', 0)} | {cell('tr', j)} | {cell('random', j)} | "
                               f"{cell('tl', j)} |")
        out += ["", "Induction overlap (top 3% sets, Jaccard, mean over seeds) and geometry at the last layer (vectors "
                f"of the top 10% heads added at layer {next(iter(rows.values()))['inject_layer']}'s input):", "",
                "| task | J(TR, ind.) | J(TL, ind.) | align: 0-shot / +TR / +TL / +random / ICL | "
                "LD: 0-shot / +TR / +TL / +random / ICL |", "|---|---|---|---|---|"]
        for t, r in rows.items():
            al, ld = r["geometry"]["alignment"], r["geometry"]["ld"]
            cs = ("zero_shot", "zero_shot+tr", "zero_shot+tl", "zero_shot+random", "icl")
            out.append(f"| {t} | {r['jaccard']['tr_induction']:.2f} | {r['jaccard']['tl_induction']:.2f} | "
                       + " / ".join(f"{al[c]:.3f}" for c in cs) + " | " + " / ".join(f"{ld[c]:.2f}" for c in cs)
                       + " |")
        out += ["", f"#### Tests on `{m}`", ""]
        f = findings_of(res)
        titles = {"rise": "0-shot -> k-shot TR ratio (effect: k-shot minus 0-shot TR outcome)",
                  "f1": "F1 (effect: TR ratio after top-TR ablation minus after random ablation)",
                  "f2": "F2 (effect: accuracy top-TL minus random; the second part: the TR ratio top-TL minus "
                        f"unablated, non-inferior within 20% of the unablated TR ratio)",
                  "f3": "F3 (effect: mean induction score of the top-TR heads minus the top-TL heads', seeds' sets "
                        "pooled)",
                  "g1": "Geometry 4a (effect: alignment +TR minus +TL; the second part: +TR minus 0-shot)",
                  "g2": "Geometry 4b (effect: LD +TL minus +TR; the second part: +TL minus 0-shot)"}
        for key in FINDINGS:
            out += V.test_table(titles[key], f[key])
        out += ["On generation tasks the label set is each prompt's candidates and the full-vocabulary argmax is "
                "either the gold answer or outside them, so the TR ratio follows accuracy and F2 (accuracy down, "
                "TR ratio kept) can hardly hold there.", ""]
    return out
