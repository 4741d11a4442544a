"""The pages' one door to the backend: every call to `ui.client` goes through here.

Pages never import torch or the analyses; they call these functions and get plain dicts back. Every
failure (service unreachable, a refused request, a failed or cancelled job, a malformed answer) is an
`ApiError` whose message is fit to show a user as is. A kind is named as the registry names it everywhere (pages,
service, CLI, Python); an older name (an alias of the registry's) is resolved here to that name (`kind_name`, from the
service's capabilities).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .client import ClientError, HeadlensClient, JobCancelled, JobFailed, JobTimeout
from .settings import kind_name

OnProgress = Callable[[float, str], None]

JOB_TIMEOUT_S = 3600.0


@dataclass
class ApiError(Exception):
    """A failure in words. `kind`: unreachable | refused | job | cancelled | timeout | unauthorized | internal."""

    message: str
    kind: str = "refused"
    status: int | None = None

    def __str__(self) -> str:
        return self.message

    @property
    def hint(self) -> str:
        if self.kind == "unreachable":
            return ("Start the service with `python -m backend serve` (or everything at once with "
                    "`python -m backend launch`), or point HEADLENS_BACKEND_URL at a running one.")
        if self.kind == "unauthorized":
            return "This service wants a token: set HEADLENS_TOKEN to the service's token before starting the app."
        return ""


_clients: dict[tuple[str, str | None], HeadlensClient] = {}
_clients_lock = threading.Lock()


def backend_url() -> str:
    from .client import DEFAULT_URL

    return (os.environ.get("HEADLENS_BACKEND_URL") or DEFAULT_URL).rstrip("/")


def client() -> HeadlensClient:
    """One client per (URL, token) per process; Streamlit sessions share it (httpx clients are thread-safe)."""
    key = (backend_url(), os.environ.get("HEADLENS_TOKEN") or None)
    with _clients_lock:
        c = _clients.get(key)
        if c is None:
            try:
                c = HeadlensClient(base_url=key[0], token=key[1])
            except Exception as e:  # e.g. the in-process service failing to start
                raise ApiError(f"could not start a client for {key[0]}: {type(e).__name__}: {e}",
                               kind="internal") from None
            _clients[key] = c
        return c


_generation = [0]


def generation() -> int:
    """Bumped by `reset_clients`: what callers cache per service (e.g. its capabilities) is stale after it."""
    return _generation[0]


def reset_clients() -> None:
    """Forget the cached clients (tests that switch HEADLENS_BACKEND_URL or restart the in-process app)."""
    _generation[0] += 1
    with _clients_lock:
        for c in _clients.values():
            try:
                c.close()
            except Exception:
                pass
        _clients.clear()


UI_WORDS = (  # the service's words for API users -> what a dashboard user does instead
    ("upload it with POST /tasks/upload and use the `upload:<hash>` id it returns",
     "upload it on the Home page (*Bring your own task*); it then appears in the sidebar's task list"),
    ("submit it with POST /jobs", "press Run"),
    ("submit the job with POST /jobs", "press Run"),
)


def for_users(message: str) -> str:
    """A service message in the dashboard's words (no routes to POST to)."""
    for api_words, ui_words in UI_WORDS:
        message = message.replace(api_words, ui_words)
    return message


def _translate(e: Exception) -> ApiError:
    if isinstance(e, ApiError):
        return e
    if isinstance(e, ClientError):
        e.message = for_users(e.message)
    if isinstance(e, JobCancelled):
        return ApiError("The job was cancelled.", kind="cancelled")
    if isinstance(e, JobTimeout):
        return ApiError(f"The job did not finish in time: {e.message}", kind="timeout")
    if isinstance(e, JobFailed):
        return ApiError(e.message, kind="job")
    if isinstance(e, ClientError):
        if e.status is None:
            return ApiError(e.message, kind="unreachable")
        if e.status in (401, 403):
            return ApiError(e.message, kind="unauthorized", status=e.status)
        if e.status >= 500:
            return ApiError(f"The service failed on this request ({e.status}): {e.message}", kind="internal",
                            status=e.status)
        return ApiError(e.message, kind="refused", status=e.status)
    return ApiError(f"Unexpected error talking to the service: {type(e).__name__}: {e}", kind="internal")


TRACE = os.environ.get("HEADLENS_UI_TRACE")
"""When set (a file path), every service call appends `<unix time> <name> <milliseconds>` to it (bench/bench_ui.py)."""


def trace(name: str, ms: float = 0.0) -> None:
    """One line of the HEADLENS_UI_TRACE file (nothing when it is unset)."""
    if TRACE:
        with open(TRACE, "a") as f:
            f.write(f"{time.time():.3f} {name} {ms:.1f}\n")


def _call(fn: Callable[[], Any], name: str = "") -> Any:
    t0 = time.perf_counter()
    try:
        return fn()
    except Exception as e:
        raise _translate(e) from None
    finally:
        trace(name or "call", 1000 * (time.perf_counter() - t0))


