"""Every script in bench/ runs in its `--smoke` mode (seconds, on the embedded model or a tiny random one), so an
import or API change that breaks a benchmark breaks CI (`pytest -k bench_smoke` runs them all).

A script whose optional dependency is missing (Chromium for bench_ui, Ray for bench_ray, hypothesis for
fuzz_service) prints `smoke: skipped (why)` and exits 0: the test skips with that line. Anything else that does not
exit 0 fails, with the script's output. The scripts run as subprocesses, a few at a time (HEADLENS_SMOKE_JOBS,
default 3: most of their time is imports and servers starting), each with its own cache folder; one fixture starts
the selected ones together, the slowest first. No time limit but the hang guard (tests/hang.py): on a busy machine a
smoke takes as long as it takes.

bench_ray.py's smoke runs in tests/integration/test_ray.py instead (`test_bench_smoke_bench_ray`), on the Ray cluster that the
Ray tests share, so Ray starts once for all of them.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from bench_runs import check_smoke, run_smoke

ROOT = Path(__file__).resolve().parents[2]
ALL_SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py"))
ON_SHARED_RAY = ("bench_ray.py",)  # run by tests/integration/test_ray.py, on the shared cluster
SCRIPTS = [s for s in ALL_SCRIPTS if s not in ON_SHARED_RAY]
SLOWEST = ("bench_ui.py", "bench_faults.py", "bench_site.py")


@pytest.fixture(scope="module")
def smoke_runs(request, tmp_path_factory) -> dict[str, Future]:
    """The selected scripts' smoke runs, started together (the slowest first), a few at a time."""
    wanted = {item.callspec.params["script"] for item in request.session.items
              if getattr(item, "originalname", "") == "test_bench_smoke" and hasattr(item, "callspec")}
    order = sorted(wanted or SCRIPTS, key=lambda s: (SLOWEST.index(s) if s in SLOWEST else len(SLOWEST), s))
    root = tmp_path_factory.mktemp("bench-smoke")
    pool = ThreadPoolExecutor(max(1, int(os.environ.get("HEADLENS_SMOKE_JOBS", "3"))))
    futures = {s: pool.submit(run_smoke, s, root / s.removesuffix(".py")) for s in order}
    yield futures
    pool.shutdown(wait=True)


def test_every_bench_script_has_a_smoke_mode():
    assert len(ALL_SCRIPTS) >= 11, ALL_SCRIPTS
    lacking = [s for s in ALL_SCRIPTS if "--smoke" not in (ROOT / "bench" / s).read_text()]
    assert not lacking, f"bench scripts without --smoke: {lacking}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_smoke(script: str, smoke_runs: dict[str, Future]) -> None:
    check_smoke(script, *smoke_runs[script].result())
