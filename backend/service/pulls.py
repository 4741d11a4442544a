"""Presets through the service: listed (pulled or not) and pulled in the background with progress.

Routes: `GET /models` (every preset: name, title, licence, sizes, `pulled`, `converted` and `pull`, the state of
its pull in this service: idle / running / done / error, with progress and message), `POST /models/{name}/pull`
(202; starts the pull, or returns the one running; a pulled preset answers at once). `HEADLENS_ALLOW_PULL=0`
refuses pulls (403), for a server whose disk or network must not be used that way.

A pull runs as a child process, `python -m backend models pull NAME --progress json`, at low CPU priority (nice
10), so its download and conversion (a minute or two, 1.4-2.9 GB of memory at its peak) never stall the job
worker, and its memory goes back to the system when it ends. `serve --pull NAMES` (and so `launch`) starts pulls
when the service starts; a pull that fails (offline) is one line in the log and an error state with the reason,
nothing else. A pull's error is one sentence without a server path (the CLI words a models folder that cannot be
written without it; `_for_clients` replaces any path left with words).
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ..weights import presets
from ..errors import UserError
from ..store.paths import REPO_ROOT, models_dir
from .errors import Forbidden, NotFound, clip

log = logging.getLogger(__name__)
Report = Callable[[float, str], None]
Runner = Callable[[str, Report], None]  # runs the pull of a preset, reporting progress; raises on failure


@dataclass
class PullState:
    status: str = "idle"  # idle | running | done | error
    progress: float = 0.0
    message: str = ""
    error: str | None = None
    started: float | None = None
    finished: float | None = None
    seconds: float | None = field(default=None)


class PullFailed(UserError, RuntimeError):
    """A pull that did not finish: the pull command's last message."""


_children: set[subprocess.Popen] = set()
_children_lock = threading.Lock()


def child_runner(name: str, report: Report) -> None:
    """Pull in a child process at nice 10; its JSON lines are the progress, its last `error:` line the failure."""
    cmd = [sys.executable, "-m", "backend", "models", "pull", name, "--progress", "json"]
    proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: os.nice(10)) if hasattr(os, "nice") else None)
    with _children_lock:
        _children.add(proc)
    errors: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("error: "):
                errors.append(line[7:].strip())

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                msg = json.loads(line)
                report(float(msg["progress"]), str(msg.get("message", "")))
            except (ValueError, KeyError, TypeError):
                continue
        proc.wait()
        t.join(5)
    finally:
        with _children_lock:
            _children.discard(proc)
    if proc.returncode != 0:
        raise PullFailed(errors[-1] if errors else f"the pull exited with status {proc.returncode}")


def stop_children() -> None:
    """Interrupt the pulls still running (the service is stopping): each deletes its temporary folder."""
    with _children_lock:
        procs = list(_children)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(2)  # SIGINT: KeyboardInterrupt in the child, which cleans up
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


class Pulls:
    """The service's pulls: one at a time per preset, each on a thread of its own (see the module docstring)."""

    def __init__(self, runner: Runner | None = None, allow: bool | None = None):
        self._runner = runner or child_runner
        raw = (os.environ.get("HEADLENS_ALLOW_PULL") or "1").strip().lower()
        self.allow = allow if allow is not None else raw not in ("0", "false", "no", "off")
        self._states: dict[str, PullState] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def state(self, name: str) -> PullState:
        with self._lock:
            return PullState(**asdict(self._states.get(name, PullState())))

    def describe(self, name: str) -> dict[str, Any]:
        return {**presets.describe(name), "pull": asdict(self.state(name))}

    def list(self) -> list[dict[str, Any]]:
        return [self.describe(n) for n in presets.PRESETS]

    def start(self, name: str) -> dict[str, Any]:
        if name not in presets.PRESETS:
            raise NotFound(f"no preset {clip(name, 80)!r}; presets: {', '.join(presets.PRESETS)}")
        if not self.allow:
            raise Forbidden(f"pulling models is disabled on this server (HEADLENS_ALLOW_PULL=0); ask its operator to "
                            f"run `{presets.pull_command(name)}` there")
        ready = presets.describe(name)["converted"]
        with self._lock:
            current = self._states.get(name)
            if not ready and not (current and current.status == "running"):
                self._states[name] = PullState(status="running", message="starting", started=time.time())
                t = threading.Thread(target=self._run, args=(name,), name=f"headlens-pull-{name}", daemon=True)
                self._threads[name] = t
                t.start()
        return self.describe(name)

    def _run(self, name: str) -> None:
        def report(frac: float, message: str) -> None:
            with self._lock:
                s = self._states[name]
                s.progress, s.message = max(s.progress, min(max(frac, 0.0), 1.0)), message

        try:
            self._runner(name, report)
            ok, error = True, None
        except Exception as e:  # offline, disk full, a corrupt download: an error state, never a dead service
            ok, error = False, clip(_for_clients(name, e), 400)
            log.warning("pulling %s failed: %s", name, error)
        with self._lock:
            s = self._states[name]
            s.status, s.error, s.finished = ("done" if ok else "error"), error, time.time()
            s.progress = 1.0 if ok else s.progress
            s.message = f"{name} is ready" if ok else "failed"
            s.seconds = round(s.finished - (s.started or s.finished), 1)

    def close(self) -> None:
        if self._runner is child_runner:
            stop_children()

    def wait(self, name: str, timeout: float | None = None) -> PullState:
        """Block until the preset's pull (if any) ends (tests, `serve --pull` at shutdown)."""
        t = self._threads.get(name)
        if t is not None:
            t.join(timeout)
        return self.state(name)


def _for_clients(name: str, e: Exception) -> str:
    """A failed pull in words every client may see: an OSError of an in-process runner as the CLI words it, and the
    models folder's and the repository's paths replaced by words."""
    from ..weights.pull import folder_problem

    text = str(folder_problem(name, e) if isinstance(e, OSError) else e) or type(e).__name__
    for path, words in ((models_dir(), "the models folder"), (REPO_ROOT, "the server's folder")):
        try:
            forms = {str(path), str(path.resolve())}
        except (OSError, RuntimeError):
            forms = {str(path)}
        for form in sorted(forms, key=len, reverse=True):
            if len(form) > 1:
                text = text.replace(form, words)
    return text


def add_routes(app: Any, pulls: Pulls) -> None:
    from .schemas import PresetInfo

    @app.get("/models", response_model=list[PresetInfo])
    def list_models() -> list[dict[str, Any]]:
        """Every preset, pulled or not, with its pull's state on this service."""
        return pulls.list()

    @app.post("/models/{name}/pull", response_model=PresetInfo, status_code=202)
    def pull_model(name: str) -> dict[str, Any]:
        """Start pulling a preset in the background (or return the pull running); poll GET /models."""
        return pulls.start(name)
