"""The forward pass at the processor's rate (issue 34, item 2): float32 options against the default, and bfloat16.

    nice -n 10 python bench/bench_precision.py                       # SmolLM2-135M, present-past, 8 shots, 16 prompts
    nice -n 10 python bench/bench_precision.py --model gemma3-270m --task sentiment
    nice -n 10 python bench/bench_precision.py --only mkl_t1,bf16_t1 --compile    # torch.compile too (slow to build)
    python bench/bench_precision.py --smoke                          # the tiny default model, 2 options, 1 rep

One batch of the task's real prompts (left-padded, as the kinds batch them) through `forward_last_logits`, the
plain pass every kind runs: for each option, after one warm-up, the median over `--reps` of the process's CPU
seconds (`time.process_time`, all threads) and of the wall seconds; GFLOP/s per CPU-second counts 2·in·out per token
for every decoder Linear, 4·T²·H·dh per row and layer for attention (scores and A·V, the full square, as SDPA with a
padding mask computes it) and the unembedding at the last position. Max |logit diff| and same argmax are against
`mkl_t1` (the product's default: MKL sgemm on one thread). Options:

- `mkl_t1`, `mkl_t2`: float32, torch's default Linear (MKL sgemm), 1 / 2 threads;
- `onednn_t1`, `onednn_t2`: float32, every decoder Linear through oneDNN with its weight pre-packed
  (`loading.OneDnnLinear`: `torch.ops.mkldnn._linear_pointwise`, dense in and out, so hooks and weight reads are
  unchanged; the `float32-onednn` precision);
- `to_mkldnn_t1`: `torch.utils.mkldnn.to_mkldnn` on each decoder layer (MkldnnLinear: weights become mkldnn tensors);
- `bf16math_t1`, `tf32math_t1`: float32 weights, `torch.backends.mkldnn.matmul.fp32_precision = "bf16"` / `"tf32"`
  (oneDNN's reduced-precision math modes for float32 matmuls: they change the numbers);
- `bf16_t1`, `bf16_t2`: the model in bfloat16 (this CPU has avx512_bf16, no AMX);
- `compile_t1` (`--compile`): `torch.compile` (inductor) of the float32 model, its build time reported apart.

`--maps`: bfloat16 against float32 on whole kinds, one thread, for each `--model` (a,b) and `--tasks` (a,b; default the
model's page task and one more): a plain pass over the prompts (CPU-s), `head_maps` uncached (CPU-s), and their
agreement: the top-k TR / TL sets' overlap (k: the page's top_k), each map's largest difference relative to the
float32 map's largest |value|, the share of heads whose bf16 mean lies outside float32's 95% bootstrap interval,
the significant sets' Jaccard overlap, and the ICL accuracy at both precisions.

`--toggles`: for each precision (float32, float32-onednn, bfloat16) on the first `--model` and `--task`: the Head
map (CPU-s; it keeps the prompts' clean prefix), then three toggles (`ablate`, positions `last`: one token step per
prompt over the kept prefix, 1, 2 and 3 of the top TR heads), their median CPU-s and whether the ablated accuracy
matches float32's.

The load (`uptime`) is printed before and after: on a shared machine CPU seconds are the fair measure.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.analysis.primitives.batching import built_and_encoded, forward_last_logits, make_batch  # noqa: E402
from backend.model.loading import LoadedModel, load_model, use_onednn  # noqa: E402
from backend.tasks.registry import load_task  # noqa: E402


def load() -> str:
    return os.getloadavg().__repr__()


def flops(lm: LoadedModel, batch) -> float:
    """FLOPs of one plain pass over `batch` (B, T): decoder Linears, attention's two products, the last unembedding."""
    B, T = batch.input_ids.shape
    lin = sum(m.in_features * m.out_features for m in lm.layers.modules() if isinstance(m, nn.Linear))
    attn = 4 * T * T * lm.n_heads * lm.head_dim * lm.n_layers
    return 2.0 * B * T * lin + B * attn + 2.0 * B * lm.unembed.shape[0] * lm.d_model


