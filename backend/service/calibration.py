"""What each kind's jobs really cost against their plan: a correction of the time estimate per (model, kind),
learned from the jobs that ran.

The plan (`analysis/primitives/cost.py`) counts forward calls and tokens, and `estimate.seconds_of` turns them into
seconds at the model's measured speed. A job also tokenises its prompts, computes its statistics (a TR null,
bootstrap intervals) and builds its result, and some of its passes carry hooks: on the embedded model that is most
of a sub-second job (bench/bench_estimates.py, quiet: `vectors` planned 0.03 s, ran 0.09 s); on SmolLM2 a few
percent. After a job computed from scratch (nothing reused that it did not compute itself: a cached sub-result, a
memoised induction pass; `primitives/reuse.py`; prefix states held from an earlier pass are left out of the plan),

    ratio = its CPU seconds (the wall clock where the speed was timed by it) / its plan's seconds (no load factor)

and the correction is a moving geometric mean of the ratios (in log space, weight ALPHA on the newest), within
[LOW, HIGH]; an estimate multiplies by it. A kind never run on a model borrows the median correction of the
kinds that ran on it, each weighted by its last plan's seconds (what this machine and model cost beyond any plan,
led by the substantial jobs: a job with no forward pass, whose plan is its fixed overhead alone, hardly counts; a
prior, `Correction.runs` 0 and `Correction.others` how many kinds it rests on); none ran: 1.0. Kept in the cache folder
(`calibration.json`) so that a restarted service keeps what it learned; a file that cannot be read or written is
ignored (the estimate then goes uncorrected), never an error. HEADLENS_CALIBRATION=off leaves every estimate
uncorrected and learns nothing (the test suite runs so: an estimate there must not depend on the tests before it).

    with measuring("smollm2-135m", "maps", planned_s=2.9, cpu=True):
        analyze(...)
    correction("smollm2-135m", "maps")    # e.g. 1.18, and how many runs it rests on
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from ..analysis.primitives.reuse import counting
from ..store.paths import cache_dir

ALPHA = 0.5  # weight of the newest run's log ratio
LOW, HIGH = 0.5, 4.0  # the correction's bounds: a job that ran 10x its plan is news, not a calibration
MIN_PLAN_S = 1e-4  # a plan of less than this (no pass) is not a base to divide by
FILE = "calibration.json"
MAX_ENTRIES = 2000


@dataclass(frozen=True)
class Correction:
    """factor: what an estimate is multiplied by; runs: how many finished jobs of the kind it rests on; others:
    when it is borrowed (runs 0), how many other kinds' corrections it is the median of."""

    factor: float = 1.0
    runs: int = 0
    others: int = 0


_TABLE: dict[str, dict[str, float]] = {}  # "model|kind" -> {"log": mean log ratio, "runs": n, "plan": last plan s}
_LOADED: list[str] = []  # the cache folder the table was read from
_LOCK = threading.Lock()


def enabled() -> bool:
    """Whether estimates are corrected and jobs recorded: HEADLENS_CALIBRATION, `on` (default) or `off`."""
    return os.environ.get("HEADLENS_CALIBRATION", "on").strip().lower() not in ("off", "0", "false", "no")


def _path():
    return cache_dir() / FILE


def _ensure_loaded() -> None:
    """Read the table from the cache folder once per folder (HEADLENS_CACHE_DIR may change: tests)."""
    where = str(_path())
    if _LOADED and _LOADED[0] == where:
        return
    _TABLE.clear()
    _LOADED[:] = [where]
    try:
        got = json.loads(_path().read_text())
    except (OSError, ValueError):
        return
    if isinstance(got, dict):
        for k, v in list(got.items())[:MAX_ENTRIES]:
            if (isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("log"), (int, float))
                    and isinstance(v.get("runs"), int) and math.isfinite(v["log"]) and v["runs"] > 0):
                plan = v.get("plan")
                _TABLE[k] = {"log": float(v["log"]), "runs": int(v["runs"]),
                             "plan": float(plan) if isinstance(plan, (int, float)) and plan > 0 else MIN_PLAN_S}


def _save() -> None:
    from ..store.atomic_dirs import write_file

    try:
        _path().parent.mkdir(parents=True, exist_ok=True)
        write_file(_path(), json.dumps(_TABLE, sort_keys=True))
    except Exception:  # noqa: BLE001 - a read-only or full cache folder: the correction stays in memory
        pass


def _key(model: str | None, kind: str) -> str:
    return f"{model or ''}|{kind}"


def correction(model: str | None, kind: str) -> Correction:
    """The learned correction of `kind`'s estimates on `model` (1.0 and 0 runs when none ran yet, or when off)."""
    if not enabled():
        return Correction()
    with _LOCK:
        _ensure_loaded()
        e = _TABLE.get(_key(model, kind))
        mine = f"{model or ''}|"
        others = [(v["log"], v.get("plan", MIN_PLAN_S)) for k, v in _TABLE.items()
                  if k.startswith(mine) and k != _key(model, kind)]
    if e is not None:
        return Correction(_bounded(e["log"]), int(e["runs"]))
    if others:
        return Correction(_bounded(weighted_median(others)), 0, len(others))
    return Correction()


def weighted_median(pairs: list[tuple[float, float]]) -> float:
    """The value at which half the total weight of (value, weight) `pairs` lies below (the lower one at a tie)."""
    pairs = sorted(pairs)
    half, acc = sum(w for _, w in pairs) / 2, 0.0
    for v, w in pairs:
        acc += w
        if acc >= half:
            return v
    return pairs[-1][0]


def _bounded(log_ratio: float) -> float:
    return min(max(math.exp(log_ratio), LOW), HIGH)


def record(model: str | None, kind: str, planned_s: float, real_s: float) -> Correction:
    """Fold one finished job (its plan's seconds, its real CPU seconds) into the correction; the new correction.
    A plan under MIN_PLAN_S or a non-positive time is ignored."""
    measurable = planned_s >= MIN_PLAN_S and real_s > 0 and math.isfinite(planned_s) and math.isfinite(real_s)
    if not enabled() or not measurable:
        return correction(model, kind)
    r = min(max(math.log(real_s / planned_s), math.log(LOW)), math.log(HIGH))
    with _LOCK:
        _ensure_loaded()
        k = _key(model, kind)
        e = _TABLE.get(k)
        _TABLE[k] = ({"log": r, "runs": 1, "plan": planned_s} if e is None else
                     {"log": (1 - ALPHA) * e["log"] + ALPHA * r, "runs": int(e["runs"]) + 1, "plan": planned_s})
        if len(_TABLE) > MAX_ENTRIES:
            _TABLE.pop(next(iter(_TABLE)))
        _save()
    return correction(model, kind)


@contextmanager
def measuring(model: str | None, kind: str, planned_s: float | None, cpu: bool) -> Iterator[None]:
    """Time the block (this thread's CPU seconds when `cpu`, else the wall clock) and `record` it against
    `planned_s`, if the block finishes and reused no cached sub-result (a raise, a cancel or a cache hit records
    nothing)."""
    clock = time.thread_time if cpu else time.perf_counter
    with counting() as reused:
        t0 = clock()
        yield
        took = clock() - t0
    if planned_s is not None and not reused.count:
        record(model, kind, planned_s, took)
