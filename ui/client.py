"""Client of the headlens service: what the Streamlit pages (through `ui.api`) and notebooks call. Never
imports torch.

    from ui.client import HeadlensClient
    c = HeadlensClient()                       # HEADLENS_BACKEND_URL, HEADLENS_TOKEN
    r = c.run("head_scores", model="default", task="sentiment", shots=8, prompts=50,
              on_progress=lambda f, m: print(f, m))

`HEADLENS_BACKEND_URL` defaults to http://127.0.0.1:8765. The special value `inprocess` runs the
service app inside this process (one shared app per process, through Starlette's TestClient), so tests
and notebooks need no server; that path imports the service (and, once a job runs, torch).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

import httpx

DEFAULT_URL = "http://127.0.0.1:8765"
INPROCESS = "inprocess"
OnProgress = Callable[[float, str], None]

_inprocess_app: Any = None
_inprocess_lock = threading.Lock()


class ClientError(RuntimeError):
    """A request the service refused, a failed job, or an unreachable service; the message is the server's."""

    def __init__(self, message: str, status: int | None = None, job: dict[str, Any] | None = None):
        super().__init__(message)
        self.message, self.status, self.job = message, status, job


class JobFailed(ClientError):
    """The job ended with status `error`."""


class JobCancelled(ClientError):
    """The job was cancelled."""


class JobTimeout(ClientError):
    """`wait` gave up before the job finished (the job keeps running)."""


def inprocess_app() -> Any:
    """The process-wide in-process service app (created on first use)."""
    global _inprocess_app
    with _inprocess_lock:
        if _inprocess_app is None:
            from backend.service.app import create_app  # the in-process path only: tests and notebooks

            _inprocess_app = create_app()
        return _inprocess_app


def reset_inprocess_app() -> None:
    """Drop the in-process app (tests); its worker is stopped."""
    global _inprocess_app
    with _inprocess_lock:
        if _inprocess_app is not None:
            _inprocess_app.state.runner.close()
        _inprocess_app = None


