"""Job runners: the `JobRunner` interface the routes use, and `LocalJobRunner`, one worker thread.

A runner takes admitted jobs (`admit.Admission`: its `kind`, normalized `params`, cache `key` and `estimate`) and
hands each to its executor; a runner that ships them elsewhere (Ray) sends the plain data (kind, params, key) and
can replace `LocalJobRunner` without touching the routes.

`LocalJobRunner`:
- runs jobs one at a time, in submission order within a lane (GPU work is serialized);
- has three lanes, taken in this order by a free worker: `live` (a POST /jobs estimated at most LIVE_MAX_S: a toggle),
  `interactive` (every other POST /jobs) and `sweep` (a sweep's jobs). A queued job of a higher lane that finds every
  worker busy makes a running job of a lower lane give way: that job stops at its next check (`stopping`) and waits at the
  head of its own lane (what it finished through `ctx.call` stays cached), so a toggle never waits behind a long
  job, whoever started it. Bounded, so a long job still finishes: a sweep job gives way to interactive jobs at most
  PREEMPT_MAX times; any job gives way to live jobs while the work it may lose doing so (the running time of the
  attempts it abandoned) stays within max(LIVE_LOSS_MIN_S, LIVE_LOSS_SHARE x its estimate). Each lane has its own
  HEADLENS_MAX_QUEUE, so a sweep never fills the interactive queue; a request of a higher lane for a job queued in a
  lower one moves it up;
- says what a queued job waits for: "queued behind ablation_curves (about 40 s left)", the running job's remaining
  time from its own progress (else its estimate), and the queued jobs ahead with their estimates;
- deduplicates: a request with the key of a queued, running or done job gets that job back; a done job whose
  outputs are gone (a saved tensor its result names, deleted or damaged since: `outputs_present`) is no result,
  and the request queues the job again;
- stops a job cooperatively: one check (`stopping.check`, installed for the job's thread; each progress step runs it
  too) raises `Cancelled` once the job is cancelled, `Preempted` when it must give way, and `JobTimeLimit` past
  HEADLENS_JOB_TIMEOUT_S; every loop of the analyses that can run long calls it once per batch, training step or
  generated token, so a job stops within about one of those past its limit, whatever its size. The time limit is
  wall time from the job's first start: the time it spent giving way counts.

Shared jobs and DELETE: a job counts its submitters. The POST that creates it counts 1; each later POST that gets the
same *active* (queued or running) job back adds 1 (a finished one adds nothing). Each DELETE of an active job withdraws
one submitter; the job is cancelled only when the count reaches 0, so one client's DELETE cannot end the identical job
another client is waiting for (it answers "withdrawn: N other submitter(s) still wait for this job"). Ids are not
secrets between clients: k DELETEs cancel a job that k POSTs share, whoever sends them.
"""
from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import ServiceError
from .limits import Limits
from ..store.jsonable import to_jsonable
from ..analysis.primitives.stopping import checking
from .execute import Cancelled, Executor, JobProgress, JobTimeLimit, Preempted, describe_error, outputs_present_in
from .schemas import ACTIVE_STATES, JobStatus
from .timing import remaining_seconds

log = logging.getLogger(__name__)

# -- the interface ------------------------------------------------------------------------------------
class JobRunner(ABC):
    """What the routes need from a job queue. Every argument and return value is plain data."""

    @abstractmethod
    def submit(self, job: Any, lane: str = "interactive") -> JobStatus:
        """Queue admitted `job` (`admit.Admission`) in `lane` (interactive, or sweep), or return the queued, running
        or done job with the same key; an interactive job estimated at most LIVE_MAX_S goes into the live lane."""

    @abstractmethod
    def done(self, job: Any, result: dict[str, Any]) -> JobStatus:
        """A cached `result` of admitted `job` as a finished job (nothing runs): the done job of the same key when
        there is one, else a new one, so its id answers GET /jobs/{id} like any job's."""

    @abstractmethod
    def get(self, job_id: str, include_result: bool = True) -> JobStatus | None:
        """The job's status, or None for an unknown id."""

    @abstractmethod
    def cancel(self, job_id: str) -> JobStatus | None:
        """Cancel a queued or running job (a finished job is returned unchanged); None for an unknown id."""

    @abstractmethod
    def list(self) -> list[JobStatus]:
        """Known jobs, newest first, without results."""

    def close(self) -> None:
        """Stop the workers (jobs still queued are dropped)."""


