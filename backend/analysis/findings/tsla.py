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

from .common import section_analyze, verdict

PAPER = "TSLA"
QUAL = "qualitative (the paper's figures; no single number)"


def ks(lm: Any) -> tuple[int, int]:
    from backend.analysis.primitives.selection import n_top

    return n_top(lm.n_layers, lm.n_heads, 3.0), n_top(lm.n_layers, lm.n_heads, 10.0)


def plan(a: Any, tasks: list) -> str:
    n = len(tasks) * len(a.seeds)
    return (f"{len(tasks)} tasks x {len(a.seeds)} seeds = {n} x (icl [0, {a.shots}], scores, ablation_curves "
            f"(tr, tl, {a.random_sets} random sets; k = 3%, 10%; all positions), geometry), {a.prompts} prompts each")


def pooled(results: list, get: Callable) -> np.ndarray:
    w = np.array([r.prompts for r in results], float)
    return np.tensordot(w / w.sum(), np.array([get(r) for r in results], float), axes=1)


def measure(lm: Any, tasks: list, a: Any, log: Callable[[str], None]) -> dict[str, Any]:
    analyze = section_analyze(a)

    k3, k10 = ks(lm)
    rows = {}
    for name, task in tasks:
        icl, sc, abl, geo = [], [], [], []
        for s in a.seeds:
            common = dict(prompts=a.prompts, seed=s)
            icl.append(analyze("icl", lm, task, shots=[0, a.shots], examples=0, **common))
            sc.append(analyze("scores", lm, task, shots=a.shots, top_k=k3, **common))
            abl.append(analyze("ablation_curves", lm, task, orders=["tr", "tl", "random"], ks=[0, k3, k10],
                               shots=a.shots, random_seeds=list(range(a.random_sets)), **common))
            geo.append(analyze("geometry", lm, task, shots=a.shots, top_pct=10.0, final_norm=False, **common))
            log(f"{name} seed {s}: done")
        last = lm.n_layers - 1
        rows[name] = {
            "kind": task.kind, "prompts": int(sum(r.prompts for r in abl)),
            "icl": {m: pooled(icl, lambda r, m=m: getattr(r, m)).tolist()
                    for m in ("accuracy", "label_accuracy", "tr_ratio")},
            "ablation": {o: {m: pooled(abl, lambda r, o=o, m=m: getattr(r.curves[o], m)).tolist()
                             for m in ("accuracy", "label_accuracy", "tr_ratio")} for o in ("tr", "tl", "random")},
            "ks": abl[0].ks,
            "jaccard": {p: float(np.mean([r.overlap[p].jaccard for r in sc])) for p in ("tr_induction", "tl_induction")},
            "top_tr": sc[0].top_tr, "top_tl": sc[0].top_tl,
            "geometry": {m: {c: float(np.mean([g.conditions[c][m].mean[last] for g in geo])) for c in geo[0].conditions}
                         for m in ("alignment", "ld", "rotation")},
            "inject_layer": geo[0].inject_layer}
    return {"k3": k3, "k10": k10, "heads": lm.n_layers * lm.n_heads, "rows": rows}


def _f1(r: dict, j: int) -> tuple[bool, str]:
    ab = r["ablation"]
    base = ab["tr"]["tr_ratio"][0]
    d_tr, d_rand = base - ab["tr"]["tr_ratio"][j], base - ab["random"]["tr_ratio"][j]
    ok = d_tr > 0.05 and d_tr >= 3 * max(d_rand, 0.0)
    ratio = "inf" if d_rand <= 1e-9 and d_tr > 0 else ("n/a" if d_rand <= 1e-9 else f"{d_tr / d_rand:.1f}x")
    return ok, ratio


def _f2(r: dict, j: int) -> bool:
    ab = r["ablation"]
    base_a, base_t = ab["tl"]["accuracy"][0], ab["tl"]["tr_ratio"][0]
    d_tl, d_rand = base_a - ab["tl"]["accuracy"][j], base_a - ab["random"]["accuracy"][j]
    return d_tl >= 0.1 and d_tl >= 2 * max(d_rand, 0.0) and ab["tl"]["tr_ratio"][j] >= 0.8 * base_t


def _counts(res: dict) -> dict[str, Any]:
    rows = res["rows"].values()
    n = len(rows)
    ks = next(iter(res["rows"].values()))["ks"] if n else []
    rise = sum(r["icl"]["tr_ratio"][1] - r["icl"]["tr_ratio"][0] >= 0.2 for r in rows)
    f1 = {k: sum(_f1(r, j)[0] for r in rows) for j, k in enumerate(ks) if j}
    f2 = {k: sum(_f2(r, j) for r in rows) for j, k in enumerate(ks) if j}
    f3 = sum(r["jaccard"]["tr_induction"] > r["jaccard"]["tl_induction"] for r in rows)
    g = [r["geometry"] for r in rows]
    gain = lambda x, m, c: x[m][f"zero_shot+{c}"] - x[m]["zero_shot"]  # noqa: E731
    g1 = sum(gain(x, "alignment", "tr") > max(gain(x, "alignment", "tl"), 0.0) for x in g)
    g2 = sum(gain(x, "ld", "tl") > max(gain(x, "ld", "tr"), 0.0) for x in g)
    g1_loose = sum(gain(x, "alignment", "tr") > gain(x, "alignment", "tl") for x in g)
    g2_loose = sum(gain(x, "ld", "tl") > gain(x, "ld", "tr") for x in g)
    return {"n": n, "rise": rise, "f1": f1, "f2": f2, "f3": f3, "g1": g1, "g2": g2, "g1_loose": g1_loose,
            "g2_loose": g2_loose,
            "tr0": float(np.mean([r["icl"]["tr_ratio"][0] for r in rows])) if n else None,
            "trk": float(np.mean([r["icl"]["tr_ratio"][1] for r in rows])) if n else None}