class HeadlensClient:
    """Typed access to the service's routes. Every failure raises `ClientError` with a readable message."""

    def __init__(self, base_url: str | None = None, token: str | None = None, timeout: float = 30.0):
        self.base_url = (base_url or os.environ.get("HEADLENS_BACKEND_URL") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.environ.get("HEADLENS_TOKEN") or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if self.base_url == INPROCESS:
            from starlette import testclient

            # Starlette's TestClient is built on whichever of httpx / httpx2 it found (httpx2 once
            # huggingface_hub pulls it in): its timeout and errors are that module's, not ours.
            self._http: Any = testclient.TestClient(inprocess_app(), base_url="http://inprocess",
                                                    raise_server_exceptions=False, headers=headers)
            self._http.timeout = timeout
            self._transport_errors = (httpx.TransportError, testclient.httpx.TransportError)
        else:
            self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
            self._transport_errors = (httpx.TransportError,)

    # -- plumbing -------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, raw: bool = False, **kw: Any) -> Any:
        try:
            r = self._http.request(method, path, **kw)
        except self._transport_errors as e:
            raise ClientError(f"cannot reach the headlens service at {self.base_url} ({type(e).__name__}: {e}); "
                              f"start it with `python -m backend serve` or set HEADLENS_BACKEND_URL") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text or r.reason_phrase
            raise ClientError(str(detail), status=r.status_code)
        return r.content if raw else r.json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "HeadlensClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- service -------------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        """{"status": "ok", "version"}."""
        return self._request("GET", "/health")

    def capabilities(self) -> dict[str, Any]:
        """{version, device, dtype, loaded_models, tasks, limits, job_kinds, model_root (whether one is set),
        allow_hub, auth_required, presets, allow_pull}."""
        return self._request("GET", "/capabilities")

    def tasks(self) -> list[dict[str, Any]]:
        """[{id, source, name, kind, n_examples, labels, models, description}, ...]."""
        return self._request("GET", "/tasks")

    def upload_task(self, filename: str, content: bytes | str, kind: str | None = None) -> dict[str, Any]:
        """Validate and store a task file; {"id": "upload:<hash>", "summary": {...}}. Malformed -> ClientError (422)."""
        data = content.encode("utf-8") if isinstance(content, str) else content
        form = {"kind": kind} if kind else None
        return self._request("POST", "/tasks/upload", files={"file": (filename, data)}, data=form)

    # -- saved tensors (learned task vectors, SITE alphas) -----------------------------------------------------------
    def upload_tensor(self, data: bytes) -> dict[str, Any]:
        """Add a saved vector or alpha file (.safetensors bytes, as ltv_vector and site_alphas write them; checked whole):
        {id, kind, model, task, d_model, n_layers, n_heads, shapes, bytes}; the id is what `load` takes. Malformed ->
        ClientError (422); too large -> 413."""
        return self._request("POST", "/tensors", content=data, headers={"content-type": "application/octet-stream"})

    def tensor(self, tensor_id: str) -> bytes:
        """The file (safetensors bytes) of a saved tensor: a result's `tensor`. Unknown -> ClientError (404)."""
        from urllib.parse import quote

        return self._request("GET", f"/tensors/{quote(tensor_id, safe='')}", raw=True)

    # -- presets (named real models) ----------------------------------------------------------------------------
    def models(self) -> list[dict[str, Any]]:
        """[{name, title, family, shape, licence, download_bytes, disk_bytes, pulled, converted, pull: {status,
        progress, message, error}}, ...]: every preset, pulled or not."""
        return self._request("GET", "/models")

    def pull_model(self, name: str) -> dict[str, Any]:
        """Start pulling a preset on the service (or join the pull running); its entry of `models()`."""
        return self._request("POST", f"/models/{name}/pull")

    # -- jobs -------------------------------------------------------------------------------------------------
    def ask(self, kind: str, start: str = "always", **params: Any) -> dict[str, Any]:
        """POST /jobs: the job's status: `done` with the cached result, `held` with its estimate (`start`
        `if_short` or `never`), or the queued job (identical requests share one id and one computation)."""
        return self._request("POST", "/jobs", json={"kind": kind, "start": start, **params})

    def submit(self, kind: str, **params: Any) -> str:
        """Queue a job (or find it cached: a finished job); its id, for `wait`."""
        return self.ask(kind, **params)["id"]

    def job(self, job_id: str) -> dict[str, Any]:
        """{id, kind, status, progress, message, result, error, error_type, params, created, started, finished,
        cache_hit}."""
        return self._request("GET", f"/jobs/{job_id}")

    def jobs(self) -> list[dict[str, Any]]:
        """Known jobs, newest first, without results."""
        return self._request("GET", "/jobs")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"/jobs/{job_id}")

    def estimate(self, kind: str, **params: Any) -> dict[str, Any]:
        """The job's estimated work and time (POST /jobs/estimate): `passes`, `seconds`, `text`, `admitted`, ...;
        never queues or computes."""
        return self._request("POST", "/jobs/estimate", json={"kind": kind, **params})

    def cached(self, kind: str, **params: Any) -> dict[str, Any] | None:
        """The job's result when the service has it cached, else None; never starts a computation."""
        j = self.ask(kind, start="never", **params)
        return j["result"] if j["status"] == "done" else None

    def wait(self, job_id: str, on_progress: OnProgress | None = None, timeout: float | None = 3600.0,
             poll: float = 0.2) -> dict[str, Any]:
        """Poll until the job ends; its result. Raises JobFailed, JobCancelled or JobTimeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last: tuple[float, str] | None = None
        delay = min(poll, 0.05)
        while True:
            j = self.job(job_id)
            if on_progress is not None and (j["progress"], j["message"]) != last:
                last = (j["progress"], j["message"])
                on_progress(*last)
            if j["status"] == "done":
                return j["result"]
            if j["status"] == "error":
                raise JobFailed(j.get("error") or "the job failed", job=j)
            if j["status"] == "cancelled":
                raise JobCancelled(f"job {job_id} was cancelled", job=j)
            if deadline is not None and time.monotonic() > deadline:
                raise JobTimeout(f"job {job_id} still {j['status']} after {timeout:g} s", job=j)
            time.sleep(delay)
            delay = min(delay * 1.5, poll)

    # -- sweeps -----------------------------------------------------------------------------------------------
    def submit_sweep(self, models: list[str], tasks: list[str], kinds: list[str] | None = None,
                     seeds: list[int] | None = None, params: dict[str, Any] | None = None,
                     name: str | None = None) -> dict[str, Any]:
        """Start a sweep (models x tasks x kinds x seeds as jobs); its record {id, status, counts, models, ...}."""
        body = {"models": models, "tasks": tasks, "kinds": kinds or ["head_scores"], "seeds": seeds or [0],
                "params": params or {}, **({"name": name} if name else {})}
        return self._request("POST", "/sweeps", json=body)

    def cluster(self) -> dict[str, Any]:
        """The cluster the service's jobs run on (GET /cluster): runner, address, lost, nodes, actors."""
        return self._request("GET", "/cluster")

    def sweeps(self) -> list[dict[str, Any]]:
        """Running and finished sweeps, newest first (no jobs)."""
        return self._request("GET", "/sweeps")

    def sweep(self, sweep_id: str) -> dict[str, Any]:
        """A sweep with its jobs and `summary` ({rows: models x tasks, models: per-model TR/TL summary})."""
        return self._request("GET", f"/sweeps/{sweep_id}")

    def cancel_sweep(self, sweep_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"/sweeps/{sweep_id}")

    def run(self, kind: str, on_progress: OnProgress | None = None, timeout: float | None = 3600.0,
            **params: Any) -> dict[str, Any]:
        """submit + wait: the job's result."""
        return self.wait(self.submit(kind, **params), on_progress=on_progress, timeout=timeout)
