"""Scoring pass vs plain forward pass on the same batch.

    python bench/bench_scores.py                  # GPT-2-small shape, CPU fp32, batch 16 x 128 tokens
    python bench/bench_scores.py --shape llama8b  # Llama-3.1-8B shape, bf16 on GPU, batch 32 x 256 tokens
    python bench/bench_scores.py --smoke          # a tiny shape, one rep: does it still run (the CI test)
    python bench/bench_scores.py --stats --model default --task syn-sentiment    # the maps' statistics' cost
    HEADLENS_MODELS_DIR=... python bench/bench_scores.py --stats --defaults --model smollm2-135m,gemma3-270m
    HEADLENS_MODELS_DIR=... python bench/bench_scores.py --stats --grid --model smollm2-135m --prompts 16

`--stats` (one torch thread unless `--threads`): in CPU seconds (`time.process_time`), the scoring pass as the
`maps` / `scores` kinds run it (`score_heads` with the TR null, then the SE, bootstrap intervals, TR / TL tests with
BH, packing, the top-k stability of TR and TL) against a plain pass (the forward passes alone over the same
batches): `cpu_ratio` is the headline; `pass_cpu_ratio` is `score_heads` without the null; wall-clock ratios beside
(on a shared CPU they measure the load); `--model`: a preset's real prompts of `--task` instead of a random shape;
`--defaults`: each model's page default (`ui/model_defaults.py`); `--grid`: every built-in task x 2, 4, 8 shots.

Plain: one forward pass keeping only the last position's logits. Scoring: the same batch through
`score_heads` (the `maps` kind's pass: hooks capture each layer's last-token z, then TR / TL / DLA of every head
and the predictions). Both are timed alternately, after warm-up; the medians and their ratio are printed (wall clock,
per pair of runs, and the process's CPU seconds).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers as T

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backend.analysis.primitives.batching import Encoded, forward_last_logits, make_batch  # noqa: E402
from backend.analysis.tsla.scoring_pass import score_heads  # noqa: E402
from backend.model.loading import wrap  # noqa: E402

SHAPES = {
    "gpt2-small": dict(cfg=lambda: T.GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024),
                       batch=16, seq=128),
    "llama8b": dict(cfg=lambda: T.LlamaConfig(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                              hidden_size=4096, intermediate_size=14336, vocab_size=128256,
                                              max_position_embeddings=8192, rope_theta=500000.0),
                    batch=32, seq=256),
    "tiny": dict(cfg=lambda: T.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=500, n_positions=64,
                                          bos_token_id=0, eos_token_id=0),
                 batch=2, seq=8),
}


class _Tok:
    """Just enough of a tokenizer for pre-tokenised input."""

    pad_token_id = 0
    pad_token = "<pad>"


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gpt2-small")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=["fp32", "bf16"])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--labels", type=int, default=4)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="the tiny shape, one rep (seconds)")
    ap.add_argument("--stats", action="store_true", help="time the scoring pass without and with the statistics")
    ap.add_argument("--model", default=None, help="a preset (e.g. default, smollm2-135m) instead of --shape")
    ap.add_argument("--task", default="syn-sentiment")
    ap.add_argument("--prompts", type=int, default=None, help="default: 32; the page's with --defaults; 16 --grid")
    ap.add_argument("--shots", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="--stats: torch threads (the service's default: 1)")
    ap.add_argument("--defaults", action="store_true", help="--stats: the page defaults of each --model (a,b)")
    ap.add_argument("--grid", action="store_true", help="--stats: every built-in task of --model x --shots-grid")
    ap.add_argument("--shots-grid", type=int, nargs="+", default=[2, 4, 8])
    a = ap.parse_args()
    if a.stats:
        return stats_cost(a)
    if a.smoke:
        a.shape, a.reps = "tiny", 1
    shape = SHAPES[a.shape]
    batch, seq = a.batch or shape["batch"], a.seq or shape["seq"]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype or ("bf16" if a.device.startswith("cuda") else "fp32")]
    torch.manual_seed(0)
    with torch.device(a.device):
        model = T.AutoModelForCausalLM.from_config(shape["cfg"](), dtype=dtype, attn_implementation="sdpa")
    lm = wrap(model, _Tok(), f"random-{a.shape}")
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (batch, seq), generator=g).tolist()
    labels = torch.randint(1, vocab, (a.labels,), generator=g).tolist()
    enc = Encoded(prompts=[], ids=ids, label_ids=[labels] * batch, gold=[i % a.labels for i in range(batch)],
                  kind="classification")
    b = make_batch(lm, ids, list(range(batch)))

    def plain() -> None:
        with torch.inference_mode():
            forward_last_logits(lm, b)

    def scoring() -> None:
        score_heads(lm, enc, batch_size=batch)

    for f in (plain, scoring, plain, scoring):  # warm-up
        f()
    times: dict[str, list[float]] = {"plain": [], "scoring": []}
    cpu: dict[str, list[float]] = {"plain": [], "scoring": []}
    for _ in range(a.reps):
        for name, f in (("plain", plain), ("scoring", scoring)):
            sync(lm.device)
            t, c = time.perf_counter(), time.process_time()
            f()
            sync(lm.device)
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    med = statistics.median
    p, s = med(times["plain"]), med(times["scoring"])
    pc, sc = med(cpu["plain"]), med(cpu["scoring"])
    res = {"shape": a.shape, "device": a.device, "dtype": str(dtype), "batch": batch, "seq": seq,
           "plain_s": round(p, 4), "scoring_s": round(s, 4), "ratio": round(s / p, 3),
           # on a CPU shared with other work, wall time waits for the CPU: the per-pair ratio (each rep times
           # plain then scoring back to back) and the process's CPU seconds are steadier figures
           "pair_ratio": round(med(b_ / a_ for a_, b_ in zip(times["plain"], times["scoring"])), 3),
           "plain_cpu_s": round(pc, 4), "scoring_cpu_s": round(sc, 4), "cpu_ratio": round(sc / pc, 3),
           "torch_threads": torch.get_num_threads(),
           "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None}
    print(json.dumps(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


def stats_cost(a: argparse.Namespace) -> None:
    """The scoring pass with its statistics against a plain pass over the same batches, in CPU seconds (`--stats`):
    one JSON line per setting (`--defaults`: both real models' page defaults; `--grid`: every built-in task of the
    model x `--shots-grid`)."""
    from backend.tasks.registry import model_tasks

    torch.set_num_threads(a.threads)
    if a.model and (a.defaults or a.grid):
        from ui.model_defaults import DEFAULTS

        runs = [(m, DEFAULTS[m]["task"], DEFAULTS[m]["shots"], a.prompts or DEFAULTS[m]["prompts"])
                for m in a.model.split(",")] if a.defaults else [
            (a.model, t.name, s, a.prompts or 16) for t in model_tasks(a.model) for s in a.shots_grid]
    else:
        runs = [(a.model, a.task, a.shots, a.prompts or 32)]
    lms: dict = {}
    for model, task, shots, prompts in runs:
        res = stats_run(a, lms, model, task, shots, prompts)
        print(json.dumps(res), flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(res) + "\n")


def stats_run(a: argparse.Namespace, lms: dict, model: str | None, task_name: str, shots: int,
              prompts: int) -> dict:
    """One setting: plain (the forward passes alone, `forward_last_logits` over score_heads' batches), pass
    (`score_heads` without the TR null) and scoring (`score_heads` with it, then everything `maps` and `scores` add:
    `head_stats`, packing, top-k stability), timed in turn after a warm-up; medians of CPU and wall seconds."""
    from backend import load_model
    from backend.analysis.primitives import map_stats
    from backend.analysis.primitives.batching import build_prompts, encode, map_batches
    from backend.analysis.primitives.selection import n_top
    from backend.analysis.results import pack_array
    from backend.analysis.tsla.head_scores import head_stats
    from backend.tasks.registry import load_task

    if model:
        lm = lms[model] = lms.get(model) or load_model(model)
        task = load_task(task_name)
        enc = encode(lm, build_prompts(lm, task, shots, prompts, 0).prompts, task.kind)
    else:
        shape = SHAPES["tiny" if a.smoke else a.shape]
        torch.manual_seed(0)
        m = T.AutoModelForCausalLM.from_config(shape["cfg"](), attn_implementation="sdpa")
        lm = wrap(m, _Tok(), f"random-{a.shape}")
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(1, m.config.vocab_size, (prompts, a.seq or shape["seq"]), generator=g).tolist()
        labels = torch.randint(1, m.config.vocab_size, (a.labels,), generator=g).tolist()
        enc = Encoded([], ids, [labels] * len(ids), [i % a.labels for i in range(len(ids))], "classification")
    batch = a.batch or 16
    k = n_top(lm.n_layers, lm.n_heads, 5.0, None)

    def plain() -> None:
        map_batches(lm, enc.ids, batch, lambda b: forward_last_logits(lm, b))

    def pass_() -> None:
        score_heads(lm, enc, batch_size=batch)

    def scoring() -> None:
        hm = score_heads(lm, enc, batch_size=batch, null_seed=0)
        head_stats(hm.per_prompt, hm.tr, hm.null_tr, 0)
        {n: pack_array(v) for n, v in hm.per_prompt.items()}
        for name in ("tr", "tl"):
            map_stats.stability(hm.per_prompt[name], k, seed=0)

    arms = {"plain": plain, "pass": pass_, "scoring": scoring}
    for f in arms.values():  # warm-up
        f()
    wall: dict[str, list[float]] = {n: [] for n in arms}
    cpu: dict[str, list[float]] = {n: [] for n in arms}
    for _ in range(1 if a.smoke else a.reps):
        for name, f in arms.items():
            sync(lm.device)
            t, c = time.perf_counter(), time.process_time()
            f()
            sync(lm.device)
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    med = statistics.median
    pc = med(cpu["plain"])
    return {"model": model or ("tiny" if a.smoke else a.shape), "task": task_name if model else None,
            "shots": shots if model else None, "prompts": len(enc.ids), "tokens": sum(len(x) for x in enc.ids),
            "labels": max(len(x) for x in enc.label_ids), "label_sets": len({tuple(x) for x in enc.label_ids}),
            "heads": lm.n_layers * lm.n_heads, "batch": batch,
            # the headline: the scoring pass with its statistics / the plain pass, CPU seconds
            "cpu_ratio": round(med(cpu["scoring"]) / pc, 3), "pass_cpu_ratio": round(med(cpu["pass"]) / pc, 3),
            **{f"{n}_cpu_s": round(med(v), 3) for n, v in cpu.items()},
            "wall_ratio": round(med(wall["scoring"]) / med(wall["plain"]), 3),
            "pair_cpu_ratio": round(med(s / p for p, s in zip(cpu["plain"], cpu["scoring"])), 3),
            "reps": len(cpu["plain"]), "torch_threads": torch.get_num_threads(),
            "load_avg": [round(x, 2) for x in os.getloadavg()]}


if __name__ == "__main__":
    main()