def _per_k(d: dict, n: int) -> str:
    best = max(d.values()) if d else 0
    return (f"{verdict(best, n)} ({', '.join(f'k={k}: {v}/{n}' for k, v in d.items())})")


def summary(models: dict, a: dict) -> list[dict[str, Any]]:
    rows = {key: {} for key in ("tr", "f1", "f2", "f3", "g1", "g2")}
    for m, e in models.items():
        if "tsla" not in e:
            continue
        c = _counts(e["tsla"])
        n = c["n"]
        rows["tr"][m] = f"{verdict(c['rise'], n)}: TR ratio {c['tr0']:.2f} -> {c['trk']:.2f} (rises on {c['rise']}/{n})"
        rows["f1"][m] = _per_k(c["f1"], n)
        rows["f2"][m] = _per_k(c["f2"], n)
        jt = np.mean([r["jaccard"]["tr_induction"] for r in e["tsla"]["rows"].values()])
        jl = np.mean([r["jaccard"]["tl_induction"] for r in e["tsla"]["rows"].values()])
        rows["f3"][m] = f"{verdict(c['f3'], n)} ({c['f3']}/{n}; mean Jaccard {jt:.2f} vs {jl:.2f})"
        rows["g1"][m] = f"{verdict(c['g1'], n)} ({c['g1']}/{n}; the looser count {c['g1_loose']}/{n})"
        rows["g2"][m] = f"{verdict(c['g2'], n)} ({c['g2']}/{n}; the looser count {c['g2_loose']}/{n})"
    return [
        {"paper": PAPER, "finding": "0-shot -> k-shot TR ratio (zero-shot failure is a TR failure)",
         "paper_figure": "TR ratio low at 0 shots, near 1 with demonstrations (figures)", "ours": rows["tr"]},
        {"paper": PAPER, "finding": "F1: ablating the top TR heads collapses the TR ratio, vs random heads",
         "paper_figure": QUAL, "ours": rows["f1"]},
        {"paper": PAPER, "finding": "F2: ablating the top TL heads lowers accuracy, TR ratio kept",
         "paper_figure": QUAL, "ours": rows["f2"]},
        {"paper": PAPER, "finding": "F3: TR heads overlap induction heads more than TL heads do",
         "paper_figure": QUAL, "ours": rows["f3"]},
        {"paper": PAPER, "finding": "Geometry 4a: TR vectors raise the alignment with the label subspace (more than TL)",
         "paper_figure": QUAL, "ours": rows["g1"]},
        {"paper": PAPER, "finding": "Geometry 4b: TL vectors raise the logit difference (more than TR)",
         "paper_figure": QUAL, "ours": rows["g2"]},
    ]


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
        out += ["", "Ablation (accuracy / TR ratio after removing k heads):", "",
                "| task | k | none | top-TR | random | top-TL | F1: TR-ratio drop, TR / random | F2 |",
                "|---|---|---|---|---|---|---|---|"]
        for t, r in rows.items():
            ab = r["ablation"]
            for j, k in enumerate(r["ks"]):
                if not j:
                    continue
                cell = lambda o, j=j: f"{ab[o]['accuracy'][j]:.2f} / {ab[o]['tr_ratio'][j]:.2f}"  # noqa: E731
                ok1, ratio = _f1(r, j)
                out.append(f"| {t} | {k} | {ab['tr']['accuracy'][0]:.2f} / {ab['tr']['tr_ratio'][0]:.2f} | "
                           f"{cell('tr')} | {cell('random')} | {cell('tl')} | {ratio}{' (yes)' if ok1 else ''} | "
                           f"{'yes' if _f2(r, j) else 'no'} |")
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
        c = _counts(res)
        out += ["", f"Mean TR ratio {c['tr0']:.2f} at 0 shots, {c['trk']:.2f} at {a['shots']} shots. "
                f"F1 per k: {_per_k(c['f1'], c['n'])}; F2 per k: {_per_k(c['f2'], c['n'])}; F3 {c['f3']}/{c['n']}; "
                f"4a {c['g1']}/{c['n']} (looser: {c['g1_loose']}); 4b {c['g2']}/{c['n']} (looser: {c['g2_loose']}). "
                "On generation tasks the label set is each prompt's candidates and the full-vocabulary argmax is "
                "either the gold answer or outside them, so the TR ratio follows accuracy and F2 (accuracy down, "
                "TR ratio kept) can hardly hold there.", ""]
    return out
