"""The FastAPI app: `create_app()` wires the routes to a job runner, the model pool and the task store.

Routes: GET /health, GET /capabilities, GET /tasks, POST /tasks/upload, POST /jobs, GET /jobs,
GET /jobs/{id}, DELETE /jobs/{id}; POST /sweeps, GET /sweeps, GET /sweeps/{id}, DELETE /sweeps/{id} (sweeps.py);
GET /models, POST /models/{name}/pull (the presets, pulled in the background: pulls.py).
Errors are `{"detail": "<one-line message>"}` with a 4xx status.
When HEADLENS_TOKEN is set, every route but /health needs `Authorization: Bearer <token>` or
`X-Headlens-Token: <token>`.

Request bodies are bounded (`BodyLimit`): over HEADLENS_MAX_BODY_KB (POST /tasks/upload: twice
HEADLENS_MAX_UPLOAD_MB plus 64 KB) is a 413, refused from Content-Length before the body is read, or
as soon as a chunked body passes the limit. No error answer echoes more than ~200 characters of any one
input (`errors.clip` where messages are built; MAX_DETAIL caps a whole message as a last guard).
"""
from __future__ import annotations

import hmac
import logging
import os
import threading
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, MutableMapping

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from .admit import admit, describe_validation
from .errors import BadRequest, NotFound, ServiceError, clip
from .jobs import JobRunner
from .limits import Limits
from .model_pool import ModelPool
from .pulls import Pulls
from .schemas import (Capabilities, ErrorResponse, Health, JobKindInfo, JobRequest, JobStatus, TaskInfo,
                      UploadRequest, UploadResponse)
from .task_store import TaskStore, task_info

VERSION = "0.1.0"
OPEN_PATHS = ("/health",)
UPLOAD_PATH = "/tasks/upload"
MAX_DETAIL = 1200  # characters of an error message, at most (a last guard; inputs are clipped to ~200)
log = logging.getLogger(__name__)

_UPLOAD_DOC = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": UploadRequest.model_json_schema()},
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "string", "format": "binary"},
        "kind": {"type": "string", "enum": ["classification", "generation"]}}}}}}}
_ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorResponse} for s in (401, 403, 404, 413, 422, 429)}


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
        limit = self.limits.max_upload_body_bytes if upload else self.limits.max_body_bytes
        declared = next((v for k, v in scope.get("headers") or () if k == b"content-length"), None)
        if declared is not None:
            try:
                n = int(declared)
            except ValueError:
                await _error(scope, receive, send, BadRequest("the Content-Length header is not a number", 400))
                return
            if n > limit:
                await _error(scope, receive, send, self.limits.body_too_large(n, limit, upload))
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
                await _error(scope, receive, send, self.limits.body_too_large(None, limit, upload))
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
               pull_on_start: tuple[str, ...] = (), preload: tuple[str, ...] = ()) -> FastAPI:
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
    app.state.pulls = pulls

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

    @app.get("/capabilities", response_model=Capabilities)
    def capabilities() -> Capabilities:
        device, dtype = pool.device_info()
        from ..analysis.kinds import KINDS

        kinds = [JobKindInfo(name=k.name, description=k.description, uses_task=k.uses_task, params=k.schema(),
                             result=k.result_schema()) for k in KINDS.values()]
        return Capabilities(version=VERSION, device=device, dtype=dtype, loaded_models=pool.loaded(),
                            tasks=tasks.list(), limits=limits.to_json(), job_kinds=kinds,
                            model_root=str(pool.root) if pool.root else None, allow_hub=pool.allow_hub,
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

    # -- jobs ---------------------------------------------------------------------------------------------
    @app.post("/jobs", response_model=JobStatus, status_code=202)
    def submit_job(req: JobRequest) -> JobStatus:
        a = admit({"kind": req.kind, **(req.model_extra or {})}, pool, tasks, limits)
        return runner.submit(a.kind, a.params, a.key)

    @app.post("/jobs/cached", response_model=JobStatus, responses={404: {"model": ErrorResponse}})
    def cached_job(req: JobRequest) -> JobStatus:
        """A job's result when it is already cached (a finished job, `cache_hit` true), else 404; never
        computes, never waits in the job queue and never loads a model (a model that is not resident answers
        404: its fingerprint is unknown). A shared link shows what is cached at once, and waits for Run only
        for the rest."""
        import time

        from ..analysis.kernel import lookup
        from ..analysis.kinds import get_kind

        a = admit({"kind": req.kind, **(req.model_extra or {})}, pool, tasks, limits)
        fields = dict(a.params)
        model, task_id = fields.pop("model", None), fields.pop("task", None)
        spec = get_kind(a.kind)
        lm = pool.peek(model) if spec.uses_model else None
        if spec.uses_model and lm is None:
            raise NotFound(f"model {clip(model)!r} is not loaded yet, so its results cannot be looked up; submit "
                           f"the job with POST /jobs")
        found = lookup(a.kind, lm, tasks.get(task_id) if spec.uses_task else None, fields)
        if found is None:
            raise NotFound(f"no cached {a.kind} result for this request; submit it with POST /jobs")
        now = time.time()
        return JobStatus(id=f"cached-{a.key}", kind=a.kind, status="done", progress=1.0, message="cached",
                         result=found.to_json(), params=a.params, created=now, started=now, finished=now,
                         cache_hit=True)

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

    add_sweep_routes(app, runner, pool, tasks, limits)  # POST /sweeps, GET /sweeps, GET/DELETE /sweeps/{id}
    from .pulls import add_routes as add_pull_routes

    add_pull_routes(app, pulls)  # GET /models, POST /models/{name}/pull
    return app


def _found(job: JobStatus | None, job_id: str) -> JobStatus:
    if job is None:
        raise NotFound(f"no job {clip(job_id, 100)!r} on this service (jobs live in memory and are forgotten on "
                       f"restart)")
    return job
