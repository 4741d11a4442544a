"""How fast a loaded model runs here: the CPU thread count that runs it fastest, and seconds per forward pass and
per token, measured on the model itself and cached.

Threads (`best_threads`): on the CPU the candidates are 1 and torch's current setting (the ceiling the process was
given). A small model's matrices split badly across threads, and on a CPU shared with other work its intra-op
threads wait for each other (each op can get 10-30x slower); on an idle machine, though, two threads run
SmolLM2-135M and Gemma-3-270M 1.6-1.9x faster than one. Which one wins is measured, not guessed from the width: a
probe of the model's first PROBE_LAYERS decoder layers (the rest pass their input through) on PROBE_TOKENS tokens,
one thread first, then the ceiling (given up after its warm-up when that alone is GIVE_UP x slower), medians of
REPEATS. Measured again after MAX_AGE_S: the machine's load changes. GPUs keep torch's setting.

Seconds (`speed`, `pass_seconds`): a forward pass of `tokens` tokens in all is modelled as
    seconds = per_pass + per_token * tokens
(per_pass: the fixed cost of one pass, weights read and per-layer overheads; it dominates on a tiny model), fitted
from whole passes of random token ids at several sizes (SIZES: rows x tokens), each the median of REPEATS, at the
best thread count; measured once per model and thread ceiling. The fit is robust: per_token is the median of the
slopes between every two sizes (Theil-Sen), per_pass the median of what each size leaves. On a small model or a
busy CPU the slope can come out flat or reversed (the passes time alike); per_token is then never taken as zero:
it is at least MIN_TOKEN_SHARE of the largest pass's time per token, and per_pass keeps the rest.

    best_threads(lm)                            # 1 or torch's setting
    pass_seconds(lm, tokens=4850, passes=4)     # what a cost model turns "passes" into
"""
from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass

import torch

from ...model.interventions import Skip, intervene
from ...model.loading import LoadedModel

SIZES = ((1, 8), (1, 32), (2, 32), (4, 32))  # rows x tokens of the timed whole passes
MIN_TOKEN_SHARE = 0.05
PROBE_LAYERS, PROBE_TOKENS = 2, 64
REPEATS = 2
FIT_REPEATS = 3
GIVE_UP = 3.0
MAX_AGE_S = 600.0


@dataclass(frozen=True)
class Speed:
    """threads: the thread count passes ran with; per_pass, per_token: seconds (see the module docstring); load:
    the 1-minute load average when measured (None where it cannot be read)."""

    threads: int
    per_pass: float
    per_token: float
    measured_at: float = 0.0
    load: float | None = None

    def seconds(self, tokens: float, passes: float = 1.0) -> float:
        return max(0.0, passes * self.per_pass + tokens * self.per_token)


_SPEED: dict[tuple, Speed] = {}
_THREADS: dict[tuple, tuple[int, float, dict[int, float]]] = {}
_LOCK = threading.Lock()


def _sync(lm: LoadedModel) -> None:
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)


def _timed(lm: LoadedModel, ids: torch.Tensor, cpu: bool = False) -> float:
    """Seconds of one pass: wall-clock, or (`cpu`) this thread's CPU seconds."""
    clock = time.thread_time if cpu else time.perf_counter
    _sync(lm)
    t0 = clock()
    lm.model(input_ids=ids, use_cache=False, logits_to_keep=1)
    _sync(lm)
    return clock() - t0


def _ids(lm: LoadedModel, rows: int, n: int) -> torch.Tensor:
    vocab = min(len(lm.tokenizer), lm.unembed.shape[0])
    g = torch.Generator().manual_seed(n)
    return torch.randint(0, vocab, (rows, n), generator=g).to(lm.device)


def _key(lm: LoadedModel) -> tuple:
    return lm.fingerprint, str(lm.device), str(lm.dtype), torch.get_num_threads()