# -- service ------------------------------------------------------------------------------------------
def capabilities() -> dict[str, Any]:
    """{version, device, dtype, loaded_models, tasks, limits, job_kinds, model_root, allow_hub, auth_required,
    presets, allow_pull}."""
    return _call(lambda: client().capabilities(), "capabilities")


def upload_task(filename: str, content: bytes, kind: str | None = None) -> dict[str, Any]:
    """Validate and store a task file on the service: {"id": "upload:<hash>", "summary": {...}}."""
    return _call(lambda: client().upload_task(filename, content, kind=kind), "upload")


# -- jobs -------------------------------------------------------------------------------------------------
def models() -> list[dict[str, Any]]:
    """The presets (named real models), pulled or not, with the state of the service's pull of each."""
    return _call(lambda: client().models(), "models")


def pull_model(name: str) -> dict[str, Any]:
    """Start pulling a preset on the service; its entry of `models()`."""
    return _call(lambda: client().pull_model(name), "pull_model")


def run(kind: str, params: dict[str, Any], on_progress: OnProgress | None = None) -> dict[str, Any]:
    """Submit a job of kind `kind` (its name or an alias) and wait for its result."""
    service_kind = kind_name(kind)

    def go() -> dict[str, Any]:
        res = client().run(service_kind, on_progress=on_progress, timeout=JOB_TIMEOUT_S, **params)
        if not isinstance(res, dict):
            raise ApiError(f"the service answered a {service_kind} job with {type(res).__name__}, not an object",
                           kind="internal")
        return res

    return _call(go, "run")


def ask(kind: str, params: dict[str, Any], start: str = "always") -> dict[str, Any]:
    """POST /jobs, the one call per result: its status, `done` with the cached result, `held` with its estimate
    (`start` `if_short`: a long job waits for Run; `never`: nothing starts), or the queued job."""
    return _call(lambda: client().ask(kind_name(kind), start, **params), "ask")


def submit(kind: str, params: dict[str, Any]) -> str:
    """Queue a job of kind `kind`; its id."""
    return _call(lambda: client().submit(kind_name(kind), **params), "submit")


def job(job_id: str) -> dict[str, Any]:
    """{id, kind, status, progress, message, result, error, ...} of a submitted job."""
    return _call(lambda: client().job(job_id), "job")


def cancel(job_id: str) -> dict[str, Any]:
    """Withdraw this session from a job (`DELETE /jobs/{id}`): cancelled when no one else waits for it."""
    return _call(lambda: client().cancel(job_id), "cancel")


def estimate(kind: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The job's estimated work and time before it runs (`seconds`, `text`: "about 3 min", `admitted`, `refusal`);
    None when the service cannot say (an older service, or a request it refuses for another reason: the job's own
    submission then says why)."""
    try:
        return _call(lambda: client().estimate(kind_name(kind), **params), "estimate")
    except ApiError as e:
        if e.kind in ("unreachable", "unauthorized", "internal"):
            raise
        return None


def not_admitted(e: ApiError) -> bool:
    """Whether a refused POST /jobs/estimate means the job itself would be refused (a model that cannot load, a
    bad field: the estimate runs the same admission as POST /jobs), not an older service without the route."""
    return e.kind == "refused" and e.status is not None and 400 <= e.status < 500 and e.status not in (404, 405) \
        or e.kind == "refused" and e.status == 404 and e.message.strip().lower() not in ("not found", "")


def checked(kind: str, params: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(POST /jobs with start `never`: the cached result's status or `held` with its estimate, or None; the reason
    the service refuses the job, or None): a job the service refuses (its model cannot load) gets no Run button."""
    try:
        return ask(kind, params, "never"), None
    except ApiError as e:
        if e.kind in ("unreachable", "unauthorized", "internal"):
            raise
        return None, (e.message if not_admitted(e) else None)


def cached(kind: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """The result when the service has it cached (None otherwise); never starts a computation."""
    j = ask(kind, params, "never")
    return j["result"] if j["status"] == "done" else None


# -- sweeps (the Sweeps page) -----------------------------------------------------------------------------
def submit_sweep(models: list[str], tasks: list[str], kinds: list[str], seeds: list[int],
                 params: dict[str, Any] | None = None, name: str | None = None) -> dict[str, Any]:
    """Start a sweep on the service; its record (`id`, `status`, `counts`, per-model progress)."""
    return _call(lambda: client().submit_sweep(models, tasks, kinds, seeds, params, name))


def cluster() -> dict[str, Any]:
    """{runner, address, lost, nodes: [{node_ip, node_id, alive, cpus, gpus, head}], actors, retried}."""
    return _call(lambda: client().cluster())


def sweeps() -> list[dict[str, Any]]:
    """The service's sweeps, newest first (no jobs)."""
    return _call(lambda: client().sweeps())


def sweep(sweep_id: str) -> dict[str, Any]:
    """One sweep with its jobs and summary."""
    return _call(lambda: client().sweep(sweep_id))


def cancel_sweep(sweep_id: str) -> dict[str, Any]:
    return _call(lambda: client().cancel_sweep(sweep_id))
