"""Every script in bench/ runs in its `--smoke` mode (seconds, on the embedded model or a tiny random one), so an
import or API change that breaks a benchmark breaks CI (`pytest -k bench_smoke` runs them all).

A script whose optional dependency is missing (Chromium for bench_ui, Ray for bench_ray, hypothesis for
fuzz_service) prints `smoke: skipped (why)` and exits 0: the test skips with that line. Anything else that does not
exit 0 fails, with the script's output. The scripts run as subprocesses, a few at a time (HEADLENS_SMOKE_JOBS,
default 3: most of their time is imports and servers starting), each with its own cache folder; one fixture starts
the selected ones together, the slowest first.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
SLOWEST = ("bench_ui.py", "bench_ray.py", "bench_faults.py", "bench_site.py")
TIMEOUT_S = 300
SKIPPED = "smoke: skipped"


def _run(script: str, cache: Path) -> tuple[subprocess.CompletedProcess | None, float, str]:
    env = dict(os.environ, HEADLENS_CACHE_DIR=str(cache), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    for var in ("HEADLENS_BACKEND_URL", "HEADLENS_TOKEN", "HEADLENS_RUNNER", "RAY_ADDRESS"):
        env.pop(var, None)
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, time.perf_counter() - t0, out[-3000:]
    return r, time.perf_counter() - t0, ""


@pytest.fixture(scope="module")
def smoke_runs(request, tmp_path_factory) -> dict[str, Future]:
    """The selected scripts' smoke runs, started together (the slowest first), a few at a time."""
    wanted = {item.callspec.params["script"] for item in request.session.items
              if getattr(item, "originalname", "") == "test_bench_smoke" and hasattr(item, "callspec")}
    order = sorted(wanted or SCRIPTS, key=lambda s: (SLOWEST.index(s) if s in SLOWEST else len(SLOWEST), s))
    root = tmp_path_factory.mktemp("bench-smoke")
    pool = ThreadPoolExecutor(max(1, int(os.environ.get("HEADLENS_SMOKE_JOBS", "3"))))
    futures = {s: pool.submit(_run, s, root / s.removesuffix(".py")) for s in order}
    yield futures
    pool.shutdown(wait=True)


def test_every_bench_script_has_a_smoke_mode():
    assert len(SCRIPTS) >= 11, SCRIPTS
    lacking = [s for s in SCRIPTS if "--smoke" not in (ROOT / "bench" / s).read_text()]
    assert not lacking, f"bench scripts without --smoke: {lacking}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_smoke(script: str, smoke_runs: dict[str, Future]) -> None:
    r, seconds, partial = smoke_runs[script].result()
    if r is None:
        pytest.fail(f"bench/{script} --smoke ran past {TIMEOUT_S} s; its output so far:\n{partial}")
    out = f"--- stdout ---\n{r.stdout[-3000:]}\n--- stderr ---\n{r.stderr[-3000:]}"
    assert r.returncode == 0, f"bench/{script} --smoke exited {r.returncode} after {seconds:.0f} s\n{out}"
    skipped = [ln for ln in r.stdout.splitlines() if ln.startswith(SKIPPED)]
    if skipped:
        pytest.skip(f"bench/{script}: {skipped[0]}")
