"""What a runner runs, and how a job stops: the executor over the registry (`make_executor`), the progress a runner
hands a job (`JobProgress`: progress, live data and one check) and the ways a job stops (`Cancelled`, `Preempted`,
`JobTimeLimit`; `time_limited` for the CLI), a job's dedupe key, its error as one line, and whether a done job's
saved outputs are still there. Plain functions and types: `jobs.py` holds the queue that uses them."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UserError, internal
from ..analysis.primitives.stopping import Check, Stop
from .errors import ServiceError
from .calibration import measuring

Progress = Callable[[float, str], None]
Executor = Callable[[str, dict[str, Any], Progress], dict[str, Any]]


def job_key(kind: str, params: dict[str, Any], **identity: Any) -> str:
    """Dedupe key of a job: its kind, normalized params, and what identifies its inputs (task content
    hash, canonical model name)."""
    blob = json.dumps({"kind": kind, "params": params, **identity}, sort_keys=True, default=str)
    return f"{kind}:{hashlib.sha256(blob.encode()).hexdigest()[:32]}"


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
    HEADLENS_JOB_TIMEOUT_S). `kernel.analyze` installs the check (`stopping.checking`), so the analysis stops at
    its next batch, training step or generated token past the limit, as a service job does; each progress step
    checks too."""
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
    runs (e.g. a training loss curve so far; shown as the job's `live` field), and `check()`, which raises a
    `stopping.Stop` (cancelled, preempted, past the time limit) and which `kernel.analyze` installs for the loops
    (`stopping.checking`). `progress` and `live` run the check first."""

    report: Progress
    live: Callable[[dict[str, Any]], None]
    check: Check | None = None

    def __call__(self, fraction: float, message: str = "") -> None:
        self.report(fraction, message)

def make_executor(pool: Any, tasks: Any) -> Executor:
    """An executor that runs registered analysis kinds with models from `pool` and tasks from `tasks`.

    `params` holds `model` and `task` (when the kind uses them) and the kind's own fields."""
    def execute(kind: str, params: dict[str, Any], progress: Progress) -> dict[str, Any]:
        from ..analysis.kernel import analyze
        from ..analysis.kinds import get_kind

        spec = get_kind(kind)
        fields = dict(params)
        model, task = fields.pop("model", None), fields.pop("task", None)
        lm = pool.get(model) if spec.uses_model else None
        t = tasks.get(task) if spec.uses_task else None
        name = pool.check(model) if spec.uses_model else None
        plan, cpu = planned(spec, fields, name, t, lm)
        with measuring(name, spec.name, plan, cpu):  # what it really cost, for the next estimates (`calibration`)
            out = analyze(kind, lm, t, fields, progress=progress, live=getattr(progress, "live", None)).to_json()
        if kind == "model_info":  # its seconds per token make the time estimates of this model's jobs
            from .estimate import note_speed

            note_speed(pool.check(model), out)
        return out
    return execute


def planned(spec: Any, fields: dict[str, Any], model: str | None, task: Any, lm: Any) -> tuple[float | None, bool]:
    """(the plan's seconds of a job at the model's measured speed, whether they are CPU seconds): what
    `calibration.measuring` compares the job's own time with. None where no speed was measured (an assumed speed
    is not what the correction corrects) or the params declare no cost."""
    from .estimate import estimate, measured_speed

    sp = measured_speed(model) if spec.uses_model else None
    if spec.uses_model and sp is None:
        return None, False
    try:
        e = estimate(spec, spec.params.model_validate(fields), model, task, lm=lm, load=False)  # no share probe
    except Exception:  # noqa: BLE001 - the job itself says what is wrong with its params
        return None, False
    return e.plan_seconds, sp is None or sp.load == 0.0


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
