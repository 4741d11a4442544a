"""SITE on a real model (a section of the findings report, `report.py`): SITE against 10-shot ICL, top-alpha against
bottom-alpha (and random) patching, and transfer between similar and dissimilar tasks.

Per task (seed 0, `--site-prompts` held-out test queries): the `site` kind with its recipe (M = 50 prompts of 10
shots, 400 Adam steps at lr 0.2), its baselines (0-shot, 10-shot ICL, the function and vanilla task vectors at the middle
layer's input, every alpha = 1), top-k / bottom-k patching by alpha at k = 1, 2, 4, 8, 16 and 10%, 25%, 50% of the
heads (8-shot ICL and the correlations with the head maps left out for the CPU budget). Besides, from the saved
alphas and task embedding: random-k patching (3 draws), the top-k heads at their own trained alpha (not 1), to tell
the ranking from the size of the injection, and k = the heads SITE switched on (alpha > 0.5): top, bottom, random. Transfer: `site_transfer` over the built-in tasks.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import verdicts as V
from .common import pct, section_analyze

PAPER = "SITE"
GROUPS = {"sentiment": "classification", "topic": "classification", "antonym": "word transform",
          "english-french": "word transform", "present-past": "word transform",
          "syn-sentiment": "classification", "syn-antonym": "word transform"}  # the last two: the smoke run's
"""Similarity groups of the transfer, fixed before any result: tasks of one group are 'similar' (country-capital,
fact recall with no partner among the built-ins, is left out of the transfer for the CPU budget)."""
RANDOM_DRAWS = 3


def patch_ks(lm: Any) -> list[int]:
    total = lm.n_layers * lm.n_heads
    return sorted({min(k, total) for k in (1, 2, 4, 8, 16)} | {max(1, round(total * f)) for f in (0.1, 0.25, 0.5)})


def outline(a: Any, tasks: list) -> str:
    t = [n for n in GROUPS if n in dict(tasks)]
    return (f"{len(tasks)} site runs ({a.site_prompts} test prompts, seed 0; patching), random-k "
            f"patching, then site_transfer over {len(t)} built-in tasks ({', '.join(t)})")


def measure(lm: Any, tasks: list, a: Any, log: Callable[[str], None]) -> dict[str, Any]:
    analyze = section_analyze(a)

    ks = patch_ks(lm)
    rows = {}
    for name, task in tasks:
        r = analyze("site_alphas", lm, task, prompts=a.site_prompts, seed=0, patching=ks, budget=[],
                    compare=["zero_shot", "icl", "fv", "vanilla", "all_ones"], icl_shots=[10], correlations=[],
                    **a.site_recipe)
        b = r.baselines
        get = lambda k, m: None if k not in b or b[k].metrics is None else getattr(b[k].metrics, m)  # noqa: E731
        alpha = np.asarray(r.alpha, float)
        extra = _extra_patching(lm, task, r, ks, a.site_prompts, getattr(a, "tensors", None))
        rows[name] = {
            "kind": task.kind, "n": r.site.n, "shots": r.shots,
            "methods": {k: {"accuracy": get(k, "accuracy"), "exact_match": get(k, "exact_match")}
                        for k in ("zero_shot", "icl_10", "fv", "vanilla", "all_ones")}
            | {"site": {"accuracy": r.site.accuracy, "exact_match": r.site.exact_match},
               "site_hard": {"accuracy": r.site_hard.accuracy, "exact_match": r.site_hard.exact_match}},
            "patching": {"ks": r.patching.ks, "top": r.patching.top.accuracy, "bottom": r.patching.bottom.accuracy,
                         **extra},
            "alpha": {"decided": r.decisive["decided"], "over_half": float((alpha > 0.5).mean()),
                      "max": float(alpha.max()), "min": float(alpha.min()), "mean": float(alpha.mean()),
                      "top_layers": sorted({int(l) for l, _ in r.patching.top.heads[:16]})},
            "best_step": r.best_step, "train_seconds": r.train_seconds,
            "ci": {k: list(v) for k, v in _cis(r).items()}}
        rows[name]["tests"] = {"icl": _vs_icl(r)} | ({"patch": extra["test"]} if extra.get("test") else {})
        log(f"{name}: SITE {r.site.accuracy:.2f} (EM {r.site.exact_match:.2f}), ICL10 {get('icl_10', 'accuracy')}")
    names = [n for n in GROUPS if n in dict(tasks)]
    transfer = None
    if len(names) >= 2:
        tr = analyze("site_transfer", lm, None, tasks=names, prompts=a.site_prompts, seed=0,
                     **a.site_recipe)
        transfer = {"tasks": tr.tasks, "accuracy": tr.accuracy, "accuracy_top_k": tr.accuracy_top_k,
                    "top_k": tr.top_k, "zero_shot": tr.zero_shot, "summary": tr.summary}
        log("transfer: done")
    return {"ks": ks, "heads": lm.n_layers * lm.n_heads, "rows": rows, "transfer": transfer}


def _cis(r: Any) -> dict[str, tuple[float, float]]:
    """The methods' 95% Wilson intervals of accuracy (for the report's figure)."""
    out = {k: b.metrics.accuracy_ci for k, b in r.baselines.items() if b.metrics is not None and b.metrics.accuracy_ci}
    for k in ("site", "site_hard"):
        if getattr(r, k).accuracy_ci:
            out[k] = getattr(r, k).accuracy_ci
    return out


def _vs_icl(r: Any) -> dict[str, Any] | None:
    """SITE against 10-shot ICL on its test queries: exact McNemar on first-token accuracy where the two ran on the
    same queries in order (`site`'s own tests list only those), else Fisher's exact test on exact match (unpaired)."""
    b = r.baselines.get("icl_10")
    if b is None or b.metrics is None:
        return None
    if "site vs icl_10" in (r.tests or {}) and r.site.outcomes() is not None and b.metrics.outcomes() is not None:
        return V.paired(r.site.outcomes()["correct"].astype(float), b.metrics.outcomes()["correct"].astype(float), +1,
                        "paired, exact McNemar (first-token accuracy, SITE vs 10-shot ICL)")
    n1, n2 = r.site.n, b.metrics.n
    return V.two_proportions(round(r.site.exact_match * n1), n1, round(b.metrics.exact_match * n2), n2, +1,
                             "Fisher exact (exact match, SITE vs 10-shot ICL; unpaired)")


def _extra_patching(lm: Any, task: Any, r: Any, ks: list[int], prompts: int, store: Any = None) -> dict[str, Any]:
    """Random-k patching (mean of RANDOM_DRAWS draws) and top-k at the trained alphas, from the saved alphas and
    task embedding; and whether the configuration engine's top-k patching equals the SITE hooks' (max |delta accuracy|)."""
    import torch

    from backend.analysis.primitives.batching import encode
    from backend.analysis.site.soft_select import hard_alpha, load_site, ranked_heads, site_data, soft_logits
    from backend.analysis.primitives.selection import random_heads
    from backend.analysis.primitives.configs import RowConfig, score_configs

    from backend.store.tensor_store import default_store

    alpha, t, _ = load_site(store or default_store(), r.tensor, lm)
    alpha = alpha.float().cpu()
    enc = encode(lm, site_data(lm, task, m=1, shots=0, val_prompts=1, test_prompts=prompts, seed=0).test, task.kind)
    L, H = lm.n_layers, lm.n_heads
    order = ranked_heads(alpha.numpy())
    configs = []
    for k in ks:
        for d in range(RANDOM_DRAWS):
            rset = random_heads(L, H, k, seed=0, exclude=order[:k], draw=d)  # disjoint from the top k by alpha
            configs.append(RowConfig(mask=1.0 - hard_alpha(lm, rset), scope="last"))
    for k in ks:
        soft = torch.zeros(L, H)
        for l, h in order[:k]:
            soft[l, h] = alpha[l, h]
        configs.append(RowConfig(mask=1.0 - soft, scope="last"))
    # k = the heads SITE switched on (alpha > 0.5): those, as many of the lowest, as many random ones
    on = int((alpha > 0.5).sum())
    sets = [order[:on], order[::-1][:on]] + [random_heads(L, H, on, seed=1, exclude=order[:on], draw=d)
                                              for d in range(RANDOM_DRAWS)]
    configs += [RowConfig(mask=1.0 - hard_alpha(lm, s), scope="last") for s in sets]
    k10 = max(1, round(L * H * 0.1))  # the test's k: top / bottom at alpha = 1, per prompt
    configs += [RowConfig(mask=1.0 - hard_alpha(lm, s), scope="last") for s in (order[:k10], order[::-1][:k10])]
    res = score_configs(lm, enc, configs, fill=t.float(), batch_size=32)
    acc = res.means()["accuracy"][:-2]
    n = len(ks)
    c = res.correct.astype(float)
    i10 = ks.index(k10) if k10 in ks else None
    test = None
    if i10 is not None:
        top, bot = c[-2], c[-1]
        rnd = c[i10 * RANDOM_DRAWS:(i10 + 1) * RANDOM_DRAWS].mean(0)
        test = V.both(V.paired(top, bot, +1, "paired, exact McNemar (accuracy, top-alpha vs bottom-alpha patching)"),
                      V.paired(top, rnd, +1, "paired sign-flip (accuracy, top-alpha vs the random sets' mean)"))
        test["k"] = k10
    at_on = acc[n * (RANDOM_DRAWS + 1):]
    acc = acc[: n * (RANDOM_DRAWS + 1)]
    rand = acc[: n * RANDOM_DRAWS].reshape(n, RANDOM_DRAWS)
    # the same top-k patching through the SITE hooks (full passes), at the largest k and at 4
    gold = torch.tensor([enc.label_ids[i][enc.gold[i]] for i in range(len(enc.ids))])
    check = {}
    for k in sorted({min(4, ks[-1]), ks[-1]}):
        logits = soft_logits(lm, enc, hard_alpha(lm, order[:k]), t.float())
        check[k] = float((logits.argmax(-1) == gold).float().mean())
    return {"random": rand.mean(1).tolist(), "random_std": rand.std(1).tolist(), "top_soft": acc[n * RANDOM_DRAWS:].tolist(),
            "hooks_check": check, "test": test, "on": {"k": on, "top": float(at_on[0]), "bottom": float(at_on[1]),
                                         "random": float(at_on[2:].mean()),
                                         "saturated": int((alpha > 0.99).sum())}}


def _groups_transfer(tr: dict) -> tuple[float | None, float | None, float | None, float | None]:
    names = tr["tasks"]
    acc, acck = np.asarray(tr["accuracy"]), np.asarray(tr["accuracy_top_k"])
    same = [(i, j) for i in range(len(names)) for j in range(len(names)) if i != j
            and GROUPS[names[i]] == GROUPS[names[j]]]
    diff = [(i, j) for i in range(len(names)) for j in range(len(names)) if GROUPS[names[i]] != GROUPS[names[j]]]
    m = lambda x, ij: float(np.mean([x[i, j] for i, j in ij])) if ij else None  # noqa: E731
    return m(acc, same), m(acc, diff), m(acck, same), m(acck, diff)


def _at(ks: list[int], curve: list[float], k: int) -> float:
    return curve[ks.index(k)]


FINDINGS = ("icl", "patch", "transfer")


def findings_of(res: dict) -> dict[str, dict[str, Any]]:
    """{finding: `verdicts.finding`} of one model's SITE measurements (transfer: one test over the tasks)."""
    out = {key: V.finding([x["tests"][key] | {"task": t} for t, x in res["rows"].items()
                           if (x.get("tests") or {}).get(key)]) for key in ("icl", "patch")}
    tr = res.get("transfer")
    tests = []
    if tr:
        tests = [V.group_permutation(tr["accuracy"], [GROUPS[n] for n in tr["tasks"]], +1)
                 | {"task": "all (" + ", ".join(tr["tasks"]) + ")"}]
    out["transfer"] = V.finding(tests)
    return out


def summary(models: dict, a: dict) -> list[dict[str, Any]]:
    cells = {key: {} for key in FINDINGS}
    stats = {key: {} for key in FINDINGS}
    for m, e in models.items():
        res = e.get("site")
        if not res:
            continue
        rows = res["rows"]
        f = findings_of(res)
        for key in FINDINGS:
            if f[key]["tests"] or f[key]["untested"]:
                cells[key][m] = V.cell(f[key])
                stats[key][m] = f[key]
        d_em = [x["methods"]["site"]["exact_match"] - x["methods"]["icl_10"]["exact_match"] for x in rows.values()
                if x["methods"]["icl_10"]["exact_match"] is not None]
        if d_em and "icl" in cells and m in cells["icl"]:
            cells["icl"][m] += f" (mean exact match difference {np.mean(d_em) * 100:+.1f} points)"
    return [
        {"paper": PAPER, "key": "icl", "test": "McNemar, paired (accuracy, SITE vs 10-shot ICL)", "finding": "SITE against 10-shot ICL", "paper_figure": "+13.26 points (FV tasks, "
         "the paper's mean over 12 LLMs of 4-70B; exact match)", "ours": cells["icl"], "stats": stats["icl"]},
        {"paper": PAPER, "key": "patch", "test": "McNemar and sign-flip, paired (accuracy, top vs bottom and vs random)", "finding": "top-alpha above bottom-alpha (and random) patching at k = 10%",
         "paper_figure": "57.3 vs 6.2 (%)", "ours": cells["patch"], "stats": stats["patch"]},
        {"paper": PAPER, "key": "transfer", "test": "exact permutation of the group labels over tasks", "finding": "transfer: similar tasks transfer, dissimilar ones do not",
         "paper_figure": "qualitative (heatmaps)", "ours": cells["transfer"], "stats": stats["transfer"]},
    ]


REFERENCE = """**Top-alpha patching at small k: the implementation against the reference (SNU-DRL/Soft_Injection).** The
reference's code holds the injection and the training, not the patching experiment (no top/bottom-k script in
`eval.py` / `utils.py`), so the comparison is of how it injects: the task embedding is the mean of each head's
output-projection input at the last token over 50 prompts of 10 demonstrations drawn from the training split (ours:
the same); the injection replaces z at the last prompt token, in the prefill only, by (1 - alpha) z + alpha t at
every o_proj (ours: the same, through the head mask with a fill); prompts are `Q: x\nA: y\n\n` demonstrations
and zero-shot `Q: x\nA:` queries (ours: the same template); alphas = sigmoid(logits) from 0, Adam lr 0.2, 400
steps of one zero-shot training prompt, validation every 50 steps (ours: the same). Patching at alpha = 1 on the top
/ bottom heads by alpha is that injection with alpha in {0, 1}; `tests/integration/test_site_patching.py` checks that the
kind's curves equal the soft-injection hooks run as full passes (gold probabilities within 1e-4), and the "hooks
check" column above repeats it on the real model."""


def explain(models: dict) -> list[str]:
    """The numbers behind the top-alpha patching question, per model, on present-past when measured."""
    out = [REFERENCE, ""]
    for m, e in models.items():
        rows = (e.get("site") or {}).get("rows") or {}
        x = rows.get("present-past")
        if not x:
            continue
        p, ks = x["patching"], x["patching"]["ks"]
        small = ", ".join(f"k = {k}: {pct(p['top'][ks.index(k)])} / {pct(p['bottom'][ks.index(k)])}"
                          for k in (4, 16) if k in ks)
        big = ", ".join(f"k = {k}: {pct(p['top'][i])} / {pct(p['bottom'][i])} / {pct(p['random'][i])}"
                        for i, k in enumerate(ks) if k > 16)
        on = p["on"]
        out.append(f"On `{m}`, present-past: SITE {pct(x['methods']['site']['accuracy'])}% (10-shot ICL "
                   f"{pct(x['methods']['icl_10']['accuracy'])}%); top / bottom patching {small}; {big} (top / bottom / "
                   f"random). SITE switched on {on['k']} of the {e['site']['heads']} heads (alpha > 0.5; "
                   f"{on['saturated']} above 0.99, so the order among the top ones is set by differences in the third "
                   f"decimal): those heads at alpha = 1 give {pct(on['top'])}%, as many of the lowest {pct(on['bottom'])}%, "
                   f"as many random ones {pct(on['random'])}%.")
    out.append("")
    return out


def render(models: dict, a: dict) -> list[str]:
    out = ["## SITE: soft head selection", "",
           f"Seed 0, {a['site_prompts']} held-out test queries per task (zero-shot prompts), the `site` kind's recipe "
           "(M = 50 prompts of 10 shots for the task embedding, 400 Adam steps at lr 0.2, beta2 0.999, the best "
           "validation alphas kept" + (f"; here {a['site_recipe']}" if a.get("site_recipe") else "") + "). Accuracy "
           "(first token) / exact match, %. Vectors at the middle layer's input.", ""]
    for m, e in models.items():
        res = e.get("site")
        if not res:
            continue
        rows = res["rows"]
        cols = ("zero_shot", "icl_10", "fv", "vanilla", "all_ones", "site", "site_hard")
        out += [f"### `{m}` ({e['shape']})", "", "| task | " + " | ".join(cols) + " | SITE - ICL10 (EM) |",
                "|---|" + "---|" * (len(cols) + 1)]
        for t, x in rows.items():
            me = x["methods"]
            d = (None if me["icl_10"]["exact_match"] is None else me["site"]["exact_match"] - me["icl_10"]["exact_match"])
            out.append(f"| {t} | " + " | ".join(f"{pct(me[c]['accuracy'])} / {pct(me[c]['exact_match'])}" for c in cols)
                       + f" | {'n/a' if d is None else f'{100 * d:+.0f}'} |")
        ks = res["ks"]
        out += ["", "Patching: t injected outright (alpha = 1) at the top-k / bottom-k heads by alpha, at k random heads "
                f"(mean of {RANDOM_DRAWS}), and at the top-k heads with their own trained alpha (accuracy %). Alphas: "
                "share decided (< 0.1 or > 0.9), share > 0.5, max.", "",
                "| task | " + " | ".join(f"k={k}: top / bottom / random / top at alpha" for k in ks)
                + " | k = heads with alpha > 0.5: top / bottom / random | alphas | hooks check |",
                "|---|" + "---|" * (len(ks) + 3)]
        for t, x in rows.items():
            p, al = x["patching"], x["alpha"]
            out.append(f"| {t} | " + " | ".join(f"{pct(p['top'][i])} / {pct(p['bottom'][i])} / {pct(p['random'][i])}"
                                                f" / {pct(p['top_soft'][i])}" for i in range(len(ks)))
                       + f" | k={p['on']['k']} ({p['on']['saturated']} at alpha > 0.99): {pct(p['on']['top'])} / "
                       f"{pct(p['on']['bottom'])} / {pct(p['on']['random'])}"
                       + f" | {al['decided']:.2f}, {al['over_half']:.2f}, {al['max']:.2f} | "
                       + ", ".join(f"k={k}: {pct(v)}" for k, v in p["hooks_check"].items()) + " |")
        out.append("")
        tr = res.get("transfer")
        if tr:
            names = tr["tasks"]
            out += ["Transfer (task A's alphas, B's embedding, on B; accuracy %; groups: "
                    + ", ".join(f"{n} = {GROUPS[n]}" for n in names) + "):", "",
                    "| A \\ B | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
            for i, n in enumerate(names):
                out.append(f"| {n} | " + " | ".join(f"{pct(tr['accuracy'][i][j])} ({pct(tr['accuracy_top_k'][i][j])})"
                                                    for j in range(len(names))) + " |")
            s, d, sk, dk = _groups_transfer(tr)
            out += ["", f"In brackets: only A's top-{tr['top_k']} heads, alpha = 1. Zero-shot on B: "
                    + ", ".join(f"{n} {pct(z)}" for n, z in zip(names, tr["zero_shot"]))
                    + f". Similar pairs {pct(s)} vs dissimilar {pct(d)} (top-{tr['top_k']}: {pct(sk)} vs {pct(dk)}).",
                    ""]
    for m, e in models.items():
        if e.get("site"):
            f = findings_of(e["site"])
            titles = {"icl": "SITE vs 10-shot ICL (effect: SITE minus ICL)",
                      "patch": "Top- vs bottom-alpha patching at k = 10% (effect: top minus bottom; the second part: top "
                               "minus random)",
                      "transfer": "Transfer (effect: mean accuracy of similar pairs minus dissimilar pairs)"}
            out += [f"#### Tests on `{m}`", ""]
            for key in FINDINGS:
                out += V.test_table(titles[key], f[key])
    return out + explain(models)
