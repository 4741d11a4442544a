"""The FastAPI app: `create_app()` wires the routes to a job runner, the model pool and the task store.

Routes: GET /health, GET /capabilities, GET /tasks, POST /tasks/upload, POST /jobs, POST /jobs/estimate, GET /jobs,
GET /jobs/{id}, DELETE /jobs/{id}; POST /tensors, GET /tensors/{id} (saved vectors and alphas, by id);
POST /sweeps, GET /sweeps, GET /sweeps/{id}, DELETE /sweeps/{id} (sweeps.py);
GET /models, POST /models/{name}/pull (the presets, pulled in the background: pulls.py).
No answer shows an absolute server path: tensors are ids, the model root is only said to be set.
Errors are `{"detail": "<one-line message>"}` with a 4xx status.
When HEADLENS_TOKEN is set, every route but /health needs `Authorization: Bearer <token>` or
`X-Headlens-Token: <token>`.

Request bodies are bounded (`BodyLimit`): over HEADLENS_MAX_BODY_KB (POST /tasks/upload: twice
HEADLENS_MAX_UPLOAD_MB plus 64 KB; POST /tensors: HEADLENS_MAX_TENSOR_MB plus 64 KB) is a 413, refused from Content-Length before the body is read, or
as soon as a chunked body passes the limit. No error answer echoes more than ~200 characters of any one
input (`errors.clip` where messages are built; MAX_DETAIL caps a whole message as a last guard).
"""
from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, MutableMapping

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from .admit import Admission, admit, cached, describe_validation
from ..store.tensor_store import TensorMissing, TensorStore, TensorWriteError, default_store
from .errors import BadRequest, InsufficientStorage, NotFound, ServiceError, TooLarge, clip
from . import jobs as lanes
from .jobs import JobRunner
from .limits import Limits
from .model_pool import ModelPool
from .pulls import Pulls
from ..text import describe_seconds
from .schemas import (ACTIVE_STATES, Capabilities, ErrorResponse, Health, JobEstimate, JobKindInfo, JobRequest,
                      JobStatus, TaskInfo, TensorInfo, UploadRequest, UploadResponse)
from .task_store import TaskStore, task_info

VERSION = "0.1.0"
OPEN_PATHS = ("/health",)
UPLOAD_PATH = "/tasks/upload"
TENSOR_PATH = "/tensors"
MAX_DETAIL = 1200  # characters of an error message, at most (a last guard; inputs are clipped to ~200)
log = logging.getLogger(__name__)

_UPLOAD_DOC = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": UploadRequest.model_json_schema()},
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "string", "format": "binary"},
        "kind": {"type": "string", "enum": ["classification", "generation"]}}}}}}}
_TENSOR_DOC = {"requestBody": {"required": True, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "string", "format": "binary"}}}}}}}
_ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (401, 403, 404, 413, 422, 429, 507)}


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


class BodyLimit:
    """ASGI middleware: a request body over its route's limit is a 413 before the app sees it.

    A declared Content-Length over the limit is refused without reading the body; otherwise the body is
    read (counting the bytes of a chunked body as they come, refusing once past the limit) and handed to
    the app whole. Memory per request is bounded by the limit.
    """

    def __init__(self, app: Any, limits: Limits):
        self.app, self.limits = app, limits

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = scope.get("path") == UPLOAD_PATH
        tensor = scope.get("path") == TENSOR_PATH and scope.get("method") == "POST"
        limit = self.limits.max_upload_body_bytes if upload else \
            self.limits.max_tensor_body_bytes if tensor else self.limits.max_body_bytes
        declared = next((v for k, v in scope.get("headers") or () if k == b"content-length"), None)
        if declared is not None:
            try:
                n = int(declared)
            except ValueError:
                await _error(scope, receive, send, BadRequest("the Content-Length header is not a number", 400))
                return
            if n > limit:
                await _error(scope, receive, send, self._too_large(n, limit, upload, tensor))
                return
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away
            if message["type"] != "http.request":
                continue
            body = message.get("body", b"")
            total += len(body)
            if total > limit:
                await _error(scope, receive, send, self._too_large(None, limit, upload, tensor))
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole, replayed = b"".join(chunks), False
        chunks.clear()

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # after the body: waits for the disconnect

        await self.app(scope, replay, send)

    def _too_large(self, n: int | None, limit: int, upload: bool, tensor: bool) -> ServiceError:
        if tensor:
            size = f"is {n / 2**20:.2f} MB," if n is not None else "runs"
            return TooLarge(f"the tensor upload {size} over this server's limit of "
                            f"{self.limits.max_tensor_bytes / 2**20:.2f} MB (HEADLENS_MAX_TENSOR_MB)")
        return self.limits.body_too_large(n, limit, upload)


