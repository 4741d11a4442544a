"""A job's estimated time, from the jobs that really ran on this service.

    units   = the job's plan in token-equivalents (`cost.Work.units`: tokens, a call's fixed cost, rows of logits;
              stages an earlier pass holds in memory left out)
    rate    = wall seconds per unit of this kind's last RUNS computed jobs on this model (their median)
    seconds = units x rate, with the runs' spread (min..max) as its range

Wall seconds of real jobs already carry the machine's load as it was when they ran, and every finished job (any
lane) updates its kind. A kind never run on a model borrows the median of the rates of the kinds that ran there
(the range spans them); a model nothing ran on borrows the rate of the nearest-sized model that ran, scaled by
its parameters when one within SCALE_SPAN of its size ran, else a rate from its size (FALLBACK_FLOPS), each with a RANGE_UNKNOWN range.

Kept in `timings.json` in the cache folder (a restart keeps them), read as untrusted (`store.safe_json`: a regular
file, bounded size and depth, every value range-checked) and merged under a file lock when written, so services
sharing a cache folder lose none of each other's runs. HEADLENS_TIMINGS=off learns nothing (the plan and the
size prior alone: what the test suite runs with).
"""
from __future__ import annotations

import math
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..analysis.primitives.cost import GENERIC, Shape, Sizes, mean_sizes, sizes_of
from ..store.paths import cache_dir
from ..store.safe_json import read_json
from .model_shape import model_shape, token_counter

RUNS = 5  # runs kept per (model, kind); the estimate is their median
LOAD = "(loading)"  # the pseudo-kind of a model's load times (seconds per 1 unit)
LOAD_PRIOR_S, LOAD_BYTES_PER_S = 3.0, 2e8  # a model never loaded here: this, plus its float32 weights at this rate
MAX_KEYS = 400
FILE = "timings.json"
FALLBACK_FLOPS = 1e11  # a CPU's effective FLOP/s per unit, for a model nothing ran on yet: SmolLM2-135M's first Head
# map read 3.8x its real time at 5e10 on a quiet machine, so a first estimate now sits near 2x quiet, 1x with both cores busy
SCALE_SPAN = 8.0  # a model borrows another's rate (scaled by parameters) only within this factor of its size: a tiny
# model's rate is its Python overhead, which scaled up to 135M read 100x too high
MIN_RATE = 2e-6  # seconds per unit at least (a tiny model's Python and per-layer overheads)
RANGE_UNKNOWN = 3.0
LIMITS = {"t": (1e9, 1e11), "units": (1e-3, 1e15), "seconds": (1e-4, 1e7), "n_params": (0, 1e13)}
_LOCK = threading.Lock()
_TABLE: dict[str, list[tuple[float, float, float, float]]] = {}  # "model|kind" -> [(t, units, seconds, n_params)]
_SEEN: list[Any] = [None]  # (folder, mtime) the table was read at


@dataclass(frozen=True)
class Estimate:
    """A job's work (`passes`: HEADLENS_MAX_WORK's unit; `tokens`, `train_tokens`, `units`) and time (`seconds`,
    within `low`..`high`; None when unknown), and what the time rests on (`basis`, `runs`)."""

    passes: float
    tokens: float
    train_tokens: float
    units: float
    how: str
    shape: Shape
    sizes: Sizes
    seconds: float | None = None
    low: float | None = None
    high: float | None = None
    basis: str = "no cost declared"
    runs: int = 0
    held_tokens: float = 0.0
    time_notes: str = ""  # what the time leaves out or adds (held states, the model's load): not in `how`, the work

    def to_json(self) -> dict[str, Any]:
        r = lambda v: None if v is None else round(v, 3)  # noqa: E731
        return {"passes": round(self.passes, 1), "tokens": round(self.tokens), "train_tokens": round(self.train_tokens),
                "units": round(self.units), "held_tokens": round(self.held_tokens), "how": self.how + self.time_notes,
                "seconds": r(self.seconds), "low": r(self.low), "high": r(self.high), "basis": self.basis,
                "runs": self.runs, "shape": asdict(self.shape), "sizes": asdict(self.sizes)}


def enabled() -> bool:
    return os.environ.get("HEADLENS_TIMINGS", "on").strip().lower() not in ("off", "0", "false", "no")


def _path():
    return cache_dir() / FILE


