"""Attribution patching against exact patching on real models (issue 33 item 1): Spearman, top-k recall, cost ratio.

    nice -n 10 HEADLENS_MODELS_DIR=models/pulled .venv/bin/python bench/bench_atp.py \
        --models smollm2-135m,gemma3-270m --task sentiment --prompts 16 --threads 1
    python bench/bench_atp.py --smoke     # the embedded model, one setup: does it still run (the CI test)

Each model and setup: the `attribution_patching` kind, cold (no cache), with its exact `activation_patching` map of the
same params computed in the same call. Setups: `cie` (the Head map's CIE: mean clean z into shuffled-input prompts,
p(gold)) and `zero` (paired clean z into the zero-shot prompts, p(gold)); `*_logit`: the same with the gold logit
(against the exact logit_gain; its exact map is the one just computed, read from an in-memory store, so no CPU
ratio). CPU seconds are this process's
(`time.process_time`, all torch threads), with the head scores of the same prompts cached first (as on the Head
map: the exact kind reads them), so the exact figure is its patching alone; the planned ratio is the cost model's. The load average is printed with
each row: other work may share the CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SETUPS = {"cie": {"target": "shuffled_inputs", "patch": "mean", "metric": "gold_prob"},
          "cie_logit": {"target": "shuffled_inputs", "patch": "mean", "metric": "gold_logit"},
          "zero": {"target": "zero_shot", "patch": "paired", "metric": "gold_prob"},
          "zero_logit": {"target": "zero_shot", "patch": "paired", "metric": "gold_logit"}}


class Store(dict):
    """The kernel's Store protocol over a dict: a model's exact map computed once for both metrics."""

    def put(self, key, value):
        self[key] = value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--task", default="sentiment")
    ap.add_argument("--setups", default="cie,cie_logit,zero,zero_logit")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--shots", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true", help="the embedded model, cie setup, 2 shots, 6 prompts (the CI test)")
    a = ap.parse_args()
    if a.smoke:
        a.models, a.task, a.setups, a.shots, a.prompts = "default", "syn-sentiment", "cie", 2, 6
    import torch

    torch.set_num_threads(a.threads)
    from backend import load_model
    from backend.analysis.kernel import analyze
    from backend.tasks.registry import load_task

    task = load_task(a.task)
    rows = []
    for name in a.models.split(","):
        lm = load_model(name.strip())
        store = Store()
        # the head scores of the same prompts first, as on the Head map: the exact kind reads them (its overlaps with
        # TR / TL), so its CPU seconds are its patching alone
        analyze("head_scores", lm, task, {"shots": a.shots, "prompts": a.prompts, "seed": 0, "top_pct": 3.0},
                cache=store)
        for setup in a.setups.split(","):
            params = {"shots": a.shots, "prompts": a.prompts, "seed": 0, "top_pct": 3.0, **SETUPS[setup]}
            r = analyze("attribution_patching", lm, task, params, cache=store)
            g = r.agreement
            row = {"model": name, "setup": setup, "layers x heads": f"{r.n_layers}x{r.n_heads}", "k": r.top_k,
                   "spearman": g.spearman, "kendall": g.kendall, "recall": g.recall,
                   "missed": [list(h) for h in g.missed], "max_abs_error": g.max_abs_error,
                   "exact_range": [float(g.exact.min()), float(g.exact.max())],
                   "atp_cpu_s": r.cpu_seconds, "exact_cpu_s": g.exact_cpu_seconds, "cpu_ratio": g.cpu_ratio,
                   "planned_ratio": g.planned_ratio, "target_metric": r.target_metric,
                   "clean_metric": r.clean_metric, "load": " ".join(f"{x:.1f}" for x in os.getloadavg())}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
