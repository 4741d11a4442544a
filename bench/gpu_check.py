"""The GPU path, checked in minutes (issue 35): SmolLM2-135M on cuda in bfloat16 and float32, and bfloat16 through
`device_map="auto"` (accelerate's hooks, the path a model spread over GPUs takes), each against CPU float32.

    python bench/gpu_check.py                        # on a machine with a GPU (SmolLM2-135M pulled)
    python bench/gpu_check.py --model gemma3-270m --json /tmp/gpu.json
    python bench/gpu_check.py --smoke                # no GPU: the tiny default model, CPU bf16 and device_map="cpu"

For each setting, uncached (`kernel.analyze(..., cache=False)`), after one warm-up Head map:
    head map   head_maps, `--shots` shots, `--prompts` prompts
    toggle     ablate, CPU float32's top 2 TR heads, at the last token (over the prefix the Head map kept)
    curve      ablation_curves, orders tr + random, ks 0, 2, 4, one random seed, at the last token
its wall seconds (CUDA synchronised) and its largest differences to CPU float32: the TR and TL maps' largest
|difference| over the reference map's largest |value|, the accuracies (ICL, after the toggle, along the curves) and
whether the top 2 TR heads agree. A GPU's bf16 is not bit-identical to the CPU's float32: the figures say by how much.
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

from backend.analysis.kernel import analyze  # noqa: E402
from backend.model.loading import load_model  # noqa: E402
from backend.tasks.registry import load_task  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def top(grid, k: int) -> list[list[int]]:
    g = np.asarray(grid, dtype=np.float64)
    flat = np.argsort(-g, axis=None, kind="stable")[:k]
    return [[int(v) for v in np.unravel_index(i, g.shape)] for i in flat]


def run(lm, task, a, heads: list[list[int]] | None) -> dict:
    """The three jobs on `lm`: their results and wall seconds."""
    dev = str(lm.device)
    base = {"shots": a.shots, "prompts": a.prompts, "seed": 0}
    analyze("head_maps", lm, task, cache=False, **{**base, "seed": 1})  # warm-up (kernels, the thread probe)
    out = {}
    for name, kind, params in (("head map", "head_maps", base),
                               ("toggle", "ablate", {**base, "positions": "last"}),
                               ("curve", "ablation_curves", {**base, "orders": ["tr", "random"], "ks": [0, 2, 4],
                                                             "random_seeds": [0], "positions": "last"})):
        if kind == "ablate":
            params = {**params, "heads": heads or top(out["head map"][0].tr, 2)}
        sync(dev)
        t = time.perf_counter()
        r = analyze(kind, lm, task, cache=False, **params)
        sync(dev)
        out[name] = (r, time.perf_counter() - t)
    return out


def rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def compare(got: dict, ref: dict) -> dict:
    """Largest differences of `got` to the reference (CPU float32) results."""
    m, mr = got["head map"][0], ref["head map"][0]
    t, tr = got["toggle"][0], ref["toggle"][0]
    c, cr = got["curve"][0], ref["curve"][0]
    curve = max(abs(x - y) for o in cr.curves for x, y in zip(c.curves[o].accuracy, cr.curves[o].accuracy))
    return {"tr_max_rel_diff": round(rel(m.tr, mr.tr), 5), "tl_max_rel_diff": round(rel(m.tl, mr.tl), 5),
            "top2_tr_same": top(m.tr, 2) == top(mr.tr, 2),
            "icl_accuracy_diff": round(abs(m.icl.accuracy - mr.icl.accuracy), 4),
            "toggle_accuracy_diff": round(abs(t.after.accuracy - tr.after.accuracy), 4),
            "curve_accuracy_max_diff": round(curve, 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="antonym")
    ap.add_argument("--shots", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--json", default="")
    ap.add_argument("--smoke", action="store_true", help="the tiny default model on the CPU (no GPU needed)")
    a = ap.parse_args()
    if a.smoke:
        a.model, a.task, a.shots, a.prompts = "default", "syn-sentiment", 2, 4
        settings = [("cpu", "bfloat16", None), ("cpu", "float32", "cpu")]  # device_map's load path, on the CPU
    elif not torch.cuda.is_available():
        print("no CUDA device here: bench/gpu_check.py needs a GPU (--smoke runs its path on the CPU)")
        return 2
    else:
        settings = [("cuda", "bfloat16", None), ("cuda", "float32", None), ("cuda", "bfloat16", "auto")]
        print(f"GPU: {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}, torch {torch.__version__}",
              flush=True)
    task = load_task(a.task)
    t = time.perf_counter()
    ref_lm = load_model(a.model, device="cpu", precision="float32")
    print(f"{a.model} on cpu float32: loaded in {time.perf_counter() - t:.1f} s", flush=True)
    ref = run(ref_lm, task, a, None)
    heads = ref["toggle"][0].heads
    heads = [list(h) for h in heads]
    rows = [{"device": "cpu", "precision": "float32", "device_map": None,
             **{f"{k.replace(' ', '_')}_s": round(v[1], 3) for k, v in ref.items()}}]
    print(json.dumps(rows[0]), flush=True)
    del ref_lm
    for device, precision, device_map in settings:
        t = time.perf_counter()
        lm = load_model(a.model, device=device, precision=precision, device_map=device_map)
        load_s = time.perf_counter() - t
        got = run(lm, task, a, heads)
        row = {"device": str(lm.device), "precision": precision, "device_map": device_map,
               "hf_device_map": sorted({str(v) for v in (getattr(lm.model, "hf_device_map", None) or {}).values()}),
               "load_s": round(load_s, 2), **{f"{k.replace(' ', '_')}_s": round(v[1], 3) for k, v in got.items()},
               **compare(got, ref)}
        if device.startswith("cuda"):
            row["max_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
            torch.cuda.reset_peak_memory_stats()
        rows.append(row)
        print(json.dumps(row), flush=True)
        del lm
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "task": a.task, "shots": a.shots,
                                            "prompts": a.prompts, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