# -- the local runner -------------------------------------------------------------------------------------
@dataclass
class _Job:
    id: str
    kind: str
    params: dict[str, Any]
    key: str
    admission: Any = None
    created: float = field(default_factory=time.time)
    status: str = "queued"
    progress: float = 0.0
    message: str = "queued"
    result: dict[str, Any] | None = None
    error: str | None = None
    error_type: str | None = None
    started: float | None = None
    first_started: float | None = None  # the time limit counts from here, giving way included
    finished: float | None = None
    submitters: int = 1
    live: dict[str, Any] | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    lane: str = "interactive"
    seconds: float | None = None  # the admission's estimate, when known
    preempt: threading.Event = field(default_factory=threading.Event)
    preempt_for: str = ""  # the lane it gives way to
    preempted: int = 0  # times it gave way (to live or interactive jobs)
    gave_way_interactive: int = 0  # of which to interactive jobs (a sweep job: at most PREEMPT_MAX)
    lost_s: float = 0.0  # running time of the attempts it abandoned (an upper bound on the work giving way cost)
    ran_on: dict[str, Any] | None = None  # where it ran (the Ray runner reports it: node, and lost attempts)

    def snapshot(self, include_result: bool = True) -> JobStatus:
        hit = self.result.get("cache_hit") if self.result else None
        running = self.status == "running" and self.started is not None
        remaining = remaining_seconds(self.progress, time.time() - self.started) if running else None  # type: ignore
        return JobStatus(id=self.id, kind=self.kind, status=self.status, progress=self.progress,  # type: ignore[arg-type]
                         message=self.message, result=self.result if include_result else None, error=self.error,
                         error_type=self.error_type, params=self.params, created=self.created, started=self.started,
                         finished=self.finished, remaining_s=remaining, cache_hit=hit if isinstance(hit, bool) else None,
                         live=self.live if self.status in ACTIVE_STATES else None, submitters=self.submitters,
                         lane=self.lane, preempted=self.preempted, ran_on=self.ran_on)


LANES = ("live", "interactive", "sweep")  # a free worker takes the first lane that has a job
SUBMIT_LANES = ("interactive", "sweep")  # what a caller asks for; `live` is chosen from the estimate
LIVE_MAX_S = 5.0  # an interactive job estimated at most this many seconds runs in the live lane (a toggle)
HOLD_OVER_S = 15.0  # POST /jobs with start `if_short`: a job estimated over this waits for Run (`held`)
PREEMPT_MAX = 3  # times a sweep job gives way to interactive ones; after that it runs to its end
LIVE_LOSS_SHARE = 0.5  # a job gives way to live jobs while the work it may lose stays within this share of its
LIVE_LOSS_MIN_S = 30.0  # estimate, or this many seconds, whichever is more


def lane_for(lane: str, seconds: float | None) -> str:
    """The lane a job runs in: `live` for an interactive job estimated at most LIVE_MAX_S, else the lane asked."""
    return "live" if lane == "interactive" and seconds is not None and seconds <= LIVE_MAX_S else lane


