"""Seconds per token through a loaded model here: what turns a job's work (tokens, `cost.py`) into seconds.

Measured once per model, device, dtype and thread count: one batched forward pass of ROWS x TOKENS random
tokens after a short warm-up pass (WARMUP tokens), divided by the tokens. It reads the machine as it is at that
moment: on a CPU shared with other work, the figure (and the jobs) are slower. Batched, as the analyses run, so a pass's fixed cost is
spread over its rows; a training's backward pass costs about twice its forward pass (the estimate adds it).
Where the calibration of branch `speed` (`pass_speed.speed(lm).per_token`) is present, it is used instead: this
module is the one place the figure comes from.
"""
from __future__ import annotations

import threading
import time

import torch

from ...models import LoadedModel

ROWS, TOKENS, WARMUP = 2, 64, 8
_MEASURED: dict[tuple, float] = {}
_LOCK = threading.Lock()


def _key(lm: LoadedModel) -> tuple:
    return lm.fingerprint, str(lm.device), str(lm.dtype), torch.get_num_threads()


def _measure(lm: LoadedModel) -> float:
    try:  # the calibration of branch `speed`, once it is merged
        from .pass_speed import speed  # type: ignore[import-not-found]

        return float(speed(lm).per_token)
    except ImportError:
        pass
    vocab = min(len(lm.tokenizer), lm.unembed.shape[0])
    ids = torch.randint(0, vocab, (ROWS, TOKENS), generator=torch.Generator().manual_seed(0)).to(lm.device)
    with lm.lock, torch.inference_mode():
        lm.model(input_ids=ids[:1, :WARMUP], use_cache=False, logits_to_keep=1)  # warm-up
        if lm.device.type == "cuda":
            torch.cuda.synchronize(lm.device)
        t0 = time.perf_counter()
        lm.model(input_ids=ids, use_cache=False, logits_to_keep=1)
        if lm.device.type == "cuda":
            torch.cuda.synchronize(lm.device)
        return (time.perf_counter() - t0) / (ROWS * TOKENS)


def seconds_per_token(lm: LoadedModel, measure: bool = True) -> float | None:
    """Seconds per token of a batched forward pass of `lm` here (measured once; `measure=False`: None until then)."""
    key = _key(lm)
    with _LOCK:
        if key in _MEASURED or not measure:
            return _MEASURED.get(key)
    value = _measure(lm)
    with _LOCK:
        _MEASURED[key] = value
    return value
