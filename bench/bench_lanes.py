"""Interactive jobs behind sweeps (issue 18, section 6): how long a 1-second POST /jobs takes behind N sweeps.

    .venv/bin/python bench/bench_lanes.py [--sweeps 0,1,3,10] [--ray] [--json bench/lanes.json]
    .venv/bin/python bench/bench_lanes.py --smoke      # one sweep of 8 jobs, the local runner (the CI test)

Each sweep is 48 jobs of a test kind (`tick`: no model, progress every 20 ms), either cheap (0.25 s each, as in the
issue's probe) or long (5 s each). Once the sweeps keep the runner busy, one interactive job of 1 s is submitted
through the app (POST /jobs, retried on 429) and timed from the POST to `done`; the 429s are counted. Goal: done
within 3 s behind any number of sweeps, on the local runner and on Ray (a local instance with 2 CPUs, 2 actors,
warm). The row `one lane` is the same runner with every sweep job put in the interactive lane: the queue as it
was before the lanes, for comparison in the same run. Times are wall-clock on whatever else the machine runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pydantic import BaseModel, ConfigDict  # noqa: E402

from backend.analysis.kinds import Kind, register  # noqa: E402
from backend.analysis.results import Result  # noqa: E402


class TickParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = 0
    group: int = 0
    steps: int = 10
    delay: float = 0.02


class TickResult(Result):
    group: int


def tick(ctx: Any, p: TickParams) -> dict[str, Any]:
    for i in range(p.steps):
        ctx.progress(i / p.steps, f"tick {i}")
        time.sleep(p.delay)
    return {"group": p.group}


TICK = Kind("tick", TickParams, TickResult, "bench_lanes:tick", "sleeps", api="tick", uses_task=False,
            uses_model=False, cached=False)
STEP_S = 0.02


def one_lane(runner: Any) -> Any:
    """The runner with every job in the interactive lane: one queue, as before the lanes."""
    submit = runner.submit
    runner.submit = lambda kind, params, key, lane="interactive": submit(kind, params, key, "interactive")
    return runner


def measure(make_runner: Any, n_sweeps: int, jobs: int, job_s: float, interactive_s: float = 1.0,
            group: int = 0) -> dict[str, Any]:
    from starlette.testclient import TestClient

    from backend.service.app import create_app

    runner = make_runner()
    with TestClient(create_app(runner=runner)) as c:
        sids = [c.post("/sweeps", json={"models": ["default"], "tasks": ["syn-sentiment"], "kinds": ["tick"],
                                        "seeds": list(range(jobs)),
                                        "params": {"group": group + 1 + s, "steps": max(1, round(job_s / STEP_S)),
                                                   "delay": STEP_S}}).json()["id"] for s in range(n_sweeps)]
        deadline = time.monotonic() + 60
        while n_sweeps and time.monotonic() < deadline and not any(
                j["status"] == "running" and j["kind"] == "tick" for j in c.get("/jobs").json()):
            time.sleep(0.02)
        time.sleep(0.5)  # the feeders have filled the queue
        t0, busy = time.perf_counter(), 0
        body = {"kind": "tick", "group": group, "steps": round(interactive_s / STEP_S), "delay": STEP_S}
        while (r := c.post("/jobs", json=body)).status_code == 429:
            busy += 1
            time.sleep(0.5)
        jid = r.json()["id"]
        while (j := c.get(f"/jobs/{jid}").json())["status"] in ("queued", "running"):
            time.sleep(0.01)
        seconds = time.perf_counter() - t0
        mine = range(group + 1, group + 1 + n_sweeps)
        preempted = sum(x["preempted"] for x in c.get("/jobs").json() if x["params"].get("group") in mine)
        for sid in sids:
            c.delete(f"/sweeps/{sid}")
    return {"sweeps": n_sweeps, "jobs_per_sweep": jobs, "sweep_job_s": job_s, "seconds": round(seconds, 2),
            "busy_429": busy, "status": j["status"], "preempted": preempted}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweeps", default="0,1,3,10")
    ap.add_argument("--ray", action="store_true", help="also on a local Ray instance (2 CPUs, 2 actors)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    register(TICK, replace=True)
    os.environ.setdefault("HEADLENS_CACHE_DIR", tempfile.mkdtemp(prefix="bench-lanes-"))
    from backend.service.execute import make_executor
    from backend.service.jobs import LocalJobRunner
    from backend.service.limits import Limits
    from backend.service.model_pool import ModelPool
    from backend.service.task_store import TaskStore

    local = lambda: LocalJobRunner(make_executor(ModelPool(), TaskStore()), limits=Limits())  # noqa: E731
    rows: list[dict[str, Any]] = []
    if a.smoke:
        r = measure(local, 1, 8, 0.25, interactive_s=0.2)
        assert r["status"] == "done" and r["busy_429"] == 0, r
        print(f"smoke: behind 1 sweep of 8 jobs, a 0.2 s job took {r['seconds']} s")
        return
    counts = [int(x) for x in a.sweeps.split(",")]
    runners = [("local", local)]
    shared: list[Any] = []
    if a.ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("ray: skipped (not installed)")
        else:
            from backend.service.ray_cluster import RayConfig
            from backend.service.ray_runner import RayJobRunner

            cfg = RayConfig(max_actors=2, num_cpus=2, poll_s=0.05, pythonpath=(str(Path(__file__).parent),))

            def ray_runner() -> Any:  # one runner for every row (its actors stay warm); the app's close leaves it
                if not shared:
                    r = RayJobRunner(ModelPool(), TaskStore(), limits=Limits(), config=cfg)
                    shared.extend([r, r.close])
                    r.close = lambda *_, **__: None  # type: ignore[method-assign]
                    measure(lambda: r, 0, 0, 0.0, interactive_s=0.2, group=900)  # warm: start an actor
                return shared[0]
            runners.append(("ray", ray_runner))
    g = 1000
    measure(local, 0, 0, 0.0, interactive_s=0.2, group=800)  # warm: the app's and the kinds' imports
    for name, make in runners:
        for job_s in (0.25, 5.0):
            for n in counts:
                g += 100
                r = {"runner": name, "lanes": "two", **measure(make, n, 48, job_s, group=g)}
                rows.append(r)
                print(json.dumps(r), flush=True)
        for n in ([1, 3] if name == "local" else []):  # the queue as it was: every job in one lane
            g += 100
            r = {"runner": name, "lanes": "one lane (before)", **measure(lambda: one_lane(local()), n, 48, 0.25,
                                                                       group=g)}
            rows.append(r)
            print(json.dumps(r), flush=True)
    print("\n| runner | lanes | sweeps x jobs | sweep job | 1 s job done after | 429s | sweep jobs that gave way |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['runner']} | {r['lanes']} | {r['sweeps']} x {r['jobs_per_sweep']} | {r['sweep_job_s']:g} s | "
              f"{r['seconds']:.2f} s | {r['busy_429']} | {r['preempted']} |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if shared:
        shared[1]()  # the Ray runner's own close



if __name__ == "__main__":
    main()
