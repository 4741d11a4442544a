"""The sequential TR null against every draw for every head, on the page defaults of real models.

    HEADLENS_MODELS_DIR=models/pulled python bench/check_sequential_null.py --model smollm2-135m,gemma3-270m
    python bench/check_sequential_null.py --smoke     # the embedded model, 12 prompts: does it still run (the CI test)

Per model: its page default (task, shots, prompts: `ui/model_defaults.py`), one scoring pass with the TR null after
the pass, sequential (`tr_null.sequential_null`: the product's), and one with every draw for every head during the
pass (`scoring_pass.WRITES_BYTES = 0`). Prints the heads that stopped, the significant sets (q <= 0.05) of both and
whether they are equal, the largest p difference over the heads that did not stop (rounding only: the same draws)
and over those that did (their Monte Carlo error from FIRST_DRAWS draws), and the CPU seconds of both passes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="the embedded model, 2 shots, 12 prompts (seconds)")
    a = ap.parse_args()
    if a.smoke:
        a.model = "default"
    torch.set_num_threads(a.threads)
    from backend import load_model
    from backend.analysis.primitives import map_stats
    from backend.analysis.primitives.batching import build_prompts, encode
    from backend.analysis.tsla import scoring_pass
    from backend.analysis.tsla.head_scores import head_stats
    from backend.tasks.registry import load_task
    from ui.model_defaults import defaults_for

    for name in a.model.split(","):
        d = defaults_for(name)
        if a.smoke:
            d = dict(d, shots=2, prompts=12)
        lm, task = load_model(name), load_task(d["task"])
        enc = encode(lm, build_prompts(lm, task, d["shots"], d["prompts"], 0).prompts, task.kind)
        runs = {}
        for how, budget in (("every draw", 0), ("sequential", scoring_pass.WRITES_BYTES)):
            old, scoring_pass.WRITES_BYTES = scoring_pass.WRITES_BYTES, budget
            t = time.process_time()
            with torch.inference_mode():
                hm = scoring_pass.score_heads(lm, enc, batch_size=16, null_seed=0)
            cpu = time.process_time() - t
            scoring_pass.WRITES_BYTES = old
            st = head_stats(hm.per_prompt, hm.tr, hm.null_tr, 0)["tr"]
            runs[how] = (hm, st, cpu)
        (fa, sa, ca), (fs, ss, cs) = runs["every draw"], runs["sequential"]
        stopped = ~np.isfinite(fs.null_tr).all(0)
        pa, ps = map_stats.tr_p(fa.tr, fa.null_tr), map_stats.tr_p(fs.tr, fs.null_tr)
        sig_a = sorted(map(tuple, sa["significant"] or []))
        sig_s = sorted(map(tuple, ss["significant"] or []))
        print(json.dumps({
            "model": name, "task": d["task"], "shots": d["shots"], "prompts": d["prompts"],
            "heads": int(stopped.size), "draws": int(fa.null_tr.shape[0]), "stopped": int(stopped.sum()),
            "significant_every_draw": len(sig_a), "significant_sequential": len(sig_s), "same_sets": sig_a == sig_s,
            "max_p_diff_kept": float(np.abs(pa - ps)[~stopped].max()) if (~stopped).any() else 0.0,
            "max_p_diff_stopped": float(np.abs(pa - ps)[stopped].max()) if stopped.any() else 0.0,
            "min_p_stopped": float(ps[stopped].min()) if stopped.any() else None,
            "cpu_s_every_draw": round(ca, 2), "cpu_s_sequential": round(cs, 2),
            "load_avg": [round(x, 2) for x in __import__("os").getloadavg()]}), flush=True)


if __name__ == "__main__":
    main()
