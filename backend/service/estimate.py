"""A job's estimated work and time, before it runs: what admission checks against HEADLENS_MAX_WORK, what
`POST /jobs/estimate` answers and what a page shows beside its Run button.

    e = estimate(spec, params, "smollm2-135m", task)
    e.passes, e.seconds, e.how

Work comes from the kind's params alone (`Params.work(shape, sizes)`, in tokens through the model): the model's
`Shape` and the prompts' `Sizes` are read from the model's files and the task (`model_shape.py`), never from a
loaded model, so a job is admitted or refused the same on a fresh service and on one that has it resident.
`passes` is the work in prompts of the job's own length (`Params.reference_shots`): the unit of HEADLENS_MAX_WORK.
The same plan, stage by stage, is what the job's progress bar is shared by (`analysis/primitives/stages.py`).

Seconds = load x correction x (JOB_OVERHEAD_S + ANALYSIS_OVERHEAD x ((calls + 2 x training calls) x seconds per pass + (tokens + 2 x training
tokens) x seconds per token)): a forward call's fixed cost counts as much as its tokens (on a small model it is most of the time; a
training step's backward pass costs about twice its forward pass). The speed comes from (in order):
1. the figures `model_info` measured on this model (`primitives/pass_speed.py`, recorded here by the runners);
2. else a fallback from the model's size, marked `assumed`: 2 x parameters FLOP per token at FALLBACK_FLOPS (a
   shared CPU) or FALLBACK_GPU_FLOPS, and per pass FALLBACK_PASS_S per layer plus the weights read at
   FALLBACK_BYTES_PER_S.
`correction` is what this kind's earlier runs on this model cost against their plans (`calibration.py`: their
tokenising, statistics and hooks, which the plan does not count; 1.0 before the first run). `load` (`load_factor`) scales for the CPU's load now: the speed is timed in CPU seconds (a quiet machine's), and a
job gets the share of a core this process gets now (`cpu_share`: CPU over wall seconds of a short busy loop), so it
runs about 1 / share slower; stated in `how` when it changes the estimate. (The load average is no measure of that
in a container: it is the host's, over more cores than the container has.)
"""
from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..analysis.primitives.cost import GENERIC, Shape, Sizes, mean_sizes, sizes_of
from .calibration import Correction, correction
from .model_shape import model_shape, token_counter

FALLBACK_FLOPS = 5e10  # effective FLOP/s of a batched forward pass on 2 CPU cores (SmolLM2-135M, measured: ~7e10)
FALLBACK_GPU_FLOPS = 2e13
FALLBACK_PASS_S = 5e-4  # fixed seconds per decoder layer of a forward call on the CPU (the embedded model: ~3e-4)
FALLBACK_BYTES_PER_S = 1e10  # weights read per call (float32)
LOAD_FACTOR_MAX = 16.0
SHARE_PROBE_S, SHARE_TTL_S, SHARE_MEMORY_S, SHARE_PROBES = 0.2, 10.0, 180.0, 5
JOB_OVERHEAD_S = 0.005
"""A job's fixed CPU seconds besides its passes: building and tokenising the prompts, the result's envelope
(bench/bench_estimates.py: `fit`, which runs no pass, took 3.5 ms of a quiet core's time on the embedded model,
`icl` and `ablate` 2.5-3.5 ms over their passes; 0.03 put every small job at 1.5-9x its real time)."""
ANALYSIS_OVERHEAD = 1.0
"""A job's passes against the plain passes the speed is timed on (hooks, eager attention, padding, scoring). With
the speed timed in CPU seconds and scaled by `cpu_share`, bench/bench_estimates.py put estimate / real at a median
of 1.64 (embedded model) and 1.87 (SmolLM2) with 1.6 here: 1.0 centres it (recomputed from that run: 1.17, 1.28)."""


@dataclass(frozen=True)
class ModelSpeed:
    """What `model_info` measured: seconds per forward call and per token, the threads and load average then."""

    per_pass: float
    per_token: float
    threads: int = 1
    load: float | None = None


