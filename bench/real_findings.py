"""The three papers' findings on real pretrained models, measured and written as one markdown report.

    python bench/real_findings.py --model smollm2-135m,gemma3-270m [--sections tsla,site,ltv] \
        [--out bench/REAL_FINDINGS.md] [--json out.json] [--plan]

Every number comes from the product's analysis kinds through the kernel's disk cache (HEADLENS_CACHE_DIR, default
`cache/real_findings` under the repository): a rerun computes only what is missing, and each section runs on its
own (`--sections tsla`). Tasks: the built-in English tasks and function-vector files read at run time from
`--fv-dir` (never copied). Seeds, prompt counts, the ks and the random baselines are stated in the report; the
rules that decide "holds / partly / does not hold" are fixed in this file (`RULES`) before any result is read.
Nothing here is tuned to make a finding hold. Sections: `bench/real_sections/` (tsla, site, ltv).
`--smoke` runs every section in seconds on the embedded model and two synthetic tasks (numbers meaningless).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HEADLENS_CACHE_DIR", str(REPO / "cache" / "real_findings"))

BUILTIN = ("sentiment", "topic", "antonym", "country-capital", "english-french", "present-past")
FV_FILES = ("singular-plural", "person-occupation")
SECTIONS = ("tsla", "site", "ltv")
RULES = """Verdicts: a finding **holds** on a model when it holds on at least 60% of the tasks it is measured on (the
ablation findings: at some k; every k is listed), **partly** when on at least one task, **does not hold** otherwise.
Per task:
- 0-shot -> k-shot: the k-shot TR ratio exceeds the 0-shot one by at least 0.2.
- F1: ablating the top-k TR heads lowers the TR ratio by more than 0.05 and at least 3x as much as k random heads
  (mean of the random sets; the rule of bench/FINDINGS.md).
- F2: ablating the top-k TL heads lowers accuracy by at least 0.1 and at least 2x as much as k random heads, while
  the TR ratio keeps at least 80% of its unablated value.
- F3: Jaccard(top TR, top induction) > Jaccard(top TL, top induction) (top 3% sets, mean over seeds).
- Geometry: the TR vector raises the last layer's label-subspace alignment, and more than the TL vector (4a); the
  TL vector raises the logit difference, and more than the TR vector (4b). (bench/FINDINGS.md compares the two
  changes only, whatever their sign; that looser count is given beside.)
- LTV vs vanilla / FV: the LTV's accuracy is above both.
- Key heads: ablating the LTV's top-10% heads by saliency lowers its accuracy by more than the mean of random sets
  of the same size plus 2 standard deviations.
- Linear propagation: rotation early, stretch late: cos(theta, Q theta) lower in the first half of the measured
  layers than in the second, and ||S theta|| / ||theta|| higher in the second half.
- SITE vs 10-shot ICL: SITE's exact match is above 10-shot ICL's.
- Top vs bottom patching: at k = 10% of the heads, top-alpha patching is above bottom-alpha patching by at least 0.1
  and above random-k patching.
