"""Scoring pass vs plain forward pass on the same batch.

    python bench/bench_scores.py                  # GPT-2-small shape, CPU fp32, batch 16 x 128 tokens
    python bench/bench_scores.py --shape llama8b  # Llama-3.1-8B shape, bf16 on GPU, batch 32 x 256 tokens
    python bench/bench_scores.py --smoke          # a tiny shape, one rep: does it still run (the CI test)

Plain: one forward pass keeping only the last position's logits. Scoring: the same batch through
`head_maps` (the `maps` kind's pass: hooks capture each layer's last-token z, then TR / TL / DLA of every head
and the predictions). Both are timed alternately, after warm-up; the medians and their ratio are printed (wall clock,
per pair of runs, and the process's CPU seconds).
"""
from __future__ import annotations

import argparse
import json
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
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