class LocalJobRunner(JobRunner):
    """One worker thread, jobs in order; see the module docstring. `workers=N` runs N jobs at once (in
    submission order of starting): what `ray_runner.RayJobRunner` uses, its executor shipping each job to Ray."""

    def __init__(self, execute: Executor, limits: Limits | None = None,
                 keep_finished: int = 200, workers: int = 1,
                 outputs_present: Callable[[dict[str, Any]], bool] | None = None):
        self._execute = execute
        self._outputs_present = outputs_present or outputs_present_in()
        self._n_workers = max(1, int(workers))  # >1: jobs run concurrently (a runner that ships them elsewhere)
        self._limits = limits or Limits.from_env()
        self._keep = keep_finished
        self._jobs: dict[str, _Job] = {}
        self._by_key: dict[str, str] = {}
        self._queues: dict[str, deque[str]] = {lane: deque() for lane in LANES}
        self._running: list[_Job] = []
        self._cond = threading.Condition()
        self._workers: list[threading.Thread] = []
        self._closed = False

    # -- interface ------------------------------------------------------------------------------------
    def submit(self, job: Any, lane: str = "interactive") -> JobStatus:
        if lane not in SUBMIT_LANES:
            raise ValueError(f"lane must be one of {SUBMIT_LANES}, not {lane!r}")
        a, key = job, job.key
        seconds = getattr(getattr(a, "estimate", None), "seconds", None)
        lane = lane_for(lane, seconds)
        with self._cond:
            if self._closed:
                raise ServiceError("the job runner is shut down", status=503)
            same = self._jobs.get(self._by_key.get(key, ""))
            if same is not None and same.status == "done" and not self._outputs_present(same.result or {}):
                log.info("job %s (%s): its saved outputs are gone; computing it again", same.id, same.kind)
                del self._by_key[key]
                same.message = "done; its saved outputs are gone since (a new request computes it again)"
                same = None
            if same is not None and same.status in (*ACTIVE_STATES, "done") and not same.cancel.is_set():
                if same.status in ACTIVE_STATES:
                    same.submitters += 1
                    if LANES.index(lane) < LANES.index(same.lane):  # someone waits for it now: it moves up
                        self._promote(same, lane)
                return self._snapshot(same)
            self._limits.check_queue(sum(j.status in ACTIVE_STATES and j.lane == lane for j in self._jobs.values()))
            job = _Job(id=secrets.token_hex(8), kind=a.kind, params=a.params, key=key, admission=a, lane=lane,
                       seconds=float(seconds) if seconds is not None and math.isfinite(seconds) else None)
            self._jobs[job.id] = job
            self._by_key[key] = job.id
            self._queues[lane].append(job.id)
            self._prune()
            self._start_worker()
            self._make_room()
            self._cond.notify_all()
            return self._snapshot(job)

    def done(self, job: Any, result: dict[str, Any]) -> JobStatus:
        with self._cond:
            same = self._jobs.get(self._by_key.get(job.key, ""))
            if same is not None and same.status == "done" and not same.cancel.is_set():  # its id, the cache's answer
                return self._snapshot(same).model_copy(update={"result": result, "cache_hit": True})
            now = time.time()
            j = _Job(id=secrets.token_hex(8), kind=job.kind, params=job.params, key=job.key, admission=job,
                     status="done", progress=1.0, message="cached", result=result, started=now, finished=now)
            self._jobs[j.id] = j
            if same is None or same.status not in ACTIVE_STATES:
                self._by_key[job.key] = j.id
            self._prune()
            return self._snapshot(j)

    def get(self, job_id: str, include_result: bool = True) -> JobStatus | None:
        with self._cond:
            job = self._jobs.get(job_id)
            return self._snapshot(job, include_result) if job else None

    def cancel(self, job_id: str) -> JobStatus | None:
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None:
                return None
            if job.status in ACTIVE_STATES and not job.cancel.is_set():
                job.submitters -= 1
                if job.submitters > 0:
                    others = job.submitters
                    return self._snapshot(job).model_copy(update={
                        "message": f"withdrawn: {others} other submitter{'s' if others != 1 else ''} still "
                                   f"wait{'s' if others == 1 else ''} for this job"})
                job.cancel.set()
                if self._by_key.get(job.key) == job.id:
                    del self._by_key[job.key]
                if job.status == "queued":
                    self._queues[job.lane].remove(job.id)
                    self._finish(job, "cancelled", "cancelled before it started")
                else:
                    job.message = "cancelling"
            return self._snapshot(job)

    def list(self) -> list[JobStatus]:
        with self._cond:
            jobs = sorted(self._jobs.values(), key=lambda j: j.created, reverse=True)
            return [self._snapshot(j, include_result=False) for j in jobs]

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            for queue in self._queues.values():
                for jid in list(queue):
                    self._jobs[jid].cancel.set()
                    self._finish(self._jobs[jid], "cancelled", "the service shut down")
                queue.clear()
            for job in self._jobs.values():
                job.cancel.set()
            self._cond.notify_all()
        for worker in self._workers:
            worker.join(timeout)

    # -- internals ----------------------------------------------------------------------------------
    def _snapshot(self, job: _Job, include_result: bool = True) -> JobStatus:
        if job.status == "queued":
            job.message = self._wait_message(job)
        return job.snapshot(include_result)

    def _ahead(self, job: _Job) -> list[_Job]:
        """The queued jobs a worker takes before `job`: those of higher lanes, then those before it in its own."""
        ahead: list[_Job] = []
        for lane in LANES[:LANES.index(job.lane) + 1]:
            queue = self._queues[lane]
            ids = list(queue)[:queue.index(job.id)] if lane == job.lane and job.id in queue else list(queue)
            ahead += [self._jobs[i] for i in ids if i != job.id]
        return ahead

    def _wait_message(self, job: _Job) -> str:
        """What a queued job waits for: `queued behind ablation_curves (about 40 s left)`, each running job (one
        giving way says so) and the queued jobs a worker takes before it, with their estimates."""
        from ..text import describe_seconds

        now = time.time()
        parts = []
        for r in self._running:
            elapsed = now - (r.started or now)
            left = remaining_seconds(r.progress, elapsed, r.seconds)
            parts.append(f"{r.kind} (giving way at its next step)" if r.preempt.is_set() else
                         f"{r.kind} ({describe_seconds(left)} left)" if left is not None else
                         f"{r.kind} (running for {elapsed:.0f} s, time left unknown)")
        ahead = self._ahead(job)
        if ahead:
            kinds = list(dict.fromkeys(a.kind for a in ahead))
            known = [a.seconds for a in ahead if a.seconds is not None]
            took = describe_seconds(sum(known)) + (" and more" if len(known) < len(ahead) else "") if known else \
                "time unknown"
            parts.append(f"{len(ahead)} queued job{'s' if len(ahead) != 1 else ''} "
                         f"({', '.join(kinds[:3])}{', ...' if len(kinds) > 3 else ''}: {took})")
        paused = f"gave way {job.preempted}x; " if job.preempted else ""
        return f"queued ({paused}behind {' and '.join(parts)})" if parts else f"queued ({paused}starting)"

    def _promote(self, job: _Job, lane: str) -> None:
        """A job a request of a higher lane now waits for moves up to that lane (a sweep's job an interactive request
        waits for, an interactive job a live request asks for)."""
        was, job.lane = job.lane, lane
        job.preempt.clear()
        if job.status == "queued" and job.id in self._queues[was]:
            self._queues[was].remove(job.id)
            self._queues[lane].append(job.id)
        self._make_room()

    def _may_give_way(self, job: _Job, lane: str, now: float) -> bool:
        """Whether running `job` may give way to a queued job of `lane` (see the module docstring's bounds)."""
        if job.preempt.is_set() or LANES.index(job.lane) <= LANES.index(lane):
            return False
        if lane == "interactive":
            return job.gave_way_interactive < PREEMPT_MAX
        budget = max(LIVE_LOSS_MIN_S, LIVE_LOSS_SHARE * (job.seconds or 0.0))
        return job.lost_s + (now - (job.started or now)) <= budget

    def _make_room(self) -> None:
        """With every worker busy, ask running jobs of lower lanes to give way (see the module docstring): one per
        job of a higher lane waiting beyond the free workers; the cheapest to stop first (a sweep's before an
        interactive one, the one started last first)."""
        now = time.time()
        free = self._n_workers - len(self._running) + sum(j.preempt.is_set() for j in self._running)
        waiting = 0
        for lane in ("live", "interactive"):
            waiting += len(self._queues[lane])
            need = waiting - free
            if need <= 0:
                continue
            candidates = sorted((j for j in self._running if self._may_give_way(j, lane, now)),
                                key=lambda j: (-LANES.index(j.lane), -(j.started or 0.0)))
            for j in candidates[:need]:
                j.preempt.set()
                j.preempt_for = lane
                free += 1

    def _finish(self, job: _Job, status: str, message: str) -> None:
        job.status, job.message, job.finished = status, message, time.time()

    def _prune(self) -> None:
        finished = [j for j in self._jobs.values() if j.status not in ACTIVE_STATES]
        for job in sorted(finished, key=lambda j: j.created)[: max(0, len(finished) - self._keep)]:
            del self._jobs[job.id]
            if self._by_key.get(job.key) == job.id:
                del self._by_key[job.key]

    def _start_worker(self) -> None:
        self._workers = [w for w in self._workers if w.is_alive()]
        while len(self._workers) < self._n_workers:
            worker = threading.Thread(target=self._loop, name=f"headlens-worker-{len(self._workers)}", daemon=True)
            worker.start()
            self._workers.append(worker)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not any(self._queues.values()) and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                lane = next(name for name in LANES if self._queues[name])
                job = self._jobs[self._queues[lane].popleft()]
                job.status, job.started, job.message = "running", time.time(), "starting"
                job.first_started = job.started if job.first_started is None else job.first_started
                job.preempt.clear()
                self._running.append(job)
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._running.remove(job)
                    self._make_room()
                    self._cond.notify_all()

    def _interrupt(self, job: _Job) -> None:
        """Raise what stops `job` at this step: Cancelled, Preempted (a job of a higher lane waits for its worker) or
        JobTimeLimit; nothing otherwise. Every progress step calls it (and so may any finer cooperative check)."""
        if job.cancel.is_set():
            raise Cancelled()
        if job.preempt.is_set():
            with self._cond:  # the job it gave way to may have been cancelled meanwhile: then it goes on
                if any(self._queues[lane] for lane in LANES[:LANES.index(job.lane)]):
                    raise Preempted()
                job.preempt.clear()
        first = job.first_started
        if first is not None and time.time() - first > self._limits.job_timeout_s:
            paused = f", giving way {job.preempted}x included" if job.preempted else ""
            raise JobTimeLimit(f"the job ran past this server's time limit of {self._limits.job_timeout_s} s from "
                               f"its first start{paused} (HEADLENS_JOB_TIMEOUT_S); ask for fewer prompts or values")

    def _run(self, job: _Job) -> None:
        def check() -> None:  # the one check for cancel, preempt and the time limit (`stopping`)
            self._interrupt(job)

        def report(fraction: float, message: str = "") -> None:
            check()
            with self._cond:
                job.progress = min(max(float(fraction), 0.0), 1.0) if math.isfinite(fraction) else job.progress
                job.message = message or job.message

        def live(data: dict[str, Any]) -> None:
            check()
            with self._cond:
                job.live = to_jsonable(data)

        progress = JobProgress(report, live, check, lambda info: setattr(job, "ran_on", to_jsonable(info)), job.lane)

        try:
            with checking(check):
                progress(0.0, "running")
                result = to_jsonable(self._execute(job.admission, progress))
        except Cancelled:
            with self._cond:
                self._finish(job, "cancelled", "cancelled")
        except Preempted:  # back to the head of the sweep lane, unless it was cancelled or promoted meanwhile
            with self._cond:
                job.preempt.clear()
                if job.cancel.is_set():
                    self._finish(job, "cancelled", "cancelled")
                else:
                    job.preempted += 1
                    job.gave_way_interactive += job.preempt_for == "interactive"
                    job.lost_s += time.time() - (job.started or time.time())
                    job.status, job.started, job.progress, job.live = "queued", None, 0.0, None
                    self._queues[job.lane].appendleft(job.id)
                    self._cond.notify_all()
        except Exception as e:  # a failed job never takes the worker down
            if describe_error(e).startswith("internal error"):
                log.exception("job %s (%s) failed", job.id, job.kind)
            _free_accelerator_memory(e)
            with self._cond:
                job.error, job.error_type = describe_error(e), type(e).__name__
                self._finish(job, "error", "failed")
                if self._by_key.get(job.key) == job.id:
                    del self._by_key[job.key]
        else:
            with self._cond:
                job.result, job.progress = result, 1.0
                self._finish(job, "done", "done")
                final = getattr(job.admission, "key", job.key)  # keyed by its model's fingerprint once loaded
                if final != job.key and final not in self._by_key:
                    self._by_key[final] = job.id


def _free_accelerator_memory(e: BaseException) -> None:
    if type(e).__name__ != "OutOfMemoryError":
        return
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception:
        pass
