"""The three papers' findings on one or more models, as data and as markdown: the sections (`tsla`, `site`,
`ltv`, each a module here with `outline`, `measure`, `summary` and `render`), the rules that decide "holds / partly /
does not hold" (fixed before any result is read), and the report's text. `bench/real_findings.py` writes
`bench/REAL_FINDINGS.md` from it; kind `findings_report` and `python -m backend report` measure one model and write HTML.
Every number comes from the analysis kinds, through the kernel's cache.
"""
from __future__ import annotations

import argparse
import time
import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Sequence

from . import verdicts as V

SECTIONS = ("tsla", "site", "ltv")
RULES = V.RULE + """

The tests, per task (seeds pooled: each seed's prompts are distinct queries, so they join one sample):
- 0-shot -> k-shot: the TR outcome (the argmax is in the label set) at k shots against 0 shots on the same queries,
  exact McNemar (the icl kind's first 50 prompts per seed); paper's direction: up.
- F1, per k: the TR ratio after ablating the top-k TR heads against each prompt's mean over the random sets of k
  heads, paired sign-flip permutation test; direction: down.
- F2, per k: accuracy after ablating the top-k TL heads against the random sets' mean (paired sign-flip; down) and
  the TR ratio non-inferior to the unablated one within a margin of 20% of it (one-sided sign-flip on the
  per-prompt difference plus the margin); both must hold.
- F3: the induction scores of the top-3% TR heads against those of the top-3% TL heads (every seed's sets pooled),
  permutation of the set labels over the heads; up. (The Jaccard overlaps are given beside.)
- Geometry 4a: the last layer's label-subspace alignment with the TR vector added, against the TL vector and
  against no vector (zero-shot); 4b: the logit difference with the TL vector against TR and against none; Welch
  t-tests from the per-seed means and standard deviations (unpaired: conservative, the prompts are the same).
- LTV vs vanilla / FV: accuracy, exact McNemar on the same held-out queries, against each; both must hold.
- ... at each one's best layer: the LTV's best measured layer against each extracted vector's best layer chosen on
  seed 0 and scored on seed 1 (different queries: Fisher's exact test); the LTV's layer is chosen on the queries
  it is scored on, which favours it.
- Key heads: the LTV's accuracy with its top-10% heads by saliency ablated against each prompt's mean over the
  random sets, paired sign-flip; down.
- Linear propagation: rotation cos(theta, Q theta) and stretch ||S theta|| / ||theta|| both rising with depth,
  mean Spearman rho over the two, exact permutation of the measured layers (only the swept tasks).
- SITE vs 10-shot ICL: first-token accuracy, exact McNemar where both ran on the same queries (else exact match,
  Fisher's exact test); up. The exact-match difference (the paper's measure) is given beside.
- Top vs bottom patching: at k = 10% of the heads, top-alpha against bottom-alpha (McNemar) and against the random
  sets' mean (sign-flip), both up.
- Transfer: the mean accuracy of task A's alphas on task B's embedding over same-group pairs minus different-group
  pairs, exact permutation of the group labels over the tasks (one test for the model, not per task)."""


def section_tasks(a: Any, section: str, tasks: list) -> list:
    """The tasks a section measures: every task for TSLA, --site-tasks / --ltv-main-tasks (in --tasks) for the others."""
    pick = {"site": a.site_tasks, "ltv": a.ltv_main_tasks}.get(section)
    if pick is None:
        return tasks
    names = set(pick.split(","))
    return [(n, t) for n, t in tasks if n in names]


