"""Running a bench script's `--smoke` mode as a test (tests/integration/test_bench_smoke.py; bench_ray.py's in tests/integration/test_ray.py):
a subprocess with its own cache folder, bounded only by the hang guard."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang import HANG_S

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = "smoke: skipped"


def smoke_env(cache: Path, **extra: str) -> dict[str, str]:
    """The environment a smoke runs in: its own cache folder, one thread, offline, no service or runner settings."""
    env = dict(os.environ, HEADLENS_CACHE_DIR=str(cache), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    for var in ("HEADLENS_BACKEND_URL", "HEADLENS_TOKEN", "HEADLENS_RUNNER", "RAY_ADDRESS"):
        env.pop(var, None)
    return {**env, **extra}


def run_smoke(script: str, cache: Path, **env: str) -> tuple[subprocess.CompletedProcess | None, float, str]:
    """(the finished run or None after the hang guard, seconds, the output so far when it hung)."""
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke"], cwd=ROOT,
                           env=smoke_env(cache, **env), capture_output=True, text=True, timeout=HANG_S)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, time.perf_counter() - t0, out[-3000:]
    return r, time.perf_counter() - t0, ""


def check_smoke(script: str, r: subprocess.CompletedProcess | None, seconds: float, partial: str) -> None:
    """Fail with the script's output unless it exited 0; skip with its line when it said `smoke: skipped`."""
    if r is None:
        pytest.fail(f"bench/{script} --smoke hung (still running after the hang guard, {HANG_S:g} s, "
                    f"HEADLENS_TEST_HANG_S); its output so far:\n{partial}")
    out = f"--- stdout ---\n{r.stdout[-3000:]}\n--- stderr ---\n{r.stderr[-3000:]}"
    assert r.returncode == 0, f"bench/{script} --smoke exited {r.returncode} after {seconds:.0f} s\n{out}"
    skipped = [ln for ln in r.stdout.splitlines() if ln.startswith(SKIPPED)]
    if skipped:
        pytest.skip(f"bench/{script}: {skipped[0]}")
