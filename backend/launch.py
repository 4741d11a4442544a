"""`python -m backend launch`: the service and the dashboard together, one command.

Starts `python -m backend serve` on 127.0.0.1:<backend-port> and `streamlit run app.py` on <host>:<port>
with HEADLENS_BACKEND_URL pointing the dashboard at that service, waits until both answer their health
checks, prints the URL (and opens a browser unless --no-browser). Ctrl-C (or SIGTERM) stops both: the
dashboard first, then the service; a child that dies on its own takes the other down with it.

Both servers write their output, tracebacks included, to one log file (`paths.log_file()`: HEADLENS_LOG, else
`logs/headlens.log`), appended, each run headed by a line; the launcher prints where it is, and shows its last
lines when a server stops. The children get HEADLENS_LOG, so the dashboard's error details can name it.

The service always binds loopback; `--host 0.0.0.0` exposes only the dashboard, which talks to the service
locally. To use a service on another machine, run `streamlit run app.py` with HEADLENS_BACKEND_URL set.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import webbrowser
from pathlib import Path
from typing import IO, Sequence

from .store.paths import log_file

ROOT = Path(__file__).resolve().parents[1]
SERVICE_HOST = "127.0.0.1"
START_TIMEOUT_S = float(os.environ.get("HEADLENS_LAUNCH_TIMEOUT", "120"))
STOP_TIMEOUT_S = 10.0


class LaunchError(SystemExit):
    """Launch cannot go on; the message is printed as `error: ...` and the exit status is 2."""

    def __init__(self, message: str):
        print(f"error: {message}", file=sys.stderr, flush=True)
        super().__init__(2)


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _connect_host(host: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tail(path: Path, n: int = 20) -> str:
    """The last `n` lines of the log, indented, for a message."""
    try:
        lines = path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return ""
    return "".join(f"\n    {x}" for x in lines)


def _wait_healthy(name: str, url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LaunchError(f"the {name} exited with status {proc.returncode} before it was up; its messages are "
                              f"in {log}, which ends:{_tail(log)}")
        if _healthy(url):
            return
        time.sleep(0.25)
    raise LaunchError(f"the {name} did not answer {url} within {timeout:g} s "
                      f"(raise HEADLENS_LAUNCH_TIMEOUT if the machine is slow)")


def _start(cmd: Sequence[str], env: dict[str, str], out: IO[bytes]) -> subprocess.Popen:
    # A session of its own: the terminal's Ctrl-C reaches only us, and we stop the children in order.
    return subprocess.Popen(list(cmd), cwd=str(ROOT), env=env, start_new_session=True, stdout=out,
                            stderr=subprocess.STDOUT)


def open_log(path: Path, what: str) -> IO[bytes]:
    """The log file, appended to, headed by a line naming this run (LaunchError when it cannot be written)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "ab", buffering=0)
    except OSError as e:
        raise LaunchError(f"cannot write the log file {path} ({e.strerror or e}); set HEADLENS_LOG to a file you "
                          f"can write") from None
    f.write(f"\n==== headlens launch {time.strftime('%Y-%m-%d %H:%M:%S')}: {what} ====\n".encode())
    return f


