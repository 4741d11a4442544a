"""CPU threads for a model's jobs: the faster of one thread and torch's setting, measured on the model.

A small model's matrices split badly across threads, and on a CPU shared with other work the spinning threads wait
for each other (each op can get tens of times slower); on an idle machine two threads run SmolLM2-135M 1.6-1.9x
faster than one. So the choice is a probe of the model's first PROBE_LAYERS decoder layers (the rest skipped) on
PROBE_TOKENS tokens, one thread, then the ceiling (given up when its warm-up alone is GIVE_UP x slower), medians of
REPEATS, cached per model and thread ceiling for MAX_AGE_S (the load changes). GPUs keep torch's setting.
"""
from __future__ import annotations

import statistics
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import torch

from ...model.interventions import Skip, intervene
from ...model.loading import LoadedModel

PROBE_LAYERS, PROBE_TOKENS, REPEATS, GIVE_UP, MAX_AGE_S = 2, 64, 2, 3.0, 600.0
_THREADS: dict[tuple, tuple[int, float, dict[int, float]]] = {}
_LOCK = threading.Lock()


def _timed(lm: LoadedModel, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    lm.model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return time.perf_counter() - t0


def measure_threads(lm: LoadedModel) -> tuple[int, dict[int, float]]:
    """(the faster of 1 and torch's current thread count for `lm` now, probe seconds per candidate); torch's
    setting is restored."""
    ceiling = torch.get_num_threads()
    if lm.device.type != "cpu" or ceiling == 1:
        return ceiling, {}
    vocab = min(len(lm.tokenizer), lm.unembed.shape[0])
    ids = torch.randint(0, vocab, (2, PROBE_TOKENS // 2), generator=torch.Generator().manual_seed(0)).to(lm.device)
    by: dict[int, float] = {}
    try:
        probe = Skip(range(min(PROBE_LAYERS, lm.n_layers), lm.n_layers))
        with lm.lock, torch.inference_mode(), intervene(lm, [probe]):
            torch.set_num_threads(1)
            _timed(lm, ids)
            by[1] = statistics.median(_timed(lm, ids) for _ in range(REPEATS))
            torch.set_num_threads(ceiling)
            warm = _timed(lm, ids)
            by[ceiling] = warm if warm > GIVE_UP * by[1] else statistics.median(_timed(lm, ids) for _ in range(REPEATS))
    finally:
        torch.set_num_threads(ceiling)
    return min(by, key=lambda n: (by[n], n)), by


def best_threads(lm: LoadedModel, max_age_s: float = MAX_AGE_S) -> int:
    """The thread count `lm` runs fastest with here (cached per model and thread ceiling, for `max_age_s`)."""
    key = (lm.fingerprint, str(lm.device), str(lm.dtype), torch.get_num_threads())
    with _LOCK:
        found = _THREADS.get(key)
    if found is not None and time.time() - found[1] <= max_age_s:
        return found[0]
    n, by = measure_threads(lm)
    with _LOCK:
        _THREADS[key] = (n, time.time(), by)
    return n


@contextmanager
def cpu_threads(lm: LoadedModel) -> Iterator[None]:
    """Torch's intra-op threads set to the count `lm` runs fastest with on the CPU while it runs; restored after."""
    before = torch.get_num_threads()
    if lm.device.type != "cpu" or before == 1:
        yield
        return
    torch.set_num_threads(best_threads(lm))
    try:
        yield
    finally:
        torch.set_num_threads(before)
