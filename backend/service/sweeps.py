"""Sweeps: one analysis over a model zoo and a task suite, as ordinary jobs of whichever runner is configured.

    POST /sweeps {"models": ["default", "/m/llama"], "tasks": ["syn-sentiment", "syn-antonym"],
                  "kinds": ["head_scores", "icl_curve"], "seeds": [0, 1, 2], "params": {"shots": 8, "prompts": 50}}
    python -m backend sweep --models default,/m/llama --tasks syn-sentiment,syn-antonym --kinds head_scores --seeds 0,1

A sweep is the cross product models x tasks x kinds x seeds, each cell one job admitted exactly as POST /jobs
admits it (same validation, same dedupe key, same cache), plus a sweep record: its jobs, their progress (per
sweep and per model) and a summary built from their results. A kind without `seed` runs once per (model,
task), one without a task once per model. `params` go to every kind that has the field (a field no chosen kind
has is refused); `"<kind>.<field>"` goes to that kind only (`{"shots": 8, "icl_curve.shots": [0, 4, 8]}`). Everything is validated before any job is queued: an unknown model, task or kind is a 4xx
naming it.

The jobs go to the runner a window at a time (`Limits.sweep_window`, HEADLENS_SWEEP_WINDOW: default twice the
runner's workers and at least 32, at most half the job queue HEADLENS_MAX_QUEUE), so a sweep of
thousands of jobs neither overflows the queue nor starves interactive jobs; jobs whose results are cached end
at once, so a sweep that is run again continues where the last one stopped. Cancelling a sweep withdraws its
jobs (an identical job another client waits for goes on).

The summary of a sweep's results: `sweep_summary.py`.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from .admit import Admission, admit, describe_validation
from .errors import BadRequest, NotFound, ServiceError, clip
from .limits import Limits
from .sweep_summary import compact, dedupe, placement, summarize

log = logging.getLogger(__name__)

FINISHED = ("done", "error", "cancelled")
MAX_KEEP = 50  # finished sweeps kept in memory


class SweepRequest(BaseModel):
    """A sweep: models x tasks x kinds x seeds, with `params` for every kind that has the field."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"models": ["default"], "tasks": ["syn-sentiment", "syn-antonym"], "kinds": ["head_scores", "icl_curve"],
         "seeds": [0, 1], "params": {"shots": 4, "prompts": 20}}]})

    models: list[str] = Field(..., min_length=1, max_length=64)
    tasks: list[str] = Field(..., min_length=1, max_length=512)
    kinds: list[str] = Field(default_factory=lambda: ["head_scores"], min_length=1, max_length=16)
    seeds: list[Annotated[int, Strict(), Field(ge=0)]] = Field(default_factory=lambda: [0], min_length=1,
                                                               max_length=64)
    params: dict[str, Any] = Field(default_factory=dict, description="fields given to every kind that has them; "
                                   "`<kind>.<field>` to one kind only")
    name: str | None = Field(None, max_length=200)


@dataclass
class Cell:
    """One job of a sweep."""

    model: str | None
    task: str | None
    kind: str
    seed: int | None
    admitted: Admission
    job_id: str | None = None
    served: bool = False  # its submission found the job finished already: nothing computed for this sweep
    status: str = "pending"
    progress: float = 0.0
    cache_hit: bool | None = None
    error: str | None = None
    summary: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    ran_on: dict[str, Any] | None = None  # the job's `ran_on`: its node (Ray), and the nodes of lost attempts

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "task": self.task, "kind": self.kind, "seed": self.seed, "job_id": self.job_id,
                "status": self.status, "progress": round(self.progress, 4), "cache_hit": self.cache_hit,
                "error": self.error, "ran_on": self.ran_on}


