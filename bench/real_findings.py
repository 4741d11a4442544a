"""The three papers' findings on real pretrained models, measured and written as one markdown report.

    python bench/real_findings.py --model smollm2-135m,gemma3-270m [--sections tsla,site,ltv] \
        [--out bench/REAL_FINDINGS.md] [--json out.json] [--plan]

Every number comes from the product's analysis kinds through the kernel's disk cache (HEADLENS_CACHE_DIR, default
`cache/real_findings` under the repository), and each model's section, once measured, is kept whole with the time it
took (`<cache>/findings_sections/`, keyed by the model, the section, its tasks and every setting): the run is
resumable: a rerun after an interruption reads the finished sections, and inside the unfinished one only the kinds
not yet cached are computed. Each section can run on its own (`--sections tsla`). The report names the commit and
the exact command line, and how long each section took when it was measured. Tasks: the built-in English tasks and function-vector files read at run time from
`--fv-dir` (never copied). Seeds, prompt counts, the ks and the random baselines are stated in the report; the
rules that decide "holds / partly / does not hold" are fixed in this file (`RULES`) before any result is read.
Nothing here is tuned to make a finding hold. Sections and rules: `backend/analysis/findings/` (tsla, site, ltv; report.py).
`--smoke` runs every section in seconds on the embedded model and two synthetic tasks (numbers meaningless).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HEADLENS_CACHE_DIR", str(REPO / "cache" / "real_findings"))

BUILTIN = ("sentiment", "topic", "antonym", "country-capital", "english-french", "present-past")
FV_FILES = ("singular-plural", "person-occupation")
from backend.analysis.findings.report import (SECTIONS, measure_model, render, section_tasks,  # noqa: E402
                                             sections_by_name)


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


def command_line(argv: list[str], repo: Path = REPO) -> str:
    """The command as anyone runs it from the repository root: a path inside the checkout or beside it relative to
    the root (`--fv-dir ../shared/fv_datasets`); `--json` outside the checkout, a scratch file of the machine it ran
    on, left out."""
    root = repo.resolve()

    def rel(v: str) -> str:
        p = Path(v)
        return os.path.relpath(p.resolve(), root) if p.is_absolute() and p.resolve().is_relative_to(root.parent) else v

    out, args = ["python bench/real_findings.py"], list(argv)
    while args:
        x = args.pop(0)
        if x == "--json" or x.startswith("--json="):
            val = x.partition("=")[2] or (args.pop(0) if args else "")
            if Path(val).resolve().is_relative_to(root):
                out += ["--json", shlex.quote(rel(val))]
            continue
        key, eq, val = x.partition("=") if x.startswith("--") else ("", "", x)
        out.append(shlex.quote(key + eq + rel(val)))
    return " ".join(out)


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
    ap.add_argument("--light", default="",
                    help="labels measured at a reduced scope for the CPU budget: TSLA on the first seed only (none by "
                         "default: every model gets every seed)")
    ap.add_argument("--ltv-tasks", default="present-past",
                    help="tasks of the LTV layer scan (every task gets the middle layer)")
    ap.add_argument("--ltv-layers", default="quarters", help="'quarters' (L/4, L/2, 3L/4), 'quarters+vanilla' (and the vanilla "
                                                             "vector's best layer) or a comma list")
    ap.add_argument("--ltv-prompts", type=int, default=30, help="LTV and its steer sweeps: held-out queries")
    ap.add_argument("--ltv-shots", type=int, default=8)
    ap.add_argument("--ltv-perturbations", type=int, default=256,
                    help="linear propagation: perturbed vectors per layer (the kind defaults to 2 d_model, <= 1024; 256 here for the CPU budget)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--html", default=None, help="also write the report as one self-contained HTML file with its "
                                                 "figures (plotly inlined)")
    ap.add_argument("--fresh", action="store_true", help="measure every section again (ignore the section cache; "
                                                          "the kinds' cache still serves)")
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
            print(f"{s}: {runners[s].outline(a, section_tasks(a, s, tasks))}")
        return
    t0 = time.time()
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    a.section_cache = None if a.fresh else Path(os.environ["HEADLENS_CACHE_DIR"]) / "findings_sections"
    data: dict = {"commit": commit + (" (with uncommitted changes)" if dirty else ""),
                  "args": {k: v for k, v in vars(a).items() if k != "section_cache"}, "notes": notes, "models": {}}
    for name, label in zip(models, labels):
        lm = load_model(name)
        data["models"][label] = measure_model(lm, name, label, tasks, a, sections,
                                              log=lambda m: print(m, file=sys.stderr, flush=True))
        del lm
    data["seconds"] = time.time() - t0
    command = command_line(sys.argv[1:])
    report = render(data, sections, command=command)
    if a.out:
        Path(a.out).write_text(report)
        print(f"wrote {a.out}", file=sys.stderr)
    else:
        print(report)
    if a.json:
        Path(a.json).write_text(json.dumps(data, indent=1, default=str))
    if a.html:
        from backend.report.findings_html import findings_page

        Path(a.html).write_text(findings_page(report, data["models"], [r for s in sections
                                                                    for r in runners[s].summary(data["models"],
                                                                                                data["args"])],
                                              title="The papers' findings on " + ", ".join(data["models"]),
                                              command=command))
        print(f"wrote {a.html}", file=sys.stderr)


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
    a.out, a.json, a.html = str(tmp / "REAL_FINDINGS.md"), None, str(tmp / "REAL_FINDINGS.html")


if __name__ == "__main__":
    main()