def measure_threads(lm: LoadedModel) -> tuple[int, dict[int, float]]:
    """(the faster of 1 and torch's current thread count for `lm` now, probe seconds per candidate); torch's
    setting is restored."""
    ceiling = torch.get_num_threads()
    if lm.device.type != "cpu" or ceiling == 1:
        return ceiling, {}
    ids = _ids(lm, 2, PROBE_TOKENS // 2)
    by: dict[int, float] = {}
    try:
        probe = Skip(range(min(PROBE_LAYERS, lm.n_layers), lm.n_layers))  # a probe of the first layers only
        with lm.lock, torch.inference_mode(), intervene(lm, [probe]):
            torch.set_num_threads(1)
            _timed(lm, ids)
            by[1] = statistics.median(_timed(lm, ids) for _ in range(REPEATS))
            torch.set_num_threads(ceiling)
            warm = _timed(lm, ids)
            if warm > GIVE_UP * by[1]:  # waiting threads: no need to time them twice more
                by[ceiling] = warm
            else:
                by[ceiling] = statistics.median(_timed(lm, ids) for _ in range(REPEATS))
    finally:
        torch.set_num_threads(ceiling)
    return min(by, key=lambda n: (by[n], n)), by


def best_threads(lm: LoadedModel, max_age_s: float = MAX_AGE_S) -> int:
    """The thread count `lm` runs fastest with here (cached per model and thread ceiling, for `max_age_s`)."""
    key = _key(lm)
    with _LOCK:
        found = _THREADS.get(key)
    if found is not None and time.time() - found[1] <= max_age_s:
        return found[0]
    n, by = measure_threads(lm)
    with _LOCK:
        _THREADS[key] = (n, time.time(), by)
    return n


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(per_pass, per_token) seconds of `seconds = per_pass + per_token * tokens` through `points` (tokens,
    seconds): per_token the median of the pairwise slopes (Theil-Sen), at least MIN_TOKEN_SHARE of the largest
    pass's seconds per token (a flat or reversed slope is noise, not free tokens); per_pass the median of what
    each point leaves, at least 0. Both are positive and finite for any points with positive seconds."""
    pts = sorted((float(n), float(t)) for n, t in points if n > 0 and t > 0 and t == t)
    if not pts:
        raise ValueError("no timed passes to fit")
    slopes = [(t2 - t1) / (n2 - n1) for i, (n1, t1) in enumerate(pts) for n2, t2 in pts[i + 1:] if n2 > n1]
    n_max, t_max = max(pts, key=lambda p: (p[0], p[1]))
    floor = MIN_TOKEN_SHARE * t_max / n_max
    per_token = max(statistics.median(slopes), floor) if slopes else t_max / n_max
    per_token = min(per_token, min(t / n for n, t in pts))  # no pass is slower per token than all of it
    per_pass = max(statistics.median(t - per_token * n for n, t in pts), 0.0)
    return per_pass, per_token


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not on every platform
        return None


def measure(lm: LoadedModel) -> Speed:
    """Seconds per pass and per token now, fitted (`fit`) from whole passes of SIZES (rows x tokens, within the
    model's context) at the best thread count, medians of FIT_REPEATS (torch's setting is restored).

    On the CPU with one thread the passes are timed in this thread's CPU seconds: what the model costs on a quiet
    machine, whatever else shares the CPU now (a pass preempted by other work would read slower by the share it
    waited); `load` is then 0.0 (an estimate scales it by the load when it is made). Otherwise wall-clock, with the
    load average of the moment."""
    before = torch.get_num_threads()
    n = best_threads(lm)
    cpu = lm.device.type == "cpu" and n == 1
    limit = max(1, (getattr(lm, "max_positions", None) or 1 << 30) - 1)
    sizes = sorted({(rows, min(tokens, limit)) for rows, tokens in SIZES})
    batches = [_ids(lm, rows, tokens) for rows, tokens in sizes]
    points = []
    try:
        torch.set_num_threads(n)
        with lm.lock, torch.inference_mode():
            _timed(lm, batches[-1])  # warm-up
            for (rows, tokens), ids in zip(sizes, batches):
                points.append((rows * tokens, statistics.median(_timed(lm, ids, cpu) for _ in range(FIT_REPEATS))))
    finally:
        torch.set_num_threads(before)
    per_pass, per_token = fit(points)
    return Speed(n, per_pass, per_token, time.time(), 0.0 if cpu else _load())


def speed(lm: LoadedModel) -> Speed:
    """The model's `Speed`, measured once per model, device and thread ceiling."""
    key = _key(lm)
    with _LOCK:
        found = _SPEED.get(key)
    if found is not None:
        return found
    got = measure(lm)
    with _LOCK:
        _SPEED[key] = got
    return got


def pass_seconds(lm: LoadedModel, tokens: float, passes: float = 1.0) -> float:
    """Estimated seconds of `passes` forward passes over `tokens` tokens in all, on this model here (a backward
    pass costs about twice a forward one)."""
    return speed(lm).seconds(tokens, passes)