def _valid(entry: Any) -> tuple[float, float, float, float] | None:
    if not isinstance(entry, list) or len(entry) != 4:
        return None
    vals = []
    for (lo, hi), v in zip(LIMITS.values(), entry):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
            return None
        vals.append(float(v))
    return tuple(vals)  # type: ignore[return-value]


def _read_file() -> dict[str, list[tuple[float, float, float, float]]]:
    got = read_json(_path(), max_bytes=1 << 20, max_depth=3)
    out: dict[str, list[tuple[float, float, float, float]]] = {}
    for k, runs in (got.items() if isinstance(got, dict) else ()):
        if isinstance(k, str) and "|" in k and len(k) < 2000 and isinstance(runs, list) and len(out) < MAX_KEYS:
            good = sorted(e for e in map(_valid, runs[:RUNS]) if e is not None)
            if good:
                out[k] = good
    return out


def _refresh() -> None:
    """Re-read the file when another process (or folder) changed it. Holds _LOCK."""
    try:
        seen = (str(_path()), _path().stat().st_mtime_ns)
    except OSError:
        seen = (str(_path()), None)
    if _SEEN[0] != seen:
        _TABLE.clear()
        _TABLE.update(_read_file())
        _SEEN[0] = seen


def record(model: str | None, kind: str, units: float, seconds: float, n_params: float = 0) -> None:
    """Keep one computed job's wall seconds against its plan's units (merged into the file under its lock)."""
    entry = _valid([time.time(), units, seconds, n_params or 0])
    if not enabled() or entry is None:
        return
    from ..store.atomic_dirs import write_file
    from ..store.locks import KeyLocks

    key = f"{model or ''}|{kind}"
    import json

    with _LOCK:
        try:
            with KeyLocks().hold("timings.json"):
                _TABLE.clear()
                _TABLE.update(_read_file())  # what other processes wrote since
                _TABLE[key] = sorted({*_TABLE.get(key, []), entry})[-RUNS:]
                while len(_TABLE) > MAX_KEYS:
                    _TABLE.pop(min(_TABLE, key=lambda k: _TABLE[k][-1][0]))
                _path().parent.mkdir(parents=True, exist_ok=True)
                write_file(_path(), json.dumps({k: [list(e) for e in v] for k, v in _TABLE.items()}))
                _SEEN[0] = (str(_path()), _path().stat().st_mtime_ns)
        except OSError:  # a read-only or full cache folder: kept in memory only
            _TABLE[key] = sorted({*_TABLE.get(key, []), entry})[-RUNS:]


def _rates(model: str | None) -> dict[str, list[float]]:
    """Seconds per unit of each kind's runs on `model`."""
    with _LOCK:
        if enabled():
            _refresh()
        else:
            _TABLE.clear()
        mine = f"{model or ''}|"
        return {k[len(mine):]: [s / u for _, u, s, _ in v] for k, v in _TABLE.items() if k.startswith(mine)}


def load_seconds(model: str, n_params: float | None) -> float:
    """What loading `model` takes here: the median of its loads, else LOAD_PRIOR_S plus its weights' bytes."""
    runs = _rates(model).get(LOAD)
    return statistics.median(runs) if runs else LOAD_PRIOR_S + 4 * (n_params or 0) / LOAD_BYTES_PER_S


def rate(model: str | None, kind: str, n_params: float | None) -> tuple[float, float, float, str, int]:
    """(rate, low, high, basis, runs) in seconds per unit for `kind` on `model` (see the module docstring)."""
    own = _rates(model)
    if own.get(kind):
        runs = own[kind]
        n = len(runs)
        return statistics.median(runs), min(runs), max(runs), f"{n} earlier run{'s' * (n > 1)} of {kind} here", n
    others = [statistics.median(v) for k, v in own.items() if v and k != LOAD]
    if others:
        return (statistics.median(others), min(others), max(others),
                f"the runs of {len(others)} other analys{'es' if len(others) > 1 else 'is'} on this model here", 0)
    prior = _size_prior(model, n_params or 0)
    return prior, prior / RANGE_UNKNOWN, prior * RANGE_UNKNOWN, "assumed from the model's size: nothing ran on it " \
                                                                "here yet", 0


