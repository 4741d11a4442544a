"""`python -m backend launch`: both servers come up on the given ports, the dashboard is pointed at the
service, Ctrl-C stops both, and a port in use is a one-line error. Needs no browser and no model (the
service loads models lazily)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from hang import HANG_S, wait_until

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str] | None:
    """(status, body), or None when nothing answers there (refused: a stopped server answers at once)."""
    try:
        with urllib.request.urlopen(url, timeout=HANG_S) as r:
            return r.status, r.read().decode()
    except OSError:
        return None


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, HEADLENS_CACHE_DIR=str(tmp_path / "cache"), PYTHONUNBUFFERED="1",
               HEADLENS_LOG=str(tmp_path / "logs" / "servers.log"),
               HEADLENS_LAUNCH_TIMEOUT=str(HANG_S))  # the launcher waits for its servers as long as it takes
    for var in ("HEADLENS_BACKEND_URL", "HEADLENS_TOKEN"):
        env.pop(var, None)
    return env


def test_launch_starts_both_and_ctrl_c_stops_both(tmp_path):
    port, backend_port = _free_port(), _free_port()
    out = tmp_path / "launch.log"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "backend", "launch", "--no-browser", "--port", str(port),
                                 "--backend-port", str(backend_port), "--model", "some/model"],
                                cwd=REPO, env=_env(tmp_path), stdout=f, stderr=subprocess.STDOUT)
    try:
        def running() -> bool:
            assert proc.poll() is None, out.read_text(errors="replace")
            return "headlens is running" in out.read_text(errors="replace")

        wait_until(running, "the launcher saying `headlens is running`", poll_s=0.3)
        log = out.read_text(errors="replace")
        assert f"http://127.0.0.1:{port}" in log and f"service http://127.0.0.1:{backend_port}" in log
        servers = tmp_path / "logs" / "servers.log"  # both servers' output goes to the log the launcher names
        assert f"log: {servers}" in log
        wait_until(lambda: "Streamlit" in servers.read_text(errors="replace"), "Streamlit's output in the log",
                   poll_s=0.3)
        text = servers.read_text(errors="replace")
        assert "==== headlens launch" in text and f"service http://127.0.0.1:{backend_port}" in text
        assert "Streamlit" in text, text[-2000:]  # the dashboard's own output, which went to /dev/null before
        health = _get(f"http://127.0.0.1:{backend_port}/health")
        assert health and health[0] == 200 and json.loads(health[1])["status"] == "ok"
        assert _get(f"http://127.0.0.1:{port}/_stcore/health") is not None
        _served_compressed(port)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"launch did not stop within {HANG_S:g} s of SIGINT (the hang guard)")
    assert rc == 0, out.read_text(errors="replace")
    assert "stopped." in out.read_text(errors="replace")
    assert _get(f"http://127.0.0.1:{backend_port}/health") is None
    assert _get(f"http://127.0.0.1:{port}/_stcore/health") is None


def _served_compressed(port: int) -> None:
    """The dashboard launched serves its chart bundle gzip-compressed, byte for byte the file (ui/assets.py,
    installed by ui.warm); its pages carry the script that imports that chunk once loaded, and no preload link
    unless asked (HEADLENS_UI_ASSETS=preload)."""
    import gzip

    from ui import assets

    chunk = next((assets.static_dir() / "static" / "js").glob("PlotlyChart.*.js"))
    req = urllib.request.Request(f"http://127.0.0.1:{port}/static/js/{chunk.name}",
                                 headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=HANG_S) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(r.read()) == chunk.read_bytes()
    page = _get(f"http://127.0.0.1:{port}/Head_map")
    assert page and f'href="./static/js/{chunk.name}"' not in page[1]
    assert f'"./static/js/{chunk.name}"' in page[1] and "import(u)" in page[1]


def test_a_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "backend", "launch", "--no-browser", "--port", str(taken),
                            "--backend-port", str(_free_port())], cwd=REPO, env=_env(tmp_path),
                           capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 2
    assert f"port {taken}" in r.stderr and "--port" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "backend", "launch", "--no-browser", "--port", "8600",
                        "--backend-port", "8600"], cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                       timeout=HANG_S)
    assert r.returncode == 2 and "different ports" in r.stderr