async def _error(scope: Scope, receive: Any, send: Any, e: ServiceError) -> None:
    await JSONResponse({"detail": clip(e.message, MAX_DETAIL)}, status_code=e.status,
                       headers={"Connection": "close"})(scope, receive, send)


def _token_ok(request: Request, token: str) -> bool:
    auth = request.headers.get("authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-headlens-token", "")
    return bool(given) and hmac.compare_digest(given.encode(), token.encode())


def _preload(pool: ModelPool, names: tuple[str, ...]) -> None:
    """Load `names` into the pool (a failure is a line in the log: the first job then says what is wrong)."""
    for name in names:
        try:
            pool.get(name)
            log.info("preloaded model %s", name)
        except Exception as e:  # noqa: BLE001 - never fatal: the service runs without it
            log.warning("could not preload model %s: %s", name, str(e).splitlines()[0] if str(e) else type(e).__name__)


def create_app(runner: JobRunner | None = None, *, pool: ModelPool | None = None, tasks: TaskStore | None = None,
               limits: Limits | None = None, token: str | None = None, pulls: Pulls | None = None,
               pull_on_start: tuple[str, ...] = (), tensors: TensorStore | None = None,
               preload: tuple[str, ...] = ()) -> FastAPI:
    """The service app. Defaults: limits and token from the environment, a `LocalJobRunner` over `pool`.
    `pull_on_start`: presets to pull in the background once the service is up (`serve --pull`); `preload`: models
    to load in the background at start-up (`serve --preload`), so a shared link's cached results are found at once
    instead of after the first job loads the model (`POST /jobs/cached` answers for resident models only)."""
    limits = limits or Limits.from_env()
    pool = pool or ModelPool(max_models=limits.max_models)
    tasks = tasks or TaskStore(memory_items=limits.upload_cache, quota_bytes=limits.upload_quota_bytes)
    if runner is None:  # HEADLENS_RUNNER: `local` (one worker thread) or `ray` (see ray_runner.py)
        from .ray_runner import make_runner

        runner = make_runner(pool, tasks, limits)
    token = token if token is not None else os.environ.get("HEADLENS_TOKEN") or ""
    pulls = pulls or Pulls()
    given = tensors

    def store() -> TensorStore:
        """The kernel's and the admission's tensor store: the one given, else the cache folder's at this call (one
        per folder; looked up each time, as the result cache is, so both always name the same folder)."""
        s = given or default_store()
        s.quota_bytes = limits.tensor_quota_bytes
        return s

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if preload:
            threading.Thread(target=_preload, args=(pool, preload), name="headlens-preload", daemon=True).start()
        for name in pull_on_start:
            try:
                pulls.start(name)
            except ServiceError as e:  # HEADLENS_ALLOW_PULL=0, an unknown name: a line in the log, nothing more
                log.warning("not pulling %s: %s", name, e.message)
        yield
        pulls.close()
        app.state.sweeps.close()
        runner.close()

    app = FastAPI(title="headlens", version=VERSION, lifespan=lifespan, responses=_ERRORS,
                  description="Which attention heads of a language model do in-context learning.")
    app.state.runner, app.state.pool, app.state.tasks, app.state.limits = runner, pool, tasks, limits
    app.state.pulls, app.state.tensor_store = pulls, store

    # -- body size, auth and errors ------------------------------------------------------------------
    app.add_middleware(BodyLimit, limits=limits)  # added first: inside the token check, which runs before it

    @app.middleware("http")
    async def check_token(request: Request, call_next: Any) -> Any:
        if token and request.url.path not in OPEN_PATHS and not _token_ok(request, token):
            return JSONResponse({"detail": "this headlens service needs its token: send `Authorization: Bearer "
                                           "<token>` or `X-Headlens-Token: <token>` (clients read HEADLENS_TOKEN)"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    @app.exception_handler(ServiceError)
    async def service_error(_: Request, e: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": clip(e.message, MAX_DETAIL)}, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, e: RequestValidationError) -> JSONResponse:
        detail = "invalid request: " + (describe_validation(e) or "malformed body")
        return JSONResponse({"detail": clip(detail, MAX_DETAIL)}, status_code=422)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse({"detail": f"internal error ({type(e).__name__}): {clip(e)}"}, status_code=500)

    # -- service --------------------------------------------------------------------------------------
    @app.get("/health", response_model=Health)
    def health() -> Health:
        return Health(version=VERSION)

    @app.get("/cluster", tags=["sweeps"])
    def cluster() -> dict[str, Any]:
        """The cluster the jobs run on: `runner` (`local` or `ray`); for Ray its address, `lost` (the sentence, once
        its head stopped answering), its nodes (IP, id, alive, CPUs, GPUs, head) and the model actors (what runs
        where)."""
        describe = getattr(runner, "cluster", None)
        return describe() if callable(describe) else {"runner": "local", "address": None, "lost": None, "nodes": [],
                                                      "actors": [], "retried": 0}

    @app.get("/capabilities", response_model=Capabilities)
    def capabilities() -> Capabilities:
        device, dtype = pool.device_info()
        from ..analysis.kinds import KINDS

        kinds = [JobKindInfo(name=k.name, description=k.description, aliases=list(k.aliases), uses_task=k.uses_task,
                             uses_model=k.uses_model, params=k.schema(), result=k.result_schema())
                 for k in KINDS.values()]
        loaded = [{**m, "name": _under_root(pool, m.get("name"))} for m in pool.loaded()]
        return Capabilities(version=VERSION, device=device, dtype=dtype, loaded_models=loaded,
                            tasks=tasks.list(), limits=limits.to_json(), job_kinds=kinds,
                            model_root=pool.root is not None, allow_hub=pool.allow_hub,
                            auth_required=bool(token), presets=pulls.list(), allow_pull=pulls.allow)

    # -- tasks ------------------------------------------------------------------------------------------
    @app.get("/tasks", response_model=list[TaskInfo])
    def list_tasks() -> list[TaskInfo]:
        return tasks.list()

    @app.post("/tasks/upload", response_model=UploadResponse, openapi_extra=_UPLOAD_DOC)
    async def upload_task(request: Request) -> UploadResponse:
        # the body's size is bounded by BodyLimit (limits.max_upload_body_bytes); here the file's own size
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await request.form()
            f = form.get("file")
            if f is None or isinstance(f, str):
                raise BadRequest("a multipart upload needs a `file` field holding the task file")
            data = await f.read(limits.max_upload_bytes + 1)
            limits.check_upload(f.size or len(data))
            filename, kind = f.filename or "", form.get("kind") or None
            if kind is not None and not isinstance(kind, str):
                raise BadRequest("the `kind` field of a multipart upload must be text: classification or generation")
        else:
            try:
                body = UploadRequest.model_validate_json(await request.body())
            except ValidationError as e:
                raise BadRequest("invalid upload: " + clip(describe_validation(e, list(UploadRequest.model_fields)),
                                                           400)
                                 + " (send JSON {filename, content, kind?} or a multipart form with `file`)") from None
            data, filename, kind = body.content.encode("utf-8"), body.filename, body.kind
            limits.check_upload(len(data))
        task_id, task = await run_in_threadpool(tasks.add, filename, data, kind)
        return UploadResponse(id=task_id, summary=task_info(task, task_id, "upload"))

    # -- saved tensors ------------------------------------------------------------------------------------
    @app.post(TENSOR_PATH, response_model=TensorInfo, openapi_extra=_TENSOR_DOC)
    async def upload_tensor(request: Request) -> TensorInfo:
        """Add a saved vector or alpha file (.safetensors, as ltv_vector or site_alphas write it; raw bytes or a multipart
        `file`); checked whole (format, shapes, finite values, ranges); returns its id, which `load` takes."""
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await request.form()
            f = form.get("file")
            if f is None or isinstance(f, str):
                raise BadRequest("a multipart tensor upload needs a `file` field holding the .safetensors file")
            data = await f.read(limits.max_tensor_bytes + 1)
        else:
            data = await request.body()
        limits.check_tensor_upload(len(data))
        return TensorInfo(**await run_in_threadpool(_add_tensor, store(), data))

    @app.get(TENSOR_PATH + "/{tensor_id}", response_class=Response,
             responses={200: {"content": {"application/octet-stream": {}}}, 404: {"model": ErrorResponse}})
    def download_tensor(tensor_id: str) -> Response:
        """The file of a saved tensor (safetensors bytes)."""
        try:
            data = store().get(tensor_id)
        except TensorMissing as e:
            raise NotFound(str(e)) from None
        return Response(data, media_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{tensor_id}.safetensors"'})

    # -- jobs ---------------------------------------------------------------------------------------------
    def admission(req: JobRequest, **how: Any) -> Admission:
        """The one admission of a job request (admit.py), for every route that takes one."""
        return admit({"kind": req.kind, **(req.model_extra or {})}, pool, tasks, limits, tensors=store(), **how)

    @app.post("/jobs", response_model=JobStatus, status_code=202)
    def submit_job(req: JobRequest) -> JobStatus:
        """One call per result: the cached result (`done`, `cache_hit`), else, with `start` `if_short` and a job
        estimated over HOLD_OVER_S (or `never`), `held` with its estimate and no job, else the queued job."""
        a = admission(req, check_work=req.start != "never")
        found = cached(a, store())
        if found is not None:
            return runner.done(a, found.to_json())
        if req.start == "never" or req.start == "if_short" and (a.estimate.seconds or 0) > lanes.HOLD_OVER_S:
            return JobStatus(id=f"held-{a.key}", kind=a.kind, status="held", message="held: press Run",
                             params=a.params, created=time.time(), estimate=estimate_json(a))
        job = runner.submit(a)
        for tid in a.tensors:  # kept while the job is queued or running (the uploads' quota skips it)
            store().pin(tid, lambda jid=job.id: _active(runner, jid))
        return job.model_copy(update={"estimate": estimate_json(a)})

    def estimate_json(a: Admission) -> dict[str, Any]:
        e = {**a.estimate.to_json(), "text": describe_seconds(a.estimate.seconds, a.estimate.low, a.estimate.high),
             "limit": limits.max_work, "admitted": True}
        try:
            limits.check_work(a.estimate)
        except ServiceError as err:
            e.update(admitted=False, refusal=err.message, refusal_status=err.status)
        return e

    @app.post("/jobs/estimate", response_model=JobEstimate)
    def estimate_job(req: JobRequest) -> JobEstimate:
        """A view of POST /jobs's admission: the job's work and time before it runs; never queues, computes or loads
        a model (a job over the work limit is answered `admitted: false`, with POST /jobs's refusal)."""
        return JobEstimate(kind=(a := admission(req, check_work=False)).kind, **estimate_json(a))

    @app.post("/jobs/cached", response_model=JobStatus, responses={404: {"model": ErrorResponse}})
    def cached_job(req: JobRequest) -> JobStatus:
        """A view of POST /jobs's admission: the job's result when it is cached, else 404; never computes."""
        a = admission(req, storage=False)
        found = cached(a, store())
        if found is None:
            raise NotFound(f"no cached {a.kind} result for this request; submit it with POST /jobs")
        return runner.done(a, found.to_json())

    @app.get("/jobs", response_model=list[JobStatus])
    def list_jobs() -> list[JobStatus]:
        return runner.list()

    @app.get("/jobs/{job_id}", response_model=JobStatus)
    def get_job(job_id: str) -> JobStatus:
        return _found(runner.get(job_id), job_id)

    @app.delete("/jobs/{job_id}", response_model=JobStatus)
    def cancel_job(job_id: str) -> JobStatus:
        return _found(runner.cancel(job_id), job_id)

    from .sweeps import add_routes as add_sweep_routes

    sweeps = add_sweep_routes(app, runner, pool, tasks, limits)  # POST /sweeps, GET /sweeps, GET/DELETE /sweeps/{id}

    def in_use() -> set[str]:  # uploads queued jobs and running sweeps still need: pinned in the task store
        active = {j.params.get("task") for j in runner.list() if j.status in ("queued", "running")}
        return {t for t in active if isinstance(t, str)} | sweeps.tasks_in_use()

    tasks.in_use = in_use
    from .pulls import add_routes as add_pull_routes

    add_pull_routes(app, pulls)  # GET /models, POST /models/{name}/pull
    return app


def _under_root(pool: ModelPool, name: Any) -> Any:
    """A model folder under the model root as the name relative to it (which the service takes too), so no answer
    shows where the root is."""
    if pool.root is not None and isinstance(name, str) and os.path.isabs(name):
        try:
            return os.path.relpath(name, pool.root) if Path(name).resolve().is_relative_to(pool.root) else name
        except (OSError, ValueError):
            return name
    return name


def _active(runner: JobRunner, job_id: str) -> bool:
    job = runner.get(job_id, include_result=False)
    return job is not None and job.status in ACTIVE_STATES


def _add_tensor(store: TensorStore, data: bytes) -> dict[str, Any]:
    """Check an uploaded tensor file and keep it (counted against the uploads' quota); its summary."""
    from ..analysis.primitives.saved import inspect

    try:
        tid, info = inspect(data, "the upload")
    except ValueError as e:
        raise BadRequest(str(e)) from None
    try:
        store.put(tid, data, upload=True)
    except TensorWriteError as e:
        raise InsufficientStorage(f"the upload could not be kept: {e.reason}") from None
    return info


def _found(job: JobStatus | None, job_id: str) -> JobStatus:
    if job is None:
        raise NotFound(f"no job {clip(job_id, 100)!r} on this service (jobs live in memory and are forgotten on "
                       f"restart)")
    return job
