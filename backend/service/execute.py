"""What a runner runs, and how a job stops: the executor over the registry (`make_executor`: an admitted job into
the kernel, its time kept for the next estimates), the progress a runner hands a job (`JobProgress`: progress,
live data and one check), the ways a job stops (`Cancelled`, `Preempted`, `JobTimeLimit`; `time_limited` for the
CLI), a job's error as one line, and whether a done job's saved outputs are still there."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UserError, internal
from ..analysis.primitives.stopping import Check, Stop
from .errors import ServiceError

Progress = Callable[[float, str], None]
Executor = Callable[[Any, Progress], dict[str, Any]]


def describe_error(e: BaseException) -> str:
    """A one-line message for a failed job: a user error's message (`errors.UserError`: a bad input, an unknown
    model, a full disk...), the time limit's, out of memory's; anything else is a fault of the product, reported as
    `internal error (ValueError): ...` (`errors.internal`; the runner logs its traceback)."""
    name = type(e).__name__
    if name == "OutOfMemoryError" or isinstance(e, MemoryError):
        return (f"out of memory ({name}: {str(e).splitlines()[0][:200] if str(e) else 'no details'}); "
                f"try fewer prompts, fewer shots or a smaller batch_size")
    if isinstance(e, ServiceError):
        return e.message
    if isinstance(e, (UserError, JobTimeLimit)):
        return str(e)
    return internal(e)


class Cancelled(Stop):
    """Raised inside a job (by its check: `stopping.check`, and its progress callback) once it has been cancelled."""


class Preempted(Stop):
    """Raised inside a job (by its check) when a job of a higher lane needs its worker: the job goes
    back to the head of its own lane."""


class JobTimeLimit(Stop):
    """Raised inside a job (by its check) once it has run past the per-job time limit."""


def time_limited(progress: Progress, limit_s: float) -> "JobProgress":
    """`progress`, with a check that raises JobTimeLimit once `limit_s` seconds have passed (the CLI's
    HEADLENS_JOB_TIMEOUT_S); each progress step checks too."""
    start = time.monotonic()

    def check() -> None:
        if time.monotonic() - start > limit_s:
            raise JobTimeLimit(f"the analysis ran past the time limit of {limit_s:g} s (HEADLENS_JOB_TIMEOUT_S); "
                               f"ask for fewer prompts or values, or raise the limit")

    def report(fraction: float, message: str = "") -> None:
        check()
        progress(fraction, message)
    return JobProgress(report, lambda data: check(), check)


@dataclass
class JobProgress:
    """What a runner hands a job: `progress(fraction, message)`, `live(data)` for data a page draws while the job
    runs (the job's `live` field), and `check()`, which raises a `stopping.Stop` (cancelled, preempted, past the
    time limit) and which `kernel.analyze` installs for the loops. `progress` and `live` run the check first.
    `where(info)` records where the job runs (the Ray runner: its node, and the nodes of attempts whose worker
    died); `lane` is the job's lane (`live`, `interactive`, `sweep`)."""

    report: Progress
    live: Callable[[dict[str, Any]], None]
    check: Check | None = None
    where: Callable[[dict[str, Any]], None] | None = None
    lane: str = ""

    def __call__(self, fraction: float, message: str = "") -> None:
        self.report(fraction, message)


def make_executor(pool: Any, tasks: Any = None) -> Executor:
    """An executor of admitted jobs (`admit.Admission`) with models from `pool`: the kernel gets the admission's
    params, key and plan; a computed result's wall seconds (the model's load left out) go to `timing.record`. A model
    loaded for the job has its CPU thread count probed then (`threads.best_threads`, cached 10 minutes; nothing on a
    GPU), with the load's time, so the first toggle after a load is not the one that pays it."""
    def execute(a: Any, progress: Progress) -> dict[str, Any]:
        from ..analysis.kernel import analyze
        from .timing import LOAD, record

        precision = getattr(a, "precision", None)  # a precision other than the pool's default
        at = (precision,) if precision else ()
        resident, t0 = a.spec.uses_model and pool.peek(a.model, *at) is not None, time.perf_counter()
        lm = pool.get(a.model, *at) if a.spec.uses_model else None
        if a.spec.uses_model and not resident:  # what loading it took: a later first job's estimate adds it
            from ..analysis.primitives.threads import best_threads
            from ..model.loading import LoadedModel

            if isinstance(lm, LoadedModel):  # the CPU's thread probe, with the load: a first toggle does not pay it
                best_threads(lm)
            record(a.model, LOAD, 1.0, time.perf_counter() - t0)
        warm, t0 = a.spec.module in sys.modules, time.perf_counter()  # a first run imports its kind: not timed
        key = a.keyed_by(lm) if lm is not None and hasattr(a, "keyed_by") else a.key  # its model's fingerprint now
        r = analyze(a.kind, lm, a.task, a.p, progress=progress, live=getattr(progress, "live", None), key=key,
                    plan=a.plan)
        if not r.cache_hit and warm:
            record(a.model if a.spec.uses_model else None, a.kind, a.estimate.units, time.perf_counter() - t0,
                   a.estimate.shape.n_params or 0)
        return r.to_json()
    return execute


def outputs_present_in(store: Any = None) -> Callable[[dict[str, Any]], bool]:
    """Whether every saved tensor a result names (its `tensor` / `tensors` fields) is still stored and intact, in
    `store` (a TensorStore; default: the cache folder's, looked up at each call)."""
    def present(result: dict[str, Any]) -> bool:
        from ..store.tensor_store import default_store, tensor_refs

        refs = tensor_refs(result)
        if not refs:
            return True
        s = store or default_store()
        return all(s.has(tid) for tid in refs)
    return present