def sweep_cells(req: SweepRequest, pool: Any, tasks: Any, limits: Limits) -> list[Cell]:
    """Every job of the sweep, admitted (validated, keyed); a ServiceError naming the bad item otherwise."""
    from ..analysis.kinds import KINDS, get_kind

    models, task_ids, kinds, seeds = (dedupe(x) for x in (req.models, req.tasks, req.kinds, req.seeds))
    specs = []
    for k in kinds:
        try:
            specs.append(get_kind(k))
        except KeyError:
            raise BadRequest(f"sweep: unknown kind {clip(k, 60)!r}; kinds: {', '.join(KINDS)}") from None
    specs = list({s.name: s for s in specs}.values())  # an alias is its kind: once, by its name
    kinds = [s.name for s in specs]
    for s in seeds:
        if s < 0:
            raise BadRequest(f"sweep: seeds must be non-negative, got {s}")
    size = sum((len(models) if spec.uses_model else 1) * (len(task_ids) if spec.uses_task else 1)
               * (len(seeds) if "seed" in spec.params.model_fields else 1) for spec in specs)
    if size > limits.max_sweep_jobs:  # from the grid's size, before any cell is admitted
        raise BadRequest(f"sweep: {size:,} jobs ({len(models)} models x {len(task_ids)} tasks x {len(kinds)} kinds x "
                         f"{len(seeds)} seeds), over this server's limit of {limits.max_sweep_jobs:,} "
                         f"(HEADLENS_MAX_SWEEP_JOBS); split it")
    if "seed" in req.params:
        raise BadRequest("sweep: give seeds as `seeds`, not in `params`")
    for bad in ("model", "task", "kind"):
        if bad in req.params:
            raise BadRequest(f"sweep: `{bad}` cannot be a param; list them in `{bad}s`")
    common = {f: v for f, v in req.params.items() if "." not in f}
    own: dict[str, dict[str, Any]] = {}
    for f, v in req.params.items():
        if "." in f:
            given, _, name = f.partition(".")
            k = KINDS.resolve(given) or given  # an alias names its kind
            if k not in kinds:
                raise BadRequest(f"sweep params: {clip(f, 60)!r} names kind {clip(given, 60)!r}, which is not in kinds "
                                 f"({', '.join(kinds)})")
            if name not in get_kind(k).params.model_fields:
                raise BadRequest(f"sweep params: {clip(f, 60)!r}: kind {k} has no field {clip(name, 60)!r}")
            own.setdefault(k, {})[name] = v
    unknown = [f for f in common if not any(f in spec.params.model_fields for spec in specs)]
    if unknown:
        raise BadRequest(f"sweep params: {', '.join(repr(clip(f, 60)) for f in unknown)} is a field of none of the "
                         f"kinds {', '.join(kinds)}")
    if any(s.uses_model for s in specs):
        for m in models:
            try:
                pool.check(m)
            except ServiceError as e:
                raise type(e)(f"sweep: model {clip(m)!r}: {e.message}", e.status) from None
    if any(s.uses_task for s in specs):
        for t in task_ids:
            try:
                tasks.get(t)
            except ServiceError as e:
                raise type(e)(f"sweep: task {clip(t)!r}: {e.message}", e.status) from None
    limit = limits.max_sweep_jobs
    cells: list[Cell] = []
    seen: set[str] = set()
    for m in models:
        for t in task_ids:
            for spec in specs:
                for s in seeds:
                    has_seed = "seed" in spec.params.model_fields
                    body: dict[str, Any] = {"kind": spec.name,
                                            **({"model": m} if spec.uses_model else {}),
                                            **({"task": t} if spec.uses_task else {}),
                                            **{f: v for f, v in common.items() if f in spec.params.model_fields},
                                            **own.get(spec.name, {}),
                                            **({"seed": s} if has_seed else {})}
                    try:
                        a = admit(body, pool, tasks, limits)
                    except ServiceError as e:
                        where = ", ".join(x for x in (spec.name, m if spec.uses_model else None,
                                                      t if spec.uses_task else None,
                                                      f"seed {s}" if has_seed else None) if x)
                        raise type(e)(f"sweep job ({clip(where)}): {e.message}", e.status) from None
                    if a.key in seen:
                        continue
                    seen.add(a.key)
                    cells.append(Cell(m if spec.uses_model else None, t if spec.uses_task else None, spec.name,
                                      s if has_seed else None, a))
                    if len(cells) > limit:
                        raise BadRequest(f"sweep: more than {limit} jobs (HEADLENS_MAX_SWEEP_JOBS); split it")
    return cells


