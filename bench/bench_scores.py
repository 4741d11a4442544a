"""Scoring pass vs plain forward pass on the same batch.

    python bench/bench_scores.py                  # GPT-2-small shape, CPU fp32, batch 16 x 128 tokens
    python bench/bench_scores.py --shape llama8b  # Llama-3.1-8B shape, bf16 on GPU, batch 32 x 256 tokens
    python bench/bench_scores.py --smoke          # a tiny shape, one rep: does it still run (the CI test)
    python bench/bench_scores.py --stats --model default --prompts 32            # the maps' statistics' cost
    HEADLENS_MODELS_DIR=... python bench/bench_scores.py --stats --model smollm2-135m --prompts 32

`--stats`: the `maps` kind's scoring pass without its statistics (`head_maps` as before) against the same pass with
them (`null_seed`: TR onto the random label subspaces in the pass; then the SE, bootstrap intervals, TR / TL tests
with BH, and the top-k stability of TR and TL, as `maps` and `scores` compute them), timed alternately; `--model`:
a preset's real prompts of `--task` (shots, prompts) instead of a random shape.

Plain: one forward pass keeping only the last position's logits. Scoring: the same batch through
`head_maps` (the `maps` kind's pass: hooks capture each layer's last-token z, then TR / TL / DLA of every head
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
from backend.analysis.tsla.head_maps import head_maps  # noqa: E402
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
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--shots", type=int, default=4)
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
        head_maps(lm, enc, batch_size=batch)

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
    """The scoring pass without and with the maps' statistics, alternately (`--stats`)."""
    from backend import load_model
    from backend.analysis.primitives import map_stats
    from backend.analysis.primitives.batching import build_prompts, encode
    from backend.analysis.primitives.selection import n_top
    from backend.analysis.results import pack_array
    from backend.analysis.tsla.scores import head_stats
    from backend.tasks.registry import load_task

    if a.model:
        lm, task = load_model(a.model), load_task(a.task)
        enc = encode(lm, build_prompts(lm, task, a.shots, a.prompts, 0).prompts, task.kind)
        batch = a.batch or 16
    else:
        shape = SHAPES["tiny" if a.smoke else a.shape]
        torch.manual_seed(0)
        model = T.AutoModelForCausalLM.from_config(shape["cfg"](), attn_implementation="sdpa")
        lm, batch = wrap(model, _Tok(), f"random-{a.shape}"), a.batch or shape["batch"]
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(1, model.config.vocab_size, (a.prompts, a.seq or shape["seq"]), generator=g).tolist()
        labels = torch.randint(1, model.config.vocab_size, (a.labels,), generator=g).tolist()
        enc = Encoded([], ids, [labels] * len(ids), [i % a.labels for i in range(len(ids))], "classification")
    k = n_top(lm.n_layers, lm.n_heads, 5.0, None)

    def without() -> None:
        head_maps(lm, enc, batch_size=batch)

    def with_stats() -> None:
        hm = head_maps(lm, enc, batch_size=batch, null_seed=0)
        head_stats(hm.per_prompt, hm.tr, hm.null_tr, 0)
        {n: pack_array(v) for n, v in hm.per_prompt.items()}
        for name in ("tr", "tl"):
            map_stats.stability(hm.per_prompt[name], k, seed=0)

    without(), with_stats()  # warm-up
    times: dict[str, list[float]] = {"without": [], "with": []}
    cpu: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(1 if a.smoke else a.reps):
        for name, f in (("without", without), ("with", with_stats)):
            sync(lm.device)
            t, c = time.perf_counter(), time.process_time()
            f()
            sync(lm.device)
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    med = statistics.median
    rest = None
    if a.model:  # the rest of the `maps` kind, the same with or without statistics: zero-shot pass and induction
        from backend.analysis.primitives import induction
        from backend.analysis.primitives.predict import evaluate

        zenc = encode(lm, task.build_prompts(0, len(enc.ids), 0), task.kind)
        rt = []
        for _ in range(1 if a.smoke else 3):
            induction._MEMO.clear()
            t = time.perf_counter()
            evaluate(lm, zenc, batch)
            induction.induction_scores(lm)
            rt.append(time.perf_counter() - t)
        rest = med(rt)
    res = {"model": a.model or ("tiny" if a.smoke else a.shape), "task": a.task if a.model else None, "prompts": len(enc.ids),
           "shots": a.shots if a.model else None, "batch": batch, "heads": lm.n_layers * lm.n_heads,
           "without_s": round(med(times["without"]), 3), "with_s": round(med(times["with"]), 3),
           "ratio": round(med(times["with"]) / med(times["without"]), 3),
           "pair_ratio": round(med(w / o for o, w in zip(times["without"], times["with"])), 3),
           "cpu_ratio": round(med(cpu["with"]) / med(cpu["without"]), 3), "reps": len(times["with"]),
           "rest_of_kind_s": None if rest is None else round(rest, 3),
           "kind_ratio": None if rest is None else round((med(times["with"]) + rest) / (med(times["without"]) + rest), 3),
           "torch_threads": torch.get_num_threads(), "load_avg": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(res))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
