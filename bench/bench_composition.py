"""Composition scores (kind `composition`) on real models: its time, and the top V-composition pairs into the top TL
heads.

    HEADLENS_MODELS_DIR=models/pulled python bench/bench_composition.py --model smollm2-135m,gemma3-270m
    python bench/bench_composition.py --smoke     # the embedded model, 2 shots, 6 prompts: does it still run (CI)

Per model: `head_scores` (the receivers' source, cold) and then `composition` on the same in-memory cache (its own
time: weights only, the cached head scores read back), each timed (wall and process CPU seconds); then the full
(L H, L H) matrices of every mode through the same primitives, timed, whatever the kind's FULL_MAX_HEADS. Printed
as JSON lines and a markdown table of the top V-composition senders into each top TL head.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--task", default="sentiment")
    ap.add_argument("--shots", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--smoke", action="store_true", help="the embedded model, syn-sentiment, 2 shots, 6 prompts")
    args = ap.parse_args()
    if args.smoke:
        args.model, args.task, args.shots, args.prompts = "default", "syn-sentiment", 2, 6
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from backend import load_model
    from backend.analysis.general.composition import _layers
    from backend.analysis.kernel import analyze
    from backend.analysis.primitives import composition as comp
    from backend.tasks.registry import load_task

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from kind_cases import MemoryStore

    print(json.dumps({"load": os.getloadavg(), "threads": torch.get_num_threads()}))
    for name in args.model.split(","):
        lm = load_model(name)
        task, store = load_task(args.task), MemoryStore()
        common = {"shots": args.shots, "prompts": args.prompts, "seed": 0}
        sc, sw, scpu = timed(lambda: analyze("head_scores", lm, task, {**common, "top_k": args.top_k}, cache=store))
        r, cw, ccpu = timed(lambda: analyze("composition", lm, task, {**common, "top_k": args.top_k}, cache=store))
        layers = _layers(lm, True)
        every = [(l, h) for l in range(lm.n_layers) for h in range(lm.n_heads)]
        senders = [comp.sender_factors(w) for w in layers]
        _, fw, fcpu = timed(lambda: [comp.composition_matrix(layers, every, m, senders=senders) for m in comp.MODES])
        print(json.dumps({"model": name, "shape": [lm.n_layers, lm.n_heads, lm.n_kv_heads, lm.head_dim, lm.d_model],
                          "head_scores_s": [round(sw, 2), round(scpu, 2)], "composition_s": [round(cw, 2),
                          round(ccpu, 2)], "full_all_modes_s": [round(fw, 2), round(fcpu, 2)],
                          "receivers": len(r.heads), "full_in_result": r.full is not None, "top_tl": sc.top_tl,
                          "ov_head": r.head, "labels": r.labels, "copying": r.copying,
                          "copy_margin": round(r.copy_margin, 4), "linearised": r.linearised,
                          "load": os.getloadavg()}))
        print(f"\n{name}: top V-composition senders into the top TL heads ({args.task}, {args.shots} shots, "
              f"{args.prompts} prompts; mean = the receiver's mean over every earlier head)\n")
        print("| receiver (TL rank) | sender: V-comp (z) | mean |")
        print("|---|---|---|")
        for rank, rec in enumerate(sc.top_tl, 1):
            j = r.heads.index(tuple(rec))
            fs = [f for f in r.feeders if f.mode == "v" and f.receiver == tuple(rec)]
            cells = ", ".join(f"L{f.sender[0]}.H{f.sender[1]}: {f.score:.3f} ({f.z:.1f})" for f in fs[:5])
            mean = r.mean["v"][j]
            print(f"| L{rec[0]}.H{rec[1]} ({rank}) | {cells or 'none (layer 0)'} | "
                  f"{'-' if mean is None else f'{mean:.3f}'} |")
        print()


if __name__ == "__main__":
    main()