def measure_model(lm: Any, name: str, label: str, tasks: list, a: Any, sections: Sequence[str],
                  log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """One model's entry of the report: each section's measurements on its tasks (`a`: the report's settings, a
    namespace; `light` models: TSLA on the first seed only)."""
    runners = sections_by_name()
    entry: dict[str, Any] = {"label": label, "name": name, "shape": f"{lm.n_layers} layers x {lm.n_heads} heads "
                             f"({lm.n_kv_heads} KV), d_model {lm.d_model}", "device": str(lm.device),
                             "_args_shots": a.shots}
    light = label in (getattr(a, "light", "") or "").split(",")
    scope = argparse.Namespace(**vars(a))
    if light:
        scope.seeds = a.seeds[:1]
    entry["scope"] = {"seeds": scope.seeds, "site_tasks": scope.site_tasks, "ltv_main_tasks": scope.ltv_main_tasks,
                      "ltv_tasks": scope.ltv_tasks, "light": light}
    store = getattr(a, "section_cache", None)
    for s in sections:
        sec_tasks = section_tasks(scope, s, tasks)
        path = section_path(store, name, s, sec_tasks, scope) if store else None
        if path is not None and path.is_file():
            saved = json.loads(path.read_text())
            entry[s], entry[f"{s}_seconds"], entry[f"{s}_cached"] = saved["result"], saved["seconds"], True
            log(f"[{label} {s}] read from {path.name} (computed in {saved['seconds'] / 60:.1f} min)")
            continue
        t1 = time.time()
        result = runners[s].measure(lm, sec_tasks, scope, log=lambda m, s=s: log(f"[{label} {s}] {m}"))
        entry[s] = json.loads(json.dumps(result, default=_jsonable))  # what a cached read gives: the same numbers
        entry[f"{s}_seconds"] = time.time() - t1
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"result": entry[s], "seconds": entry[f"{s}_seconds"], "model": name,
                                       "section": s}))
            tmp.replace(path)
    return entry


SECTION_VERSION = 2
"""Part of a cached section's key: bumped when a section's measurements or tests change."""


def _jsonable(x: Any) -> Any:
    import numpy as np

    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON-able: {type(x).__name__}")


def section_path(store: Path | str, model: str, section: str, tasks: list, a: Any) -> Path:
    """Where one model's section result is kept (`bench/real_findings.py`: a rerun reads it instead of measuring):
    the key is the model, the section, its tasks and every setting of the report (`a`), and SECTION_VERSION."""
    settings = {k: v for k, v in sorted(vars(a).items())
                if k not in ("analyze", "tensors", "section_cache", "out", "json", "plan", "smoke", "threads", "model",
                             "label", "light", "html")}
    key = json.dumps({"v": SECTION_VERSION, "model": model, "section": section, "tasks": [n for n, _ in tasks],
                      "settings": settings}, sort_keys=True, default=str)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(model).name)
    return Path(store) / f"{safe}-{section}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def sections_by_name() -> dict[str, Any]:
    from . import ltv, site, tsla

    return {"tsla": tsla, "site": site, "ltv": ltv}


def render(data: dict, sections: list[str], command: str | None = None) -> str:
    """The report as markdown (`command`: what reproduces it; default the bench script's line)."""
    runners = sections_by_name()
    a = data["args"]
    models = data["models"]
    out = ["# The papers' findings on real models", "",
           "Generated by `" + (command or "python bench/real_findings.py --model " + a["model"] + " --sections "
                               + a["sections"] + (f" --label {a['label']}" if a.get("label") else "")
                               + (f" --out {a['out']}" if a.get("out") else ""))
           + (f"` at commit {data['commit'][:10]}{data['commit'][40:]}" if data.get("commit") else "`")
           + " (every number from the product's analysis kinds, "
           f"through the kernel's cache; {data['seconds'] / 60:.0f} min this run, most of it cache reads when "
           f"nothing was missing). Models: "
           + "; ".join(f"`{m['label']}` ({m['shape']}, {m['device']})" for m in models.values()) + ".", "",
           "Time each section took to measure (minutes; a section read back from the section cache gives the time it "
           "took when it was measured, marked *): "
           + "; ".join(f"`{m['label']}`: " + ", ".join(f"{s} {m[s + '_seconds'] / 60:.1f}" + ("*" if m.get(s + "_cached")
                                                                                           else "")
                                                       for s in sections if f"{s}_seconds" in m)
                       for m in models.values()) + ".", "",
           "Every vector \"at layer l\" is added at the **input** of decoder layer l (layer 0: the embeddings), at "
           "the last prompt token; the middle layer is L/2. `accuracy`: the full-vocabulary argmax is the gold "
           "answer's first token; exact match: the generated answer, cut at the separator or a newline, begins with "
           "the gold answer (SITE's rule).", "", RULES, ""]
    light = [m for m in models.values() if m.get("scope", {}).get("light")]
    for m in light:
        sc = m["scope"]
        out += [f"Scope of `{m['label']}` (reduced for the 2-core CPU budget, `--light`): TSLA on seed "
                f"{', '.join(map(str, sc['seeds']))} only (SITE on {sc['site_tasks']}; LTV on {sc['ltv_main_tasks']} "
                f"at the middle layer, its layer scan on {sc['ltv_tasks'] or 'none'}, as for the other models).", ""]
    if data["notes"]:
        out += ["Left out: " + "; ".join(data["notes"]), ""]
    summary = [row for s in sections for row in runners[s].summary(models, a)]
    out += ["## Summary", "", "Each cell: the verdict by the rule above, the tasks for and against the finding, the "
            "strongest task's effect with its 95% interval and BH-adjusted q, and the smallest effect the sample "
            "could detect (80% power).", "",
            "| paper | finding | paper's figure | test (per task, BH-corrected) | " + " | ".join(f"`{m}`" for m in models)
            + " |", "|---|---|---|---|" + "---|" * len(models)]
    out += [f"| {r['paper']} | {r['finding']} | {r['paper_figure']} | {r.get('test', '')} | "
            + " | ".join(r["ours"].get(m, "not run") for m in models) + " |" for r in summary]
    out.append("")
    for s in sections:
        out += runners[s].render(models, a)
    out += defaults_section(models)
    return "\n".join(out) + "\n"


