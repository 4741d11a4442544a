"""A whole ablation sweep, batched, against one forward pass per configuration; plus live toggling.

    python bench/bench_ablation.py [--model default] [--task syn-sentiment] [--json bench/ablation.json]
    python bench/bench_ablation.py --smoke        # 4 prompts, k in 0,1,2: does it still run (the CI test)

Sweep: orders tr, tl, induction and random (3 seeds), k in 0,1,2,4,8,16,32,64 (clipped to the model's
head count), 50 prompts. "batched" is the `ablation_curves` kind (the configuration engine: configurations mixed in row
batches, each recomputing only what it changes); "per-config" runs one full forward pass of the 50 prompts for
each configuration in turn (`run_configs(engine="full")`, one configuration at a time). The head maps are computed
(and cached) before timing, so both sides time ablation only.
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

from backend.analysis.kernel import analyze  # noqa: E402
from backend.analysis.primitives.batching import build_prompts, encode  # noqa: E402
from backend.analysis.primitives.selection import random_heads, ranking  # noqa: E402
from backend.analysis.primitives.configs import RowConfig, head_mask, run_configs  # noqa: E402
from backend.store.cache import ResultCache  # noqa: E402
from backend.model.loading import load_model  # noqa: E402
from backend.tasks.registry import load_task  # noqa: E402

KS = [0, 1, 2, 4, 8, 16, 32, 64]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--task", default="syn-sentiment")
    ap.add_argument("--shots", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="2 shots, 4 prompts, k in 0,1,2 (seconds)")
    a = ap.parse_args()
    ks_all = [0, 1, 2] if a.smoke else KS
    if a.smoke:
        a.shots, a.prompts = 2, 4
    lm, task = load_model(a.model), load_task(a.task)
    L, H = lm.n_layers, lm.n_heads
    cache = ResultCache(tempfile.mkdtemp(prefix="bench-cache-"))
    orders = ["tr", "tl", "induction", "random"]
    seeds = [0, 1, 2]
    ks = [k for k in ks_all if k <= L * H]
    common = {"shots": a.shots, "prompts": a.prompts, "seed": 0}
    curves = {**common, "orders": orders, "ks": ks, "random_seeds": seeds}
    scores = analyze("scores", lm, task, common, cache=cache)  # warms the maps the curves rank heads by

    t = time.perf_counter()
    r = analyze("ablation_curves", lm, task, curves, cache=cache)
    batched = time.perf_counter() - t
    assert not r.cache_hit

    enc = encode(lm, build_prompts(lm, task, a.shots, a.prompts, 0).prompts, task.kind)
    ranked = {o: [ranking(getattr(scores, o))] for o in orders if o != "random"}
    ranked["random"] = [random_heads(L, H, L * H, seed=s) for s in seeds]
    configs = [head_mask(lm, perm[:k]) for perms in ranked.values() for perm in perms for k in ks]
    t = time.perf_counter()
    for m in configs:
        run_configs(lm, enc.ids, [RowConfig(mask=m)], lambda *_: None, batch_size=a.prompts, engine="full")
    per_config = time.perf_counter() - t

    t = time.perf_counter()
    again = analyze("ablation_curves", lm, task, curves, cache=cache)
    cached = time.perf_counter() - t
    assert again.cache_hit

    heads = [tuple(h) for h in r.curves["tr"].heads[:3]]
    t = time.perf_counter()
    live = analyze("ablate", lm, task, {**common, "heads": heads}, cache=False)
    live_s = time.perf_counter() - t

    res = {"model": lm.name, "task": task.name, "layers": L, "heads": H, "ks": ks,
           "configurations": len(configs), "unique_configurations": r.n_configs, "prompts": a.prompts,
           "batched_s": round(batched, 3), "per_config_s": round(per_config, 3),
           "speedup": round(per_config / batched, 2), "cached_curve_s": round(cached, 4),
           "live_toggle_s": round(live_s, 3), "live_toggle_heads": [list(h) for h in heads],
           "live_before_after": [live.before.model_dump(), live.after.model_dump()],
           "torch_threads": torch.get_num_threads()}
    print(json.dumps(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
