"""A whole ablation sweep, batched, against one forward pass per configuration; plus live toggling.

    python bench/bench_ablation.py [--model default] [--task syn-sentiment] [--json bench/ablation.json]

Sweep: orders tr, tl, induction and random (3 seeds), k in 0,1,2,4,8,16,32,64 (clipped to the model's
head count), 50 prompts. "batched" is `ablation_curves` (configurations mixed in batches of 32 rows);
"per-config" runs one forward pass of the 50 prompts for each configuration in turn. The head maps are
computed (and cached) before timing, so both sides time ablation only.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.analysis.tsla.ablation import ablate, ablation_curves, head_orders, mask_for, run_configs  # noqa: E402
from backend.analysis.batching import encode, fit_prompts  # noqa: E402
from backend.cache import ResultCache  # noqa: E402
from backend.models import load_model  # noqa: E402
from backend.tasks.registry import load_task  # noqa: E402

KS = [0, 1, 2, 4, 8, 16, 32, 64]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--task", default="syn-sentiment")
    ap.add_argument("--shots", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    lm, task = load_model(a.model), load_task(a.task)
    cache = ResultCache(tempfile.mkdtemp(prefix="bench-cache-"))
    orders = ["tr", "tl", "induction", "random"]
    seeds = [0, 1, 2]
    ks = [k for k in KS if k <= lm.n_layers * lm.n_heads]
    ranked = head_orders(lm, task, orders, a.shots, a.prompts, 0, seeds, cache)  # warms the score cache

    t = time.perf_counter()
    r = ablation_curves(lm, task, orders, ks, shots=a.shots, n_prompts=a.prompts, random_seeds=seeds, cache=cache)
    batched = time.perf_counter() - t
    assert not r["cache_hit"]

    prompts, _, _ = fit_prompts(lm, task, a.shots, a.prompts, 0)
    enc = encode(lm, prompts, task.kind)
    configs = [mask_for(lm, perm[:k]) for perms in ranked.values() for perm in perms for k in ks]
    t = time.perf_counter()
    for m in configs:
        run_configs(lm, enc, m[None], batch_size=a.prompts)
    per_config = time.perf_counter() - t

    t = time.perf_counter()
    ablation_curves(lm, task, orders, ks, shots=a.shots, n_prompts=a.prompts, random_seeds=seeds, cache=cache)
    cached = time.perf_counter() - t

    heads = [tuple(h) for h in r["curves"]["tr"]["heads"][:3]]
    t = time.perf_counter()
    live = ablate(lm, task, heads, shots=a.shots, n_prompts=a.prompts, cache=False)
    live_s = time.perf_counter() - t

    res = {"model": lm.name, "task": task.name, "layers": lm.n_layers, "heads": lm.n_heads, "ks": ks,
           "configurations": len(configs), "unique_configurations": r["n_configs"], "prompts": a.prompts,
           "batched_s": round(batched, 3), "per_config_s": round(per_config, 3),
           "speedup": round(per_config / batched, 2), "cached_curve_s": round(cached, 4),
           "live_toggle_s": round(live_s, 3), "live_toggle_heads": [list(h) for h in heads],
           "live_before_after": [live["before"], live["after"]], "torch_threads": torch.get_num_threads()}
    print(json.dumps(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
