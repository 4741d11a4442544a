"""Soft head selection (SITE) on the default model: training time, and the issue's numbers task by task.

    python bench/bench_site.py [--model default] [--tasks all] [--timing-runs 3] [--no-analyses] [--json out.json]
    python bench/bench_site.py --smoke     # two tasks, M = 4, 4 steps, 4 test prompts (the CI test)

Timing: the task embedding (M = 50 prompts of 10 shots) and the 400 training steps (Adam, lr 0.2, batch 1,
validation every 50 steps) of `syn-sentiment`, `--timing-runs` times; wall-clock and this process's CPU seconds
(the machine is shared: wall-clock depends on what else runs; CPU seconds much less), torch threads as the kind
runs them (one, for a model this small on the CPU), and the load average.
Analyses: the `site` kind with its defaults on each of the 10 non-random-mapping tasks (0-shot, 8/10-shot ICL,
function vector, vanilla task vector, every alpha = 1, SITE: exact match, first-token accuracy, TR ratio; alpha
decisiveness; top/bottom-k patching; budget curve), the alphas' decisiveness with Adam's beta2 = 0.9, then
`site_transfer` over them; results cached in a temporary folder (or HEADLENS_CACHE_DIR when set).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.analysis.kernel import analyze  # noqa: E402
from backend.analysis.site import soft_select as S  # noqa: E402
from backend.analysis.primitives.capture import capture_means  # noqa: E402
from backend.analysis.primitives.threads import cpu_threads  # noqa: E402
from backend.model.loading import load_model  # noqa: E402
from backend.tasks.registry import builtin_tasks  # noqa: E402


RECIPE = {"m": 50, "shots": 10, "val_prompts": 100, "test_prompts": 100, "steps": 400}
SMOKE_RECIPE = {"m": 4, "shots": 2, "val_prompts": 4, "test_prompts": 4, "steps": 4}
SMOKE_SITE = {"m": 4, "shots": 2, "steps": 4, "prompts": 4, "val_every": 2, "val_prompts": 4, "budget": [2],
              "patching": [1, 2]}


def timing(lm, task, runs: int, recipe: dict = RECIPE) -> dict:
    out = []
    for _ in range(runs):
        with cpu_threads(lm):
            threads = torch.get_num_threads()
            load = os.getloadavg()[0]
            c0, w0 = time.process_time(), time.perf_counter()
            d = S.site_data(lm, task, m=recipe["m"], shots=recipe["shots"], val_prompts=recipe["val_prompts"],
                            test_prompts=recipe["test_prompts"], seed=0)
            enc = S.encode_all(lm, task, d)
            t = capture_means(lm, enc["embed"], "z")
            c1, w1 = time.process_time(), time.perf_counter()
            tr = S.train_alphas(lm, t, enc["train"], enc["val"], steps=recipe["steps"], lr=0.2, val_every=50, seed=0)
            c2, w2 = time.process_time(), time.perf_counter()
        out.append({"embed_wall": w1 - w0, "embed_cpu": c1 - c0, "train_wall": w2 - w1, "train_cpu": c2 - c1,
                    "threads": threads, "load_before": load, "load_after": os.getloadavg()[0],
                    "best_step": tr.best_step})
        print(f"  embedding {w1 - w0:.2f} s wall ({c1 - c0:.2f} s CPU) · {recipe['steps']} steps {w2 - w1:.2f} s wall "
              f"({c2 - c1:.2f} s CPU) · {threads} thread(s) · load {load:.1f}", flush=True)
    return {"runs": out, "train_wall_median": float(np.median([r["train_wall"] for r in out])),
            "train_cpu_median": float(np.median([r["train_cpu"] for r in out]))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--timing-runs", type=int, default=3)
    ap.add_argument("--no-analyses", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="two tasks, a tiny recipe, one timing run (seconds)")
    a = ap.parse_args()
    site = SMOKE_SITE if a.smoke else {}  # the site kind's params (its defaults unless --smoke)
    if a.smoke:
        a.tasks, a.timing_runs = "syn-antonym,syn-plural", 1  # site_transfer needs two tasks
    if not os.environ.get("HEADLENS_CACHE_DIR"):
        os.environ["HEADLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-site-")
    lm = load_model(a.model)
    tasks = builtin_tasks()
    names = [n for n, t in tasks.items() if t.models == "default" and t.builder is None] if a.tasks == "all" \
        else a.tasks.split(",")
    report: dict = {"model": lm.name, "cpu_count": os.cpu_count(), "torch_threads_outside": torch.get_num_threads()}
    print("timing (syn-sentiment):", flush=True)
    report["timing"] = timing(lm, tasks["syn-sentiment"], a.timing_runs, SMOKE_RECIPE if a.smoke else RECIPE)
    if a.no_analyses:
        return _write(report, a.json)
    rows = {}
    for n in names:
        t0 = time.perf_counter()
        r = analyze("site", lm, tasks[n], site)
        b = r.baselines
        acc = lambda k: None if k not in b or b[k].metrics is None else b[k].metrics.accuracy  # noqa: E731
        em = lambda k: None if k not in b or b[k].metrics is None else b[k].metrics.exact_match  # noqa: E731
        rows[n] = {"zero_shot": acc("zero_shot"), "icl_8": acc("icl_8"), "icl_10": acc("icl_10"), "fv": acc("fv"),
                   "vanilla": acc("vanilla"), "all_ones": acc("all_ones"), "site": r.site.accuracy,
                   "site_em": r.site.exact_match, "site_strict": r.site.strict_match, "site_tr": r.site.tr_ratio,
                   "site_hard": r.site_hard.accuracy, "em": {k: em(k) for k in b}, "decisive": r.decisive,
                   "best_step": r.best_step, "train_seconds": r.train_seconds,
                   "patching": r.patching.model_dump() if r.patching else None,
                   "budget": r.budget.model_dump() if r.budget else None,
                   "correlations": {k: v.spearman for k, v in r.correlations.items()},
                   "within_5_of_icl8": acc("icl_8") is not None and r.site.accuracy >= acc("icl_8") - 0.05 - 1e-9,
                   "n": r.site.n, "job_seconds": time.perf_counter() - t0}
        x = rows[n]
        print(f"{n:16s} 0-shot {x['zero_shot']:.2f} · ICL8 {x['icl_8']:.2f} · ICL10 {x['icl_10']:.2f} · FV "
              f"{x['fv']:.2f} · vanilla {x['vanilla']:.2f} · a=1 {x['all_ones']:.2f} · SITE {x['site']:.2f} "
              f"(EM {x['site_em']:.2f}, TR {x['site_tr']:.2f}) · decided {r.decisive['decided']:.2f} "
              f"(0.2/0.8: {r.decisive['decided_2x']:.2f}) · train {r.train_seconds:.1f} s · job "
              f"{x['job_seconds']:.0f} s", flush=True)
    report["tasks"] = rows
    report["within_5"] = sum(r["within_5_of_icl8"] for r in rows.values())
    alphas = np.concatenate([np.ravel(analyze("site", lm, tasks[n], site).alpha) for n in names])
    report["decided_all"] = float(((alphas < 0.1) | (alphas > 0.9)).mean())
    report["decided_2x_all"] = float(((alphas < 0.2) | (alphas > 0.8)).mean())
    pt = np.array([r["patching"]["top"]["accuracy"] for r in rows.values()])
    pb = np.array([r["patching"]["bottom"]["accuracy"] for r in rows.values()])
    report["patching_mean"] = {"ks": rows[names[0]]["patching"]["ks"], "top": pt.mean(0).tolist(),
                               "bottom": pb.mean(0).tolist()}
    bud = np.array([r["budget"]["accuracy"] for r in rows.values()])
    report["budget_mean"] = {"m": rows[names[0]]["budget"]["m"], "accuracy": bud.mean(0).tolist()}
    print(f"within 5 points of 8-shot ICL: {report['within_5']}/{len(rows)} · decided (0.1/0.9) "
          f"{report['decided_all']:.2f} · (0.2/0.8) {report['decided_2x_all']:.2f}", flush=True)
    print("patching (mean over tasks):", report["patching_mean"], flush=True)
    print("budget (mean over tasks):", report["budget_mean"], flush=True)
    lean = {"compare": [], "patching": [], "budget": [], "correlations": []}
    b2 = {n: analyze("site", lm, tasks[n], {**site, **lean}, beta2=0.9) for n in names}
    a2 = np.concatenate([np.ravel(r.alpha) for r in b2.values()])
    report["beta2_0.9"] = {"decided_all": float(((a2 < 0.1) | (a2 > 0.9)).mean()),
                           "decided": {n: r.decisive["decided"] for n, r in b2.items()},
                           "accuracy": {n: r.site.accuracy for n, r in b2.items()},
                           "train_seconds": {n: r.train_seconds for n, r in b2.items()}}
    print(f"Adam beta2 = 0.9: decided (0.1/0.9) {report['beta2_0.9']['decided_all']:.2f}; accuracy "
          f"{np.mean(list(report['beta2_0.9']['accuracy'].values())):.3f} (mean over tasks)", flush=True)
    t0 = time.perf_counter()
    transfer = {k: v for k, v in site.items() if k not in ("budget", "patching")}
    tr = analyze("site_transfer", lm, None, transfer, tasks=names)
    report["transfer"] = {"tasks": tr.tasks, "accuracy": tr.accuracy, "summary": tr.summary,
                          "head_jaccard": tr.head_jaccard, "seconds": time.perf_counter() - t0}
    print("transfer:", json.dumps(tr.summary), flush=True)
    _write(report, a.json)


def _write(report: dict, path: str | None) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=1))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