def variant(base: LoadedModel, option: str) -> tuple[LoadedModel, Callable[[], None]]:
    """(the model for `option`, a function undoing any global setting it made)."""
    undo = lambda: None  # noqa: E731
    kind = option.rsplit("_t", 1)[0]
    if kind in ("mkl", "bf16math", "tf32math", "compile"):
        lm = base
        if kind in ("bf16math", "tf32math"):
            old = torch.backends.mkldnn.matmul.fp32_precision
            torch.backends.mkldnn.matmul.fp32_precision = kind[:4]

            def undo() -> None:
                torch.backends.mkldnn.matmul.fp32_precision = old
        return lm, undo
    model = copy.deepcopy(base.model)
    if kind == "onednn":
        use_onednn(_get(model, base.spec.layers))  # what load_model(precision="float32-onednn") does
    elif kind == "to_mkldnn":
        from torch.utils import mkldnn

        layers = _get(model, base.spec.layers)
        for i in range(len(layers)):
            layers[i] = mkldnn.to_mkldnn(layers[i])
    elif kind == "bf16":
        return load_model(base.name, precision="bfloat16"), undo  # with the load's contiguous unembedding
    else:
        raise SystemExit(f"unknown option {option}")
    return LoadedModel(model=model, tokenizer=base.tokenizer, spec=base.spec, name=base.name,
                       fingerprint=base.fingerprint) if kind != "to_mkldnn" else _Bare(model, base), undo


def _get(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


class _Bare:
    """Enough of a LoadedModel for `forward_last_logits` (to_mkldnn's weights are unreadable as dense tensors)."""

    def __init__(self, model: nn.Module, base: LoadedModel):
        self.model, self.tokenizer, self.device = model, base.tokenizer, base.device


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="present-past")
    ap.add_argument("--shots", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="mkl_t1,mkl_t2,onednn_t1,onednn_t2,to_mkldnn_t1,bf16math_t1,tf32math_t1,"
                                      "bf16_t1,bf16_t2")
    ap.add_argument("--compile", action="store_true", help="add compile_t1 (inductor; builds for minutes here)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--maps", action="store_true", help="bf16 against float32 on head_maps (see the docstring)")
    ap.add_argument("--toggles", action="store_true",
                    help="each precision: a Head map (keeping the prompts' prefix), then 3 last-token toggles")
    ap.add_argument("--tasks", default=None, help="--maps: tasks, comma-separated (default: the page's and one more)")
    a = ap.parse_args()
    if a.maps:
        return maps(a)
    if a.toggles:
        return toggles(a)
    if a.smoke:
        a.model, a.task, a.prompts, a.reps, a.only, a.shots = "default", "syn-sentiment", 4, 1, "mkl_t1,onednn_t1", 2
    print(f"load before {load()}", flush=True)
    base = load_model(a.model)
    _, enc = built_and_encoded(base, load_task(a.task), a.shots, a.prompts, 0)
    batch = make_batch(base, enc.ids, list(range(len(enc.ids))))
    gflop = flops(base, batch) / 1e9
    print(f"{a.model} {a.task} {a.shots} shots: batch {tuple(batch.input_ids.shape)}, {gflop:.1f} GFLOP a pass",
          flush=True)
    options = [o for o in a.only.split(",") if o] + (["compile_t1"] if a.compile else [])
    ref = None
    rows = []
    for option in ["mkl_t1"] + [o for o in options if o != "mkl_t1"]:
        threads = int(option.rsplit("_t", 1)[1])
        torch.set_num_threads(threads)
        lm, undo = variant(base, option)
        build = None
        with torch.inference_mode():
            if option.startswith("compile"):
                compiled = torch.compile(lm.model, dynamic=False)
                lm = _Bare(compiled, base)
                t = time.perf_counter()
                forward_last_logits(lm, batch)
                build = time.perf_counter() - t
            logits = forward_last_logits(lm, batch)  # warm-up
            cpu, wall = [], []
            for _ in range(a.reps):
                c, w = time.process_time(), time.perf_counter()
                logits = forward_last_logits(lm, batch)
                cpu.append(time.process_time() - c)
                wall.append(time.perf_counter() - w)
        undo()
        logits = logits.float()
        if ref is None:
            ref = logits
        c, w = statistics.median(cpu), statistics.median(wall)
        row = {"option": option, "threads": threads, "cpu_s": round(c, 3), "wall_s": round(w, 3),
               "gflops_per_cpu_s": round(gflop / c, 1), "gflops_per_wall_s": round(gflop / w, 1),
               "speedup_cpu": round(rows[0]["cpu_s"] / c, 2) if rows else 1.0,
               "max_logit_diff": float((logits - ref).abs().max()),
               "same_argmax": bool((logits.argmax(-1) == ref.argmax(-1)).all()),
               **({"compile_s": round(build, 1)} if build is not None else {})}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del lm
    print(f"load after {load()}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"model": a.model, "task": a.task, "shots": a.shots,
                                            "batch": list(batch.input_ids.shape), "gflop": gflop, "rows": rows},
                                           indent=1))