def _size_prior(model: str | None, n_params: float) -> float:
    """A model nothing ran on: the nearest-sized model's median rate scaled by parameters (a pass costs about
    2 x parameters FLOP per token) when it is within SCALE_SPAN in size, else 2 x parameters / FALLBACK_FLOPS; at
    least MIN_RATE."""
    with _LOCK:
        by_model: dict[str, list[tuple[float, float]]] = {}
        for k, v in _TABLE.items():
            m, kind = k.split("|", 1)
            if m != (model or "") and v[-1][3] > 0 and kind != LOAD:
                by_model.setdefault(m, []).extend((s / u, e_n) for _, u, s, e_n in v)
    if n_params > 0 and by_model:
        near = min(by_model.values(), key=lambda rs: abs(math.log(rs[-1][1] / n_params)))
        if abs(math.log(near[-1][1] / n_params)) <= math.log(SCALE_SPAN):
            return max(statistics.median(r for r, _ in near) * n_params / near[-1][1], MIN_RATE)
    return max(2 * n_params / FALLBACK_FLOPS, MIN_RATE)


_SIZES: dict[tuple[str, str], Sizes] = {}


def task_sizes(task: Any, model: str | None) -> Sizes:
    """The task's prompt sizes under the model's tokenizer (memoised by task content and model)."""
    key = (task.content_hash(), model or "")
    with _LOCK:
        if key in _SIZES:
            return _SIZES[key]
    got = sizes_of(task, token_counter(model))
    with _LOCK:
        if len(_SIZES) > 4096:
            _SIZES.clear()
        _SIZES[key] = got
    return got


def job_sizes(spec: Any, p: Any, model: str | None, task: Any) -> Sizes:
    """The prompt sizes of a job: its task's, or (a kind over several tasks) the mean of the tasks it runs."""
    if task is not None:
        return task_sizes(task, model)
    if "tasks" in type(p).model_fields:
        from ..tasks.registry import builtin_by_names, model_tasks

        try:
            tasks = builtin_by_names(p.tasks, spec.name) if p.tasks else model_tasks(model or "default")
        except Exception:
            return GENERIC
        return mean_sizes([task_sizes(t, model) for t in tasks], [t.name for t in tasks])
    return GENERIC


def estimate(spec: Any, p: Any, model: str | None, task: Any = None, lm: Any = None,
             resident: bool | None = None) -> tuple[Estimate, Any]:
    """(the estimate, the plan: `cost.Work`) of job `spec` with params `p` on the model of canonical name `model`
    (None: a kind without one) and `task`. `lm`: the model when resident; the stages its params' `held(lm, task)`
    names (states an earlier pass kept, e.g. a toggle's clean prefix) are left out of its time, not of its work
    (the work limit is the same whether the model is loaded or not). `resident` False: the model is not loaded (the
    admission knows), so its load time is added."""
    shape = model_shape(model) if model else Shape(0, 0, 0, None, 0, "none")
    if not hasattr(p, "work"):  # a params model that declares no cost (a kind registered at run time: tests)
        return Estimate(0.0, 0.0, 0.0, 0.0, "no cost declared", shape, GENERIC), None
    sizes = job_sizes(spec, p, model, task)
    plan = p.work(shape, sizes)
    held = p.held(lm, task) if lm is not None and hasattr(p, "held") else set()
    timed = plan.without(held) if held else plan
    notes = f"; {plan.tokens - timed.tokens:,.0f} of them held in memory from an earlier pass" if held else ""
    units = timed.units(shape)
    r, lo, hi, basis, runs = rate(model if spec.uses_model else None, spec.name, shape.n_params)
    load = load_seconds(model, shape.n_params) if spec.uses_model and model and lm is None and resident is False \
        else 0.0
    if load:
        notes += f"; loading the model first (about {load:.0f} s)"
    return Estimate(plan.passes(sizes.prompt(p.reference_shots())), plan.tokens, plan.train, units, plan.how(), shape,
                    sizes, units * r + load, units * lo + load, units * hi + load, basis, runs,
                    plan.tokens - timed.tokens, notes), plan


MIN_FRACTION, MIN_ELAPSED_S = 0.05, 2.0


def remaining_seconds(progress: float, elapsed_s: float, estimate_s: float | None = None) -> float | None:
    """A running job's seconds left: elapsed x (1 - f) / f from its own progress f once it is at least MIN_FRACTION
    done and has run MIN_ELAPSED_S, else what its estimate leaves; None when neither says."""
    f = min(max(float(progress), 0.0), 1.0)
    if f >= MIN_FRACTION and elapsed_s >= MIN_ELAPSED_S:
        return max(elapsed_s * (1.0 - f) / f, 0.0)
    return estimate_s - elapsed_s if estimate_s is not None and estimate_s > elapsed_s else None