DEFAULTS_RULE = """The dashboard's starting settings per model (`ui/model_defaults.py`), by a rule fixed before the
results: the task is the built-in task with the largest 0-shot -> k-shot accuracy gain among those whose TR ratio
rises by at least 0.2 (TSLA section); shots = the measured k; top-k = the ablation k (3% or 10% of the heads) at which
F1 and F2 are significant (for) on the most tasks (ties: the smaller); the ablation curve runs to 10% of the heads; the Steering
page's layer is the layer where the vanilla task vector is best on that task (seed 0, checked on seed 1; LTV section);
the LTV page's layer is the LTV's best measured layer on that task (else the middle layer)."""


def choose_defaults(entry: dict) -> dict:
    """The rule above, applied to one model's measurements (whatever sections were run)."""
    from backend.tasks.registry import builtin_tasks

    known = builtin_tasks()
    out: dict = {}
    tsla = entry.get("tsla")
    if tsla:
        rows = {t: r for t, r in tsla["rows"].items() if t in known}
        ok = {t: r for t, r in rows.items() if r["icl"]["tr_ratio"][1] - r["icl"]["tr_ratio"][0] >= 0.2} or rows
        out["task"] = max(ok, key=lambda t: (ok[t]["icl"]["accuracy"][1] - ok[t]["icl"]["accuracy"][0], t))
        out["shots"] = entry["_args_shots"]
        from .tsla import findings_of

        f = findings_of(tsla)
        score: dict[int, int] = {}
        for key in ("f1", "f2"):
            for t in f[key]["tests"]:
                score[t["k"]] = score.get(t["k"], 0) + (t["outcome"] == "for")
        out["top_k"] = max(score, key=lambda k: (score[k], -k)) if score else None
        out["kmax"] = tsla["k10"]
    ltv = entry.get("ltv")
    task = out.get("task")
    if ltv and task in ltv["rows"]:
        x = ltv["rows"][task]
        out["sg_layer"] = x["extracted"]["vanilla"]["best_layer"] if "vanilla" in x["extracted"] else ltv["mid"]
        pl = x["per_layer"]
        out["ltv_layer"] = int(max(pl, key=lambda l: (pl[l]["ltv"], -int(l)))) if pl else ltv["mid"]
    return out


def defaults_section(models: dict) -> list[str]:
    out = ["## Dashboard defaults", "", DEFAULTS_RULE, "", "| model | chosen |", "|---|---|"]
    for m, e in models.items():
        d = choose_defaults(e)
        out.append(f"| `{m}` | " + (", ".join(f"{k} = {v}" for k, v in d.items()) or "nothing measured") + " |")
    return out + [""]
