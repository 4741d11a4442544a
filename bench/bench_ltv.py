"""Learned task vectors on the default model: training time, batch size and threads, and the paper's table.

    python bench/bench_ltv.py                                   # all 10 tasks, batch 1, 2, 4, 8, one thread
    python bench/bench_ltv.py --tasks syn-sentiment --threads 1,2 --batch-sizes 1,4
    python bench/bench_ltv.py --units absolute --batch-sizes 1  # the reference recipe in absolute units
    python bench/bench_ltv.py --smoke                            # one task, one short epoch (the CI test)

Per (task, batch size, threads, units): one `ltv_train` at L/2 (the default recipe otherwise), uncached, in its
own cache folder; reports the training's own seconds (`train_seconds`), the whole call's wall time (split, residual
scale, training, saving), the steps and epochs run, and the vector's full-vocabulary accuracy on the task's held-out
queries (zero-shot prompts, the same ones every analysis scores) next to zero-shot. `--threads 1,2` trains with
each thread count in turn instead of the measured choice (primitives/threads.py `cpu_threads`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["HEADLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-ltv-")

import torch  # noqa: E402

from backend.analysis.kernel import analyze  # noqa: E402
from backend.analysis.primitives import threads as thread_choice  # noqa: E402
from backend.analysis.primitives.batching import encode  # noqa: E402
from backend.analysis.primitives.inject import Injection, evaluate_injections  # noqa: E402
from backend.model.loading import load_model  # noqa: E402
from backend.tasks.registry import load_task  # noqa: E402

TASKS = ("syn-sentiment", "syn-category", "syn-size", "syn-region", "syn-parity",
         "syn-antonym", "syn-plural", "syn-capital", "syn-successor", "syn-predecessor")


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--units", default="residual", choices=["residual", "absolute"])
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--epochs", type=int, default=None, help="fewer epochs for a quick per-step timing")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="syn-sentiment, batch 4, one epoch of 8 prompts (seconds)")
    a = ap.parse_args()
    small = {"train_prompts": 8, "val_prompts": 4} if a.smoke else {}
    if a.smoke:
        a.tasks, a.batch_sizes, a.threads, a.epochs = "syn-sentiment", "4", "1", 1
    lm = load_model("default")
    layer = lm.n_layers // 2
    rows = []
    for threads in ints(a.threads):
        torch.set_num_threads(threads)
        # this many threads, not the measured choice (primitives/threads.py `cpu_threads`)
        thread_choice.best_threads = lambda lm, max_age_s=0.0, n=threads: n
        for name in a.tasks.split(","):
            task = load_task(name)
            zero = encode(lm, task.build_prompts(0, task.n_queries(0), 0), task.kind)
            base = evaluate_injections(lm, zero, [Injection()]).summary(0)["accuracy"]
            for bs in ints(a.batch_sizes):
                extra = {**({"lr": a.lr} if a.lr else {}), **({"epochs": a.epochs} if a.epochs else {}), **small}
                t0 = time.perf_counter()
                r = analyze("ltv_train", lm, task, cache=False, batch_size=bs, units=a.units, **extra)
                wall = time.perf_counter() - t0
                theta = torch.as_tensor(r.theta[0], dtype=torch.float32)
                acc = evaluate_injections(lm, zero, [Injection({layer: theta})]).summary(0)["accuracy"]
                row = {"task": name, "threads": threads, "batch_size": bs, "units": a.units,
                       "train_seconds": round(r.train_seconds, 2), "wall_seconds": round(wall, 2),
                       "steps": len(r.loss), "ms_per_step": round(1000 * r.train_seconds / max(len(r.loss), 1), 1),
                       "epochs_run": r.epochs_run, "best_epoch": r.best_epoch,
                       "accuracy": acc, "zero_shot": base, "norm": round(r.norm[0], 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\nsummary (median train seconds, mean accuracy over tasks):")
    for threads in ints(a.threads):
        for bs in ints(a.batch_sizes):
            sel = [r for r in rows if r["threads"] == threads and r["batch_size"] == bs]
            if sel:
                print(f"threads {threads} batch {bs:>2}: train {statistics.median(r['train_seconds'] for r in sel):6.1f} s "
                      f"(max {max(r['train_seconds'] for r in sel):.1f}), wall max {max(r['wall_seconds'] for r in sel):.1f} s,"
                      f" accuracy {statistics.mean(r['accuracy'] for r in sel):.3f}, "
                      f"min {min(r['accuracy'] for r in sel):.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
