"""Patching at any site and position (kind `site_patching`, issue 33 item 2) on real models: its CPU seconds against
one plain pass over the same prompts, per site and view.

    nice -n 10 HEADLENS_MODELS_DIR=models/pulled .venv/bin/python bench/bench_site_patching.py \
        --model smollm2-135m,gemma3-270m --task sentiment --shots 4 --prompts 8 --threads 2
    python bench/bench_site_patching.py --smoke     # the embedded model, 2 shots, 4 prompts: does it still run (CI)

Per model: a plain pass (the clean and the target prompts, last-token logits, batched as the kind batches them),
then `site_patching` cold (no cache) for each site's layer x position map (positions by role) and for z's layer x
head map at the last token. CPU seconds are this process's (`time.process_time`, all torch threads), wall seconds
beside them, the load average with each row (other work may share the CPU). `cells` is layers x columns (or heads);
`x_plain` the kind's CPU over the plain pass's; `per_cell` that over cells, in plain passes (under 1: the layers
below each patch are skipped). The top cells by recovered share are printed with their standard errors.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_composition import timed  # noqa: E402  (the script beside this one: wall and CPU seconds of a call)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--task", default="sentiment")
    ap.add_argument("--target", default="random_labels")
    ap.add_argument("--shots", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--sites", default="resid_pre,attn_out,mlp_out")
    ap.add_argument("--heads", action=argparse.BooleanOptionalAction, default=True, help="z's layer x head map too")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--smoke", action="store_true", help="the embedded model, syn-sentiment, 2 shots, 4 prompts")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.task, args.shots, args.prompts, args.sites = "default", "syn-sentiment", 2, 4, "resid_pre"
    import numpy as np
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from backend import load_model
    from backend.analysis.kernel import analyze
    from backend.analysis.primitives.batching import build_prompts, encode, forward_last_logits, map_batches
    from backend.analysis.primitives.patch import target_prompts
    from backend.tasks.registry import load_task

    print(json.dumps({"load": os.getloadavg(), "threads": torch.get_num_threads()}))
    for name in args.model.split(","):
        lm = load_model(name)
        task = load_task(args.task)
        built = build_prompts(lm, task, args.shots, args.prompts, 0)
        clean = encode(lm, built.prompts, task.kind)
        target = encode(lm, target_prompts(task, args.target, built.shots, built.n, 0), task.kind)

        def plain():
            for enc in (clean, target):
                map_batches(lm, enc.ids, args.batch_size, lambda b: forward_last_logits(lm, b))

        plain()  # warm
        _, pw, pcpu = timed(plain)
        tokens = [float(np.mean([len(x) for x in e.ids])) for e in (clean, target)]
        print(json.dumps({"model": name, "shape": [lm.n_layers, lm.n_heads, lm.d_model], "prompts": built.n,
                          "shots": built.shots, "tokens_clean_target": [round(t, 1) for t in tokens],
                          "plain_pass_s": [round(pw, 3), round(pcpu, 3)], "load": os.getloadavg()}))
        common = {"shots": args.shots, "prompts": args.prompts, "seed": 0, "target": args.target,
                  "batch_size": args.batch_size}
        runs = [(s, "positions") for s in args.sites.split(",") if s] + ([("z", "heads")] if args.heads else [])
        for site, view in runs:
            r, w, cpu = timed(lambda: analyze("site_patching", lm, task, {**common, "site": site, "view": view},
                                              cache=False))
            grid, se, cols = ((r.recovered, r.recovered_se, r.columns) if view == "positions" else
                              (r.head_recovered, r.head_recovered_se, [f"H{h}" for h in range(lm.n_heads)]))
            cells = grid.size
            flat = np.argsort(-np.nan_to_num(grid, nan=-np.inf).ravel(), kind="stable")[:5]
            top = [f"L{r.layers[i // grid.shape[1]]} {cols[i % grid.shape[1]]}: {grid.flat[i]:.2f} "
                   f"± {se.flat[i]:.2f}" for i in flat]
            print(json.dumps({"model": name, "site": site, "view": view, "columns": cols if view == "positions"
                              else len(cols), "cells": cells, "wall_s": round(w, 2), "cpu_s": round(cpu, 2),
                              "x_plain": round(cpu / max(pcpu, 1e-9), 1),
                              "per_cell": round(cpu / max(pcpu, 1e-9) / cells, 3), "gap": round(r.gap, 4),
                              "top": top, "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