- Transfer: task A's alphas on task B's embedding score higher when A and B are similar (same group) than when not."""


def fv_path(fv_dir: Path, name: str) -> Path:
    return fv_dir / f"{name}.json"


def resolve_tasks(names: list[str], fv_dir: Path) -> tuple[list[tuple[str, object]], list[str]]:
    """[(short name, Task)] for built-in names and function-vector files (by stem); notes for those left out."""
    from backend import builtin_tasks, load_task

    known = builtin_tasks()
    out, notes = [], []
    for n in names:
        if n in known:
            out.append((n, load_task(n)))
        elif fv_path(fv_dir, n).is_file():
            out.append((n, load_task(fv_path(fv_dir, n))))
        else:
            notes.append(f"{n}: no built-in task of that name and no {fv_path(fv_dir, n)}; left out")
    return out, notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m,gemma3-270m",
                    help="comma-separated model names or folders (one report covers them all)")
    ap.add_argument("--label", default=None, help="comma-separated display names, one per model")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--tasks", default=",".join(BUILTIN + FV_FILES))
    ap.add_argument("--fv-dir", default=str(REPO.parent / "shared" / "fv_datasets"))
    ap.add_argument("--seeds", default="0,1", help="TSLA seeds (each its own demonstration/query split)")
    ap.add_argument("--prompts", type=int, default=30, help="TSLA prompts per seed")
    ap.add_argument("--shots", type=int, default=8, help="TSLA demonstrations per prompt")
    ap.add_argument("--random-sets", type=int, default=3, help="random head sets per k (TSLA ablation)")
    ap.add_argument("--site-prompts", type=int, default=50, help="SITE test prompts (seed 0)")
    ap.add_argument("--site-tasks", default="sentiment,topic,antonym,present-past",
                    help="tasks of the SITE section (a subset of --tasks; SITE is the costliest kind on a CPU)")
    ap.add_argument("--ltv-main-tasks", default="sentiment,present-past",
                    help="tasks of the LTV section at the middle layer (a subset of --tasks)")
    ap.add_argument("--light", default="gemma3-270m",
                    help="labels measured at a reduced scope for the CPU budget: TSLA on the first seed only")
    ap.add_argument("--ltv-tasks", default="present-past",
                    help="tasks of the LTV layer sweep (every task gets the middle layer)")
    ap.add_argument("--ltv-layers", default="quarters", help="'quarters' (L/4, L/2, 3L/4), 'quarters+vanilla' (and the vanilla "
                                                             "vector's best layer) or a comma list")
    ap.add_argument("--ltv-prompts", type=int, default=30, help="LTV and its steer sweeps: held-out queries")
    ap.add_argument("--ltv-shots", type=int, default=8)
    ap.add_argument("--ltv-perturbations", type=int, default=256,
                    help="linear propagation: perturbed vectors per layer (the kind defaults to 2 d_model, <= 1024; 256 here for the CPU budget)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plan", action="store_true", help="print what would run and exit")
    ap.add_argument("--smoke", action="store_true", help="every section in seconds on the embedded model")
    a = ap.parse_args()
    a.site_recipe, a.ltv_recipe = {}, {}
    if a.smoke:
        smoke(a)
    a.seeds = [int(s) for s in str(a.seeds).split(",")]
    sections = [s for s in a.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; sections: {', '.join(SECTIONS)}")
    import torch

    torch.set_num_threads(a.threads)
    from backend import load_model

    runners = sections_by_name()
    models = a.model.split(",")
    labels = a.label.split(",") if a.label else models
    tasks, notes = resolve_tasks(a.tasks.split(","), Path(a.fv_dir))
    if a.plan:
        for s in sections:
            print(f"{s}: {runners[s].plan(a, section_tasks(a, s, tasks))}")
        return
    t0 = time.time()
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    data: dict = {"commit": commit, "args": {k: v for k, v in vars(a).items()}, "notes": notes, "models": {}}
    for name, label in zip(models, labels):
        lm = load_model(name)
        entry = {"label": label, "name": name, "shape": f"{lm.n_layers} layers x {lm.n_heads} heads "
                 f"({lm.n_kv_heads} KV), d_model {lm.d_model}", "device": str(lm.device), "_args_shots": a.shots}
        light = label in (a.light or "").split(",")
        scope = argparse.Namespace(**vars(a))
        if light:
            scope.seeds = a.seeds[:1]
        entry["scope"] = {"seeds": scope.seeds, "site_tasks": scope.site_tasks, "ltv_main_tasks": scope.ltv_main_tasks,
                          "ltv_tasks": scope.ltv_tasks, "light": light}
        for s in sections:
            t1 = time.time()
            entry[s] = runners[s].measure(lm, section_tasks(scope, s, tasks), scope, log=lambda m: print(f"[{label} {s}] {m}", file=sys.stderr,
                                                                             flush=True))
            entry[f"{s}_seconds"] = time.time() - t1
        data["models"][label] = entry
        del lm
    data["seconds"] = time.time() - t0
    report = render(data, sections)
    if a.out:
        Path(a.out).write_text(report)
        print(f"wrote {a.out}", file=sys.stderr)
    else:
        print(report)
    if a.json:
        Path(a.json).write_text(json.dumps(data, indent=1, default=str))


def section_tasks(a: argparse.Namespace, section: str, tasks: list) -> list:
    """The tasks a section measures: every task for TSLA, --site-tasks / --ltv-main-tasks (in --tasks) for the others."""
    pick = {"site": a.site_tasks, "ltv": a.ltv_main_tasks}.get(section)
    if pick is None:
        return tasks
    names = set(pick.split(","))
    return [(n, t) for n, t in tasks if n in names]


def sections_by_name() -> dict:
    from real_sections import ltv, site, tsla

    return {"tsla": tsla, "site": site, "ltv": ltv}


def smoke(a: argparse.Namespace) -> None:
    """Tiny sizes everywhere, the embedded model, two synthetic tasks, a throw-away cache and report."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="real-findings-smoke-"))
    os.environ["HEADLENS_CACHE_DIR"] = str(tmp / "cache")
    a.model, a.label, a.tasks, a.sections = "default", None, "syn-sentiment,syn-antonym", ",".join(SECTIONS)
    a.seeds, a.prompts, a.shots, a.random_sets, a.site_prompts = "0", 4, 2, 1, 4
    a.site_tasks = a.ltv_main_tasks = a.tasks
    a.ltv_tasks, a.ltv_layers, a.ltv_perturbations, a.ltv_prompts, a.ltv_shots = "syn-antonym", "quarters", 8, 4, 2
    a.site_recipe = {"m": 4, "shots": 2, "steps": 4, "val_every": 2, "val_prompts": 3, "max_new_tokens": 2}
    a.ltv_recipe = {"epochs": 1, "train_prompts": 4, "val_prompts": 4, "random_draws": 2}
    a.out, a.json = str(tmp / "REAL_FINDINGS.md"), None