def _stop(proc: subprocess.Popen | None) -> None:
    """SIGINT, then SIGTERM, then SIGKILL, to the child's process group, waiting a while after each."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, STOP_TIMEOUT_S), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def service_threads(env: dict[str, str]) -> dict[str, str]:
    """The service's environment with torch's CPU threads set: HEADLENS_TORCH_THREADS (default 1) unless
    OMP_NUM_THREADS is set already. On a CPU shared with other work, torch's intra-op threads wait for each
    other and a small model's jobs run 5-30x slower (bench/RESULTS.md: `bench_ui.py`); one thread each is the
    fast choice there, and a GPU does not care."""
    if "OMP_NUM_THREADS" in env:
        return env
    n = env.get("HEADLENS_TORCH_THREADS", "1")
    return {**env, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n}


AUTO_PULL = "smollm2-135m"


def auto_pull(env: dict[str, str]) -> str:
    """The presets the service pulls in the background at start-up: HEADLENS_AUTO_PULL (comma-separated; default
    smollm2-135m, so that a newcomer can pick a real model in the dashboard without another command; `0` or
    `none` skips it). A preset already pulled costs nothing; offline, the pull fails in the background, harmlessly."""
    raw = env.get("HEADLENS_AUTO_PULL", AUTO_PULL).strip()
    return "" if raw.lower() in ("", "0", "none", "no", "off", "false") else raw


def commands(a: argparse.Namespace, env: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """The service and dashboard command lines."""
    pull = auto_pull(dict(os.environ) if env is None else env)
    service = [sys.executable, "-m", "backend", "serve", "--host", SERVICE_HOST, "--port", str(a.backend_port),
               "--log-level", "warning", *(["--pull", pull] if pull else []), "--preload", a.model]
    # ui.warm: Streamlit with the pages' modules imported and plotly warmed first (a fresh process's first page)
    dashboard = [sys.executable, "-m", "ui.warm", "run", str(ROOT / "app.py"),
                 "--server.address", a.host, "--server.port", str(a.port), "--server.headless", "true",
                 "--browser.gatherUsageStats", "false"]
    return service, dashboard


def launch(a: argparse.Namespace) -> None:
    """Run the service and the dashboard until Ctrl-C; see the module docstring."""
    if a.port == a.backend_port:
        raise LaunchError(f"--port and --backend-port are both {a.port}; give them different ports")
    if not _port_free(SERVICE_HOST, a.backend_port):
        raise LaunchError(f"port {a.backend_port} on {SERVICE_HOST} is in use (another headlens service?); "
                          f"pick another with --backend-port")
    if not _port_free(a.host, a.port):
        raise LaunchError(f"port {a.port} on {a.host} is in use; pick another with --port")

    service_url = _url(SERVICE_HOST, a.backend_port)
    log = log_file().resolve()
    out = open_log(log, f"service {service_url}, dashboard port {a.port}, model {a.model}")
    env = dict(os.environ, HEADLENS_BACKEND_URL=service_url, HEADLENS_DEFAULT_MODEL=a.model,
               PYTHONUNBUFFERED="1", HEADLENS_LOG=str(log))
    service_cmd, dashboard_cmd = commands(a, env)
    service_env = service_threads(env)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Our own handlers, installed before the children start: a SIGINT that the shell set to "ignore" (a
    # background job) would otherwise be ignored here and, inherited through exec, in the children too.
    previous = {sig: signal.signal(sig, on_term) for sig in (signal.SIGINT, signal.SIGTERM)}
    service = dashboard = None
    try:
        print(f"starting the headlens service on {service_url} (log: {log}) ...", file=sys.stderr, flush=True)
        service = _start(service_cmd, service_env, out)
        _wait_healthy("service", f"{service_url}/health", service, START_TIMEOUT_S, log)
        print("starting the dashboard ...", file=sys.stderr, flush=True)
        dashboard = _start(dashboard_cmd, env, out)
        local = _url(_connect_host(a.host), a.port)
        _wait_healthy("dashboard", f"{local}/_stcore/health", dashboard, START_TIMEOUT_S, log)
        url = local if a.host in ("127.0.0.1", "localhost", "::1") else _url(socket.gethostname(), a.port)
        print(f"\n  headlens is running: {url}\n  (service {service_url}, model {a.model}; Ctrl-C stops both)\n"
              f"  log: {log}\n", flush=True)
        if not a.no_browser:
            try:
                webbrowser.open(local)
            except Exception:  # no browser on this machine: the URL is printed above
                pass
        while True:
            for name, proc in (("service", service), ("dashboard", dashboard)):
                if proc.poll() is not None:
                    raise LaunchError(f"the {name} stopped (exit status {proc.returncode}); shutting down. The log "
                                      f"{log} ends:{_tail(log)}")
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping headlens ...", file=sys.stderr, flush=True)
    finally:
        _stop(dashboard)
        _stop(service)
        out.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("stopped.", file=sys.stderr, flush=True)