# -- the sweep record and its feeder ----------------------------------------------------------------------
@dataclass
class _Sweep:
    id: str
    request: SweepRequest
    cells: list[Cell]
    created: float = field(default_factory=time.time)
    finished: float | None = None
    status: str = "running"
    message: str = ""
    cancel: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    # summarize(cells), built on demand and kept until a job finishes (`stale()`): polls do not rebuild it
    _summary: dict[str, Any] | None = field(default=None, repr=False)

    def stale(self) -> None:
        """A job finished (its status or compact result changed): the next detailed snapshot rebuilds the summary."""
        self._summary = None

    def summary(self) -> dict[str, Any]:
        """The summary of the finished jobs (shared between snapshots: read it, do not change it)."""
        if self._summary is None:
            self._summary = summarize(self.cells)
        return self._summary

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("pending", "queued", "running", "done", "error", "cancelled")}
        for c in self.cells:
            out[c.status] = out.get(c.status, 0) + 1
        out["cached"] = sum(1 for c in self.cells if c.status == "done" and (c.cache_hit or c.served))
        out["total"] = len(self.cells)
        return out

    def snapshot(self, detail: bool = True) -> dict[str, Any]:
        n = max(len(self.cells), 1)
        per_model: dict[str, dict[str, Any]] = {}
        for c in self.cells:
            e = per_model.setdefault(str(c.model), {"model": c.model, "total": 0, "finished": 0, "progress": 0.0,
                                                    "errors": 0, "cached": 0})
            e["total"] += 1
            e["finished"] += c.status in FINISHED
            e["errors"] += c.status == "error"
            e["cached"] += bool(c.status == "done" and (c.cache_hit or c.served))
            e["progress"] += 1.0 if c.status in FINISHED else c.progress
        for e in per_model.values():
            e["progress"] = round(e["progress"] / max(e["total"], 1), 4)
        out = {"id": self.id, "name": self.request.name, "status": self.status, "message": self.message,
               "created": self.created, "finished": self.finished, "counts": self.counts(),
               "progress": round(sum(1.0 if c.status in FINISHED else c.progress for c in self.cells) / n, 4),
               "models": list(per_model.values()), "request": self.request.model_dump()}
        out["placement"] = placement(self.cells)
        if detail:
            out["jobs"] = [c.to_json() for c in self.cells]
            out["summary"] = self.summary()
        return out