_SPEEDS: dict[str, ModelSpeed] = {}
_SIZES: dict[tuple[str, str], Sizes] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Estimate:
    passes: float
    tokens: float
    train_tokens: float
    how: str
    seconds: float | None
    seconds_basis: str  # measured | assumed
    seconds_per_token: float | None
    shape: Shape
    sizes: Sizes
    calls: float = 0.0
    seconds_per_pass: float | None = None
    load_factor: float = 1.0
    load_note: str = ""  # the load factor in words, when it changes the seconds (not part of `how`: the work's)
    held_tokens: float = 0.0  # of `tokens`, those the job skips (states an earlier pass kept): not in `seconds`
    plan_seconds: float | None = None  # the plan's seconds at the measured speed: before correction and load factor
    correction: float = 1.0  # learned from this kind's earlier runs on this model (`calibration.py`)
    correction_runs: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"passes": round(self.passes, 1), "tokens": round(self.tokens), "train_tokens": round(self.train_tokens),
                "held_tokens": round(self.held_tokens),
                "how": self.how + self.load_note, "seconds": self.seconds,
                "seconds_basis": self.seconds_basis, "seconds_per_token": self.seconds_per_token,
                "shape": asdict(self.shape), "sizes": asdict(self.sizes), "calls": round(self.calls),
                "seconds_per_pass": self.seconds_per_pass, "load_factor": round(self.load_factor, 2),
                "correction": round(self.correction, 3), "correction_runs": self.correction_runs}