def render(data: dict, sections: list[str]) -> str:
    runners = sections_by_name()
    a = data["args"]
    models = data["models"]
    out = ["# The papers' findings on real models", "",
           "Generated by `python bench/real_findings.py --model " + a["model"] + " --sections " + a["sections"]
           + (f" --label {a['label']}" if a.get("label") else "") + (f" --out {a['out']}" if a.get("out") else "")
           + f"` at commit {data.get('commit', '?')[:10]} (every number from the product's analysis kinds, "
           f"through the kernel's cache; {data['seconds'] / 60:.0f} min this run, most of it cache reads when "
           f"nothing was missing). Models: "
           + "; ".join(f"`{m['label']}` ({m['shape']}, {m['device']})" for m in models.values()) + ".", "",
           "Every vector \"at layer l\" is added at the **input** of decoder layer l (layer 0: the embeddings), at "
           "the last prompt token; the middle layer is L/2. `accuracy`: the full-vocabulary argmax is the gold "
           "answer's first token; exact match: the generated answer, cut at the separator or a newline, begins with "
           "the gold answer (SITE's rule).", "", RULES, ""]
    light = [m for m in models.values() if m.get("scope", {}).get("light")]
    for m in light:
        sc = m["scope"]
        out += [f"Scope of `{m['label']}` (reduced for the 2-core CPU budget, `--light`): TSLA on seed "
                f"{', '.join(map(str, sc['seeds']))} only (SITE on {sc['site_tasks']}; LTV on {sc['ltv_main_tasks']} "
                f"at the middle layer, its layer sweep on {sc['ltv_tasks'] or 'none'}, as for the other models).", ""]
    if data["notes"]:
        out += ["Left out: " + "; ".join(data["notes"]), ""]
    summary = [row for s in sections for row in runners[s].summary(models, a)]
    out += ["## Summary", "", "| paper | finding | paper's figure | " + " | ".join(f"`{m}`" for m in models)
            + " |", "|---|---|---|" + "---|" * len(models)]
    out += [f"| {r['paper']} | {r['finding']} | {r['paper_figure']} | " + " | ".join(r["ours"].get(m, "not run")
                                                                                    for m in models) + " |"
            for r in summary]
    out.append("")
    for s in sections:
        out += runners[s].render(models, a)
    out += defaults_section(models)
    return "\n".join(out) + "\n"


DEFAULTS_RULE = """The dashboard's starting settings per model (`backend/model_defaults.py`), by a rule fixed before the
results: the task is the built-in task with the largest 0-shot -> k-shot accuracy gain among those whose TR ratio
rises by at least 0.2 (TSLA section); shots = the measured k; top-k = the ablation k (3% or 10% of the heads) at which
F1 and F2 hold on the most tasks (ties: the smaller); the ablation curve runs to 10% of the heads; the Steering
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
        from real_sections.tsla import _f1, _f2

        score = {}
        for j, k in enumerate(next(iter(tsla["rows"].values()))["ks"]):
            if j:
                score[k] = sum(_f1(r, j)[0] + _f2(r, j) for r in tsla["rows"].values())
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


if __name__ == "__main__":
    main()