def toggles(a: argparse.Namespace) -> None:
    import numpy as np

    from backend.analysis.kernel import analyze

    torch.set_num_threads(1)
    print(f"load before {load()}", flush=True)
    name, task = a.model.split(",")[0], load_task(a.task)
    heads = None
    for prec in ("float32", "float32-onednn", "bfloat16"):
        lm = load_model(name, precision=prec)
        c = time.process_time()
        r = analyze("head_maps", lm, task, cache=False, shots=a.shots, prompts=a.prompts, seed=0)
        maps_s = time.process_time() - c
        if heads is None:  # float32's top TR heads, the same sets for every precision
            order = np.argsort(-np.asarray(r.tr), axis=None)[:3]
            heads = [[int(v) for v in np.unravel_index(i, np.asarray(r.tr).shape)] for i in order]
        cpu, acc = [], []
        for k in (1, 2, 3):
            c = time.process_time()
            t = analyze("ablate", lm, task, cache=False, shots=a.shots, prompts=a.prompts, seed=0, heads=heads[:k],
                        positions="last")
            cpu.append(time.process_time() - c)
            acc.append(t.after.accuracy)
        print(json.dumps({"model": name, "task": a.task, "precision": prec, "maps_cpu_s": round(maps_s, 2),
                          "toggle_cpu_s": round(statistics.median(cpu), 3), "toggles_cpu_s": [round(x, 3) for x in cpu],
                          "ablated_accuracy": acc}), flush=True)
        del lm
    print(f"load after {load()}", flush=True)


SECOND_TASK = {"smollm2-135m": "sentiment", "gemma3-270m": "topic", "default": "syn-copy"}


def _top(grid, k: int) -> set[tuple[int, int]]:
    import numpy as np

    g = np.asarray(grid)
    flat = np.argsort(-g, axis=None, kind="stable")[:k]
    return {tuple(int(v) for v in np.unravel_index(i, g.shape)) for i in flat}


def agreement(f32, b16, k: int) -> dict:
    """bf16 against float32 on one task's head maps: top-k overlap, largest scale-relative difference, the share of
    heads outside float32's 95% bootstrap interval, the significant sets' Jaccard overlap (TR and TL)."""
    import numpy as np

    out = {}
    for m in ("tr", "tl"):
        a, b = np.asarray(getattr(f32, m)), np.asarray(getattr(b16, m))
        sf, sb = f32.stats[m], b16.stats[m]
        lo, hi = np.asarray(sf.ci_low), np.asarray(sf.ci_high)
        sig_f, sig_b = {tuple(h) for h in sf.significant or []}, {tuple(h) for h in sb.significant or []}
        out[m] = {"top_k": k, "top_overlap": len(_top(a, k) & _top(b, k)) / k,
                  "max_rel_diff": float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)),
                  "outside_ci": float(((b < lo) | (b > hi)).mean()),
                  "ci_halfwidth_rel": float(((hi - lo) / 2).mean() / max(np.abs(a).max(), 1e-30)),
                  "sig_jaccard": len(sig_f & sig_b) / max(1, len(sig_f | sig_b)),
                  "n_sig": [len(sig_f), len(sig_b)]}
    out["accuracy"] = [f32.icl.accuracy, b16.icl.accuracy]
    return out


def maps(a: argparse.Namespace) -> None:
    from backend.analysis.kernel import analyze
    from ui.model_defaults import DEFAULTS

    torch.set_num_threads(1)
    print(f"load before {load()}", flush=True)
    rows = []
    for name in a.model.split(","):
        d = DEFAULTS.get(name, DEFAULTS["default"])
        tasks = a.tasks.split(",") if a.tasks else [d["task"], SECOND_TASK.get(name, "sentiment")]
        k = int(d.get("top_k") or 10)
        lms = {prec: load_model(name, precision=prec) for prec in ("float32", "bfloat16")}
        for task_name in tasks:
            task = load_task(task_name)
            got, row = {}, {"model": name, "task": task_name, "shots": a.shots, "prompts": a.prompts}
            for prec, lm in lms.items():
                _, enc = built_and_encoded(lm, task, a.shots, a.prompts, 0)
                order = sorted(range(len(enc.ids)), key=lambda i: -len(enc.ids[i]))
                c = time.process_time()
                with torch.inference_mode():
                    for s in range(0, len(order), 16):
                        forward_last_logits(lm, make_batch(lm, enc.ids, order[s:s + 16]))
                row[f"plain_cpu_s_{prec}"] = round(time.process_time() - c, 2)
                c = time.process_time()
                got[prec] = analyze("head_maps", lm, task, cache=False, shots=a.shots, prompts=a.prompts, seed=0)
                row[f"maps_cpu_s_{prec}"] = round(time.process_time() - c, 2)
            row.update(agreement(got["float32"], got["bfloat16"], k))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"load after {load()}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