class SweepManager:
    """Runs sweeps through a `JobRunner`: a feeder thread per sweep submits its jobs a window at a time."""

    def __init__(self, runner: Any, limits: Limits | None = None, keep_results: bool = False,
                 window: int | None = None, poll: float = 0.1):
        self.runner = runner
        limits = limits or Limits.from_env()
        # enough jobs in flight to keep every worker busy (a Ray runner's workers: HEADLENS_RAY_MAX_ACTORS), at most
        # half the job queue (raise HEADLENS_MAX_QUEUE for a cluster of many GPUs)
        workers = int(getattr(runner, "_n_workers", 1) or 1)
        wanted = limits.sweep_window or max(32, 2 * workers)
        self.window = max(1, window or min(wanted, max(1, limits.max_queue // 2)))
        self.keep_results, self.poll = keep_results, poll
        self._sweeps: dict[str, _Sweep] = {}
        self._lock = threading.Lock()

    def start(self, req: SweepRequest, cells: list[Cell]) -> dict[str, Any]:
        sw = _Sweep(secrets.token_hex(6), req, cells)
        with self._lock:
            self._sweeps[sw.id] = sw
            self._prune()
        from ..store.tensor_store import default_store

        for tid in {t for c in cells for t in c.admitted.tensors}:  # saved tensors its jobs read: kept meanwhile
            default_store().pin(tid, lambda sw=sw: sw.status not in FINISHED)
        sw.thread = threading.Thread(target=self._feed, args=(sw,), name=f"headlens-sweep-{sw.id}", daemon=True)
        sw.thread.start()
        return self.get(sw.id, detail=False) or {}

    def get(self, sweep_id: str, detail: bool = True) -> dict[str, Any] | None:
        with self._lock:
            sw = self._sweeps.get(sweep_id)
            return sw.snapshot(detail) if sw else None

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [s.snapshot(detail=False) for s in sorted(self._sweeps.values(), key=lambda s: -s.created)]

    def results(self, sweep_id: str) -> list[dict[str, Any]]:
        """The finished jobs' full results (only with keep_results, e.g. the CLI's --json)."""
        with self._lock:
            sw = self._sweeps[sweep_id]
            return [{**c.to_json(), "result": c.result} for c in sw.cells if c.result is not None]

    def cancel(self, sweep_id: str) -> dict[str, Any] | None:
        with self._lock:
            sw = self._sweeps.get(sweep_id)
            if sw is None:
                return None
            sw.cancel.set()
        if sw.thread is not None:
            sw.thread.join(10)
        return self.get(sweep_id, detail=False)

    def wait(self, sweep_id: str, timeout: float | None = None) -> dict[str, Any]:
        with self._lock:
            sw = self._sweeps[sweep_id]
        if sw.thread is not None:
            sw.thread.join(timeout)
        return self.get(sweep_id) or {}

    def tasks_in_use(self) -> set[str]:
        """The tasks of running sweeps' jobs that have not finished (an upload they name stays pinned)."""
        with self._lock:
            return {c.task for s in self._sweeps.values() if s.status == "running" for c in s.cells
                    if c.task and c.status not in FINISHED}

    def close(self) -> None:
        with self._lock:
            sweeps = list(self._sweeps.values())
        for sw in sweeps:
            sw.cancel.set()

    def _prune(self) -> None:
        done = sorted((s for s in self._sweeps.values() if s.status in FINISHED), key=lambda s: s.created)
        for s in done[: max(0, len(done) - MAX_KEEP)]:
            del self._sweeps[s.id]

    # -- the feeder ---------------------------------------------------------------------------------------
    def _feed(self, sw: _Sweep) -> None:
        pending = list(sw.cells)
        active: list[Cell] = []
        try:
            while pending or active:
                if sw.cancel.is_set():
                    self._withdraw(sw, active, pending)
                    return
                while pending and len(active) < self.window:
                    c = pending[0]
                    try:
                        j = self.runner.submit(c.admitted, lane="sweep")
                    except ServiceError as e:
                        if e.status == 429:  # the queue is full: try again shortly
                            break
                        raise
                    pending.pop(0)
                    with self._lock:
                        c.job_id, c.status, c.served = j.id, j.status, j.status == "done"
                    active.append(c)
                for c in list(active):
                    j = self.runner.get(c.job_id, include_result=False)
                    if j is None:  # forgotten by the runner before we saw it end: submit it again
                        with self._lock:
                            c.status, c.job_id = "pending", None
                        active.remove(c)
                        pending.insert(0, c)
                        continue
                    with self._lock:
                        c.status, c.progress = j.status, j.progress
                        c.ran_on = getattr(j, "ran_on", None) or c.ran_on
                    if j.status in FINISHED:
                        self._finish(sw, c, j)
                        active.remove(c)
                time.sleep(self.poll)
            with self._lock:
                errors = sum(c.status == "error" for c in sw.cells)
                gone = sum(c.status == "cancelled" for c in sw.cells)  # cancelled by a DELETE /jobs/{id} elsewhere
                why = list(dict.fromkeys(c.error for c in sw.cells if c.status == "error" and c.error))
                said = [f"{errors} job{'s' if errors != 1 else ''} failed" + (f": {clip(why[0], 400)}" if why else "")
                        + (f" (and {len(why) - 1} other error{'s' if len(why) > 2 else ''})" if len(why) > 1 else "")
                        ] if errors else []
                retried = [c for c in sw.cells if (c.ran_on or {}).get("lost")]
                if retried:
                    nodes = sorted({x.get("node_ip") or "?" for c in retried for x in c.ran_on["lost"]})
                    said.append(f"{len(retried)} job{'s' if len(retried) != 1 else ''} retried after their worker was "
                                f"lost (on {', '.join(nodes)})")
                if gone:  # the sweep did not get every result it was asked for: not "done"
                    said.append(f"{gone} job{'s were' if gone != 1 else ' was'} cancelled outside this sweep "
                                f"(DELETE /jobs/{{id}}); run the sweep again for the missing results")
                sw.status, sw.finished = ("error" if gone else "done"), time.time()
                sw.message = "; ".join(said) or "done"
        except Exception as e:  # the runner shut down, or a bug: the sweep ends, the message says why
            log.exception("sweep %s stopped", sw.id)
            with self._lock:
                for c in sw.cells:
                    if c.status not in FINISHED:
                        c.status = "cancelled"
                sw.status, sw.finished = "error", time.time()
                sw.message = getattr(e, "message", None) or f"{type(e).__name__}: {e}"

    def _finish(self, sw: _Sweep, c: Cell, j: Any) -> None:
        full = self.runner.get(c.job_id, include_result=True) if j.status == "done" else j
        result = full.result if full is not None else None
        with self._lock:
            sw.stale()
            c.progress = 1.0 if j.status == "done" else c.progress
            c.cache_hit = bool(result.get("cache_hit")) if result else None
            c.error = j.error
            if result is not None:
                c.summary = compact(c.kind, result)
                if self.keep_results:
                    c.result = result

    def _withdraw(self, sw: _Sweep, active: list[Cell], pending: list[Cell]) -> None:
        for c in active:
            try:
                self.runner.cancel(c.job_id)
            except Exception:
                pass
        with self._lock:
            for c in [*active, *pending]:
                if c.status not in FINISHED:
                    c.status = "cancelled"
            sw.status, sw.finished, sw.message = "cancelled", time.time(), "cancelled"


def parse_request(body: dict[str, Any]) -> SweepRequest:
    try:
        return SweepRequest.model_validate(body)
    except ValidationError as e:
        raise BadRequest("invalid sweep: " + describe_validation(e, list(SweepRequest.model_fields))) from None


# -- routes --------------------------------------------------------------------------------------------------
def add_routes(app: Any, runner: Any, pool: Any, tasks: Any, limits: Limits) -> SweepManager:
    """POST /sweeps, GET /sweeps, GET /sweeps/{id}, DELETE /sweeps/{id} on `app`."""
    manager = SweepManager(runner, limits)
    app.state.sweeps = manager

    doc = {"requestBody": {"required": True, "content": {"application/json": {
        "schema": SweepRequest.model_json_schema()}}}}

    @app.post("/sweeps", status_code=202, tags=["sweeps"], openapi_extra=doc)
    async def submit_sweep(request: Request) -> dict[str, Any]:
        """Start a sweep: models x tasks x kinds x seeds (see SweepRequest); its record, without jobs."""
        from fastapi.concurrency import run_in_threadpool

        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("invalid sweep: the body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("invalid sweep: send a JSON object {models, tasks, kinds, seeds, params}")
        req = parse_request(body)
        cells = await run_in_threadpool(sweep_cells, req, pool, tasks, limits)
        return manager.start(req, cells)

    @app.get("/sweeps", tags=["sweeps"])
    def list_sweeps() -> list[dict[str, Any]]:
        """Running and finished sweeps, newest first (counts and per-model progress, no jobs)."""
        return manager.list()

    @app.get("/sweeps/{sweep_id}", tags=["sweeps"])
    def get_sweep(sweep_id: str) -> dict[str, Any]:
        """A sweep with its jobs and the summary (models x tasks rows, per-model TR/TL depth and overlaps)."""
        return _found(manager.get(sweep_id), sweep_id)

    @app.delete("/sweeps/{sweep_id}", tags=["sweeps"])
    def cancel_sweep(sweep_id: str) -> dict[str, Any]:
        """Cancel a sweep: its queued jobs are withdrawn (jobs other clients also wait for go on)."""
        return _found(manager.cancel(sweep_id), sweep_id)

    return manager


def _found(s: dict[str, Any] | None, sweep_id: str) -> dict[str, Any]:
    if s is None:
        raise NotFound(f"no sweep {clip(sweep_id, 100)!r} on this service (sweeps live in memory)")
    return s