def _positive(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf") else None


def note_speed(model: str | None, result: dict[str, Any] | None) -> None:
    """Keep the seconds per pass and per token a `model_info` result measured for `model` (a canonical name); a
    result without a positive per-token figure is ignored (an older one without per-pass keeps 0 per pass)."""
    r = result or {}
    per_token = _positive(r.get("seconds_per_token"))
    if not model or per_token is None:
        return
    threads = r.get("speed_threads")
    got = ModelSpeed(_positive(r.get("seconds_per_pass")) or 0.0, per_token,
                     threads if isinstance(threads, int) and threads > 0 else 1,
                     r.get("speed_load") if isinstance(r.get("speed_load"), (int, float)) else None)
    with _LOCK:
        _SPEEDS[model] = got


def measured_speed(model: str | None) -> ModelSpeed | None:
    with _LOCK:
        return _SPEEDS.get(model or "")


def assumed_speed(shape: Shape, device: str = "cpu") -> ModelSpeed | None:
    """A speed from the model's size alone (no measurement yet); None without a parameter count."""
    if not shape.n_params:
        return None
    gpu = device.startswith("cuda")
    per_token = 2 * shape.n_params / (FALLBACK_GPU_FLOPS if gpu else FALLBACK_FLOPS)
    per_pass = shape.n_layers * FALLBACK_PASS_S / (10 if gpu else 1) + 4 * shape.n_params / FALLBACK_BYTES_PER_S
    return ModelSpeed(per_pass, per_token)


def machine_load() -> tuple[float, int] | None:
    """(the 1-minute load average, CPU cores) here; None where it cannot be read. Said in `how`; not what the
    estimate is scaled by: in a container the load average is the host's, over more cores than this process has."""
    try:
        return os.getloadavg()[0], os.cpu_count() or 1
    except (OSError, AttributeError):
        return None


_SHARE: list[tuple[float, float]] = []  # (measured at (monotonic), share) of the probes of the last SHARE_MEMORY_S


def cpu_share(max_age_s: float = SHARE_TTL_S) -> float:
    """The share of one core this process's thread gets now, (0, 1]: its CPU seconds over the wall seconds of a
    SHARE_PROBE_S busy loop, probed at most every `max_age_s`. On a quiet machine about 1; with the CPU
    oversubscribed, what the other work leaves (a job of one thread runs about 1 / share slower than on a quiet
    machine). One short probe can land in a burst of other work, or in a lull: the share is the median of the
    probes of the last SHARE_MEMORY_S (up to SHARE_PROBES of them), a moving median that follows a change of load
    within a few probes."""
    now = time.monotonic()
    with _LOCK:
        if _SHARE and now - _SHARE[-1][0] <= max_age_s:
            return statistics.median(v for t, v in _SHARE if now - t <= SHARE_MEMORY_S or t == _SHARE[-1][0])
    w0, c0, x = time.perf_counter(), time.thread_time(), 0
    while time.perf_counter() - w0 < SHARE_PROBE_S:
        x += 1
    share = min(max((time.thread_time() - c0) / max(time.perf_counter() - w0, 1e-9), 1e-3), 1.0)
    with _LOCK:
        now = time.monotonic()
        _SHARE[:] = [(t, v) for t, v in _SHARE if now - t <= SHARE_MEMORY_S][-(SHARE_PROBES - 1):] + [(now, share)]
        return statistics.median(v for _, v in _SHARE)


def load_factor(speed: ModelSpeed, share: float | None) -> float:
    """The estimate's scale for the CPU's load: 1 / `share` (`cpu_share`) for a speed timed in CPU seconds (a
    quiet machine's: its `load` is 0.0); 1 for one timed by the wall clock (it read the load of its moment) or
    where the share is unknown; within [1, LOAD_FACTOR_MAX]."""
    if share is None or speed.load != 0.0:
        return 1.0
    return min(max(1.0 / max(share, 1e-3), 1.0), LOAD_FACTOR_MAX)


def seconds_of(w: Any, speed: ModelSpeed) -> float:
    """Seconds of work `w` (`cost.Work`) at `speed`, before any load factor: calls and tokens, training ones 3x."""
    calls = w.calls + 2 * w.train_calls
    tokens = w.tokens + 2 * w.train
    return JOB_OVERHEAD_S + ANALYSIS_OVERHEAD * (calls * speed.per_pass + tokens * speed.per_token)


def task_sizes(task: Any, model: str | None) -> Sizes:
    """The task's prompt sizes under the model's tokenizer (memoised by task content and model; seed 0)."""
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


def estimate(spec: Any, p: Any, model: str | None, task: Any = None, device: str = "cpu", lm: Any = None,
             load: bool = True) -> Estimate:
    """The estimate of job `spec` with params `p` on the model of canonical name `model` (None: a kind without
    one) and `task` (the Task, or None). `lm`: the model when it is resident; the parts of the work its params'
    `held(lm, task)` names (states an earlier pass kept in memory, e.g. a toggle's clean prefix) are left out of its
    seconds (not of its work: the work limit is the same whether the model is loaded or not). `load=False`: no
    CPU-share probe (a 0.2 s busy loop every SHARE_TTL_S) and no load factor: what a running job's plan needs."""
    shape = model_shape(model) if model else Shape(0, 0, 0, None, 0, "none")
    if not hasattr(p, "work"):  # a params model that declares no cost (a kind registered at run time: tests, plugins)
        return Estimate(0.0, 0.0, 0.0, "no cost declared", None, "unknown", None, shape, GENERIC)
    sizes = job_sizes(spec, p, model, task)
    w = p.work(shape, sizes)
    held_parts = p.held(lm, task) if lm is not None and hasattr(p, "held") else set()
    held = w.tokens - w.without(held_parts).tokens if held_parts else 0.0
    sp, basis = measured_speed(model), "measured"
    if sp is None:
        sp, basis = assumed_speed(shape, device), "assumed"
    how, seconds, factor, note, plan, fix = w.how(), None, 1.0, "", None, Correction()
    if held:
        how += f"; {held:,.0f} of them held in memory from an earlier pass"
    if sp is not None:
        plan = seconds_of(w.without(held_parts) if held else w, sp)
        fix = correction(model if spec.uses_model else None, spec.name) if basis == "measured" else Correction()
        seconds = plan * fix.factor
        if fix.runs and abs(fix.factor - 1.0) >= 0.05:
            note = f"; x{fix.factor:.2f} from {fix.runs} earlier run{'s' if fix.runs > 1 else ''} of {spec.name} here"
        elif fix.others and abs(fix.factor - 1.0) >= 0.05:
            note = f"; x{fix.factor:.2f} from the earlier runs of {fix.others} other kind{'s' if fix.others > 1 else ''} here"
        share = cpu_share() if load and basis == "measured" and not device.startswith("cuda") and sp.load == 0.0 \
            else None
        factor = load_factor(sp, share)
        if share is not None and factor >= 1.1 and seconds > 0:
            load = machine_load()
            note += (f"; x{factor:.1f} for the CPU's load (this service gets {share:.0%} of a core now"
                    + (f", load average {load[0]:.1f} on {load[1]} cores)" if load else ")"))
        seconds *= factor
    return Estimate(w.passes(sizes.prompt(p.reference_shots())), w.tokens, w.train, how, seconds, basis,
                    sp.per_token if sp else None, shape, sizes, w.calls, sp.per_pass if sp else None, factor, note, held,
                    plan, fix.factor, fix.runs)


MIN_FRACTION, MIN_ELAPSED_S = 0.05, 2.0


def remaining_seconds(progress: float, elapsed_s: float) -> float | None:
    """A running job's remaining seconds from its own measured progress: elapsed x (1 - f) / f, once it is at
    least MIN_FRACTION done and has run MIN_ELAPSED_S (None before: too little to extrapolate from)."""
    f = min(max(float(progress), 0.0), 1.0)
    if f < MIN_FRACTION or elapsed_s < MIN_ELAPSED_S:
        return None
    return max(elapsed_s * (1.0 - f) / f, 0.0)


def canonical_name(model: str) -> str:
    """The canonical name of a model named on the command line (its estimate reads the model's files); the name
    itself when it names no model (loading it then says why)."""
    from ..weights.model_sources import resolve
    from ..text import model_name_problem

    if model_name_problem(model):
        return model
    try:
        return resolve(model).name
    except (ValueError, OSError, RuntimeError):
        return model
