"""Issue 18, part B: work limits that hold for every kind, sweeps that never starve interactive jobs, the smaller
sweep and upload cases, and two Ray faults. One row per case of the issue (`CASES`); the cost model of every kind
against measured passes is `test_cost_model.py`, the interactive-behind-sweeps latency `bench/bench_lanes.py`.

Jobs here are a test kind, `tick` (no model, no task: `steps` progress steps of `delay` s), so the lanes are tested
on what they decide (which job runs when, what gives way), not on timings.
"""
from __future__ import annotations

from plain_job import submit

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from pydantic import Field
from starlette.testclient import TestClient

from backend.analysis.kernel import Context
from backend.analysis.kinds import Kind, register, unregister
from backend.analysis.params import NonNegative, Params
from backend.analysis.results import Result
from hang import HANG_S, wait_until

REPO = Path(__file__).resolve().parents[2]
LIMITS_ENV = ("HEADLENS_MAX_WORK", "HEADLENS_JOB_TIMEOUT_S", "HEADLENS_MAX_SWEEP_JOBS", "HEADLENS_MAX_QUEUE",
              "HEADLENS_SWEEP_WINDOW", "HEADLENS_TOKEN", "HEADLENS_RUNNER", "HEADLENS_UPLOAD_QUOTA_MB")


class TickParams(Params):
    seed: NonNegative = 0
    group: NonNegative = 0
    steps: int = Field(5, ge=1)
    delay: float = 0.01


class TickResult(Result):
    seed: int
    group: int
    pid: int


def run_tick(ctx: Context, p: TickParams) -> dict[str, Any]:
    for i in range(p.steps):
        ctx.progress(i / p.steps, f"tick {i}")
        time.sleep(p.delay)
    return {"seed": p.seed, "group": p.group, "pid": os.getpid()}


TICK = Kind("tick", TickParams, TickResult, "test_work_limits:run_tick", "test kind", api="tick",
            uses_task=False, uses_model=False, cached=False)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for var in LIMITS_ENV:
        monkeypatch.delenv(var, raising=False)
    register(TICK, replace=True)
    yield
    unregister("tick")


def client() -> TestClient:
    from backend.service.app import create_app

    return TestClient(create_app())


def wait_job(c: TestClient, jid: str, timeout: float = HANG_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = c.get(f"/jobs/{jid}").json()
        if j["status"] not in ("queued", "running"):
            return j
        time.sleep(0.02)
    raise AssertionError(f"job {jid} did not finish: {j}")


def wait_sweep(c: TestClient, sid: str, timeout: float = HANG_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = c.get(f"/sweeps/{sid}").json()
        if s["status"] != "running":
            return s
        time.sleep(0.05)
    raise AssertionError(f"sweep {sid} did not finish: {s['counts']}")


def refused(r: Any, *words: str) -> None:
    assert r.status_code == 422, r.text
    for w in words:
        assert w in r.json()["detail"], r.json()["detail"]


# -- 5. work limits that hold for every kind ----------------------------------------------------------------------
def site_budget_counts(mp: Any, _: Path) -> None:
    """`site` with m 10 and budget [5000]: the budget's M = 5000 run is counted, so it is refused like m 5000."""
    mp.setenv("HEADLENS_MAX_WORK", "2000")
    with client() as c:
        refused(c.post("/jobs", json={"kind": "site", "task": "syn-antonym", "m": 10, "budget": [5000]}),
                "HEADLENS_MAX_WORK", "budget M=5000")
        refused(c.post("/jobs", json={"kind": "site", "task": "syn-antonym", "m": 5000}), "HEADLENS_MAX_WORK")
        e = c.post("/jobs/estimate", json={"kind": "site", "task": "syn-antonym", "m": 10, "budget": []}).json()
        assert e["admitted"] and e["passes"] < 2000, e


def methods_counts_its_sub_calls(mp: Any, _: Path) -> None:
    """`methods` counts the `site` and `steer` it calls, not only its 50 prompts."""
    mp.setenv("HEADLENS_MAX_WORK", "2000")
    with client() as c:
        refused(c.post("/jobs", json={"kind": "methods", "task": "syn-antonym", "site_m": 10000,
                                      "site_steps": 100000}), "HEADLENS_MAX_WORK", "SITE")


def ltv_all_layers_same_fresh_or_loaded(mp: Any, _: Path) -> None:
    """`ltv` with layer all: the same estimate, and the same refusal, on a fresh service and once the model is
    resident (the shape comes from the model's files, never from the loaded model)."""
    mp.setenv("HEADLENS_MAX_WORK", "300")  # ltv without linear propagation (its default) is ~400 passes here
    body = {"kind": "ltv", "task": "syn-antonym", "layer": "all"}
    with client() as c:
        fresh = c.post("/jobs/estimate", json=body).json()
        r1 = c.post("/jobs", json=body)
        assert wait_job(c, c.post("/jobs", json={"kind": "model_info"}).json()["id"])["status"] == "done"
        loaded = c.post("/jobs/estimate", json=body).json()
        r2 = c.post("/jobs", json=body)
    assert fresh["passes"] == loaded["passes"] > 300 and fresh["shape"]["n_layers"] == 4, (fresh, loaded)
    refused(r1, "HEADLENS_MAX_WORK")
    refused(r2, "HEADLENS_MAX_WORK")
    assert r1.json() == r2.json()


def cli_honours_the_job_time_limit(mp: Any, _: Path) -> None:
    """The CLI stops a run past HEADLENS_JOB_TIMEOUT_S with one line and exit 2, and refuses work over
    HEADLENS_MAX_WORK before it loads the model."""
    import contextlib
    import io

    from backend.cli import main

    out = subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = ['tests', 'tests/integration']; import test_work_limits "
                          "as t; from backend.analysis.kinds import register; register(t.TICK, replace=True); "
                          "from backend.cli import main; sys.exit(main(['tick', '--steps', '400', '--delay', '0.01', "
                          "'--no-cache']))"], cwd=REPO, capture_output=True, text=True, timeout=HANG_S,
                         env={**os.environ, "HEADLENS_JOB_TIMEOUT_S": "1"})
    assert out.returncode == 2 and "HEADLENS_JOB_TIMEOUT_S" in out.stderr and "Traceback" not in out.stderr, out
    mp.setenv("HEADLENS_MAX_WORK", "10")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # a model that does not exist: refused for its work, before any load
        code = main(["scores", "--task", "syn-sentiment", "--model", "/nonexistent/never-loaded"])
    assert code == 2 and "HEADLENS_MAX_WORK" in err.getvalue(), err.getvalue()


# -- 6. sweeps never starve interactive jobs -------------------------------------------------------------------------
def interactive_goes_ahead_of_three_sweeps(mp: Any, _: Path) -> None:
    """Behind three sweeps of 48 cheap jobs, an interactive job is never a 429 and starts before every sweep job
    queued at that time (at most the sweep jobs already running finish first, or give way)."""
    mp.setenv("HEADLENS_MAX_QUEUE", "64")
    with client() as c:
        sids = [c.post("/sweeps", json={"models": ["default"], "tasks": ["syn-sentiment"], "kinds": ["tick"],
                                        "seeds": list(range(48)), "params": {"group": g, "delay": 0.02}}).json()["id"]
                for g in (1, 2, 3)]
        time.sleep(0.5)  # the feeders have filled the sweep lane
        r = c.post("/jobs", json={"kind": "tick", "group": 99, "steps": 10, "delay": 0.02})
        assert r.status_code == 202, r.text
        j = wait_job(c, r.json()["id"])
        assert j["status"] == "done" and j["lane"] in ("live", "interactive")  # a plan of no work: live
        t = r.json()["created"]
        jumped = [jj for jj in c.get("/jobs").json() if jj["lane"] == "sweep" and jj["created"] < t
                  and jj["started"] and t < jj["started"] < j["started"]]
        assert not jumped, jumped  # no sweep job queued before it started in front of it
        for sid in sids:
            assert wait_sweep(c, sid)["status"] == "done"


def a_long_sweep_job_gives_way(mp: Any, _: Path) -> None:
    """Behind a sweep of long jobs, an interactive job waits for no sweep job: the running one gives way (starts
    again after it) and still finishes."""
    with client() as c:
        sid = c.post("/sweeps", json={"models": ["default"], "tasks": ["syn-sentiment"], "kinds": ["tick"],
                                      "seeds": list(range(3)), "params": {"steps": 100, "delay": 0.02}}).json()["id"]
        wait_until(lambda: any(jj["status"] == "running" for jj in c.get("/jobs").json()), "a sweep job running",
                   poll_s=0.02)
        j = wait_job(c, c.post("/jobs", json={"kind": "tick", "group": 7, "steps": 3}).json()["id"])
        assert j["status"] == "done"
        s = wait_sweep(c, sid)
        jobs = {jj["id"]: jj for jj in c.get("/jobs").json()}
        assert s["status"] == "done" and s["counts"]["done"] == 3
        gave_way = [jobs[x["job_id"]] for x in s["jobs"] if jobs[x["job_id"]]["preempted"]]
        assert len(gave_way) == 1 and gave_way[0]["started"] > j["finished"] - 1e-6, gave_way


def oversized_grid_refused_before_planning(mp: Any, _: Path) -> None:
    """A grid over HEADLENS_MAX_SWEEP_JOBS is refused from its size: no cell is admitted first."""
    import backend.service.sweeps as sweeps

    mp.setenv("HEADLENS_MAX_SWEEP_JOBS", "100")
    calls = []
    real = sweeps.admit
    mp.setattr(sweeps, "admit", lambda *a, **k: calls.append(1) or real(*a, **k))
    with client() as c:
        r = c.post("/sweeps", json={"models": ["default"], "tasks": ["syn-sentiment", "syn-antonym"],
                                    "kinds": ["scores", "icl"], "seeds": list(range(64))})
    refused(r, "256 jobs", "HEADLENS_MAX_SWEEP_JOBS")
    assert calls == []


# -- 7. smaller ones ----------------------------------------------------------------------------------------------
def seed_true_refused(mp: Any, _: Path) -> None:
    with client() as c:
        refused(c.post("/sweeps", json={"models": ["default"], "tasks": ["syn-sentiment"], "seeds": [True]}),
                "seeds.0")


def random_seed_negative_refused(mp: Any, _: Path) -> None:
    with client() as c:
        refused(c.post("/jobs", json={"kind": "ablation_curves", "task": "syn-sentiment", "random_seeds": [-1]}),
                "random_seeds.0", "greater than or equal to 0")
        refused(c.post("/jobs", json={"kind": "ablation_curves", "task": "syn-sentiment", "random_seeds": [True]}),
                "random_seeds.0")


def rerun_from_finished_jobs_counts_cached(mp: Any, _: Path) -> None:
    """The same sweep again is served from the finished jobs: every job counts as cached."""
    spec = {"models": ["default"], "tasks": ["syn-sentiment"], "kinds": ["tick"], "seeds": [0, 1, 2],
            "params": {"group": 5}}
    with client() as c:
        first = wait_sweep(c, c.post("/sweeps", json=spec).json()["id"])
        again = wait_sweep(c, c.post("/sweeps", json=spec).json()["id"])
    assert first["counts"]["cached"] == 0 and again["counts"]["cached"] == again["counts"]["total"] == 3, again


def sweep_job_cancelled_elsewhere_is_not_done(mp: Any, _: Path) -> None:
    """A sweep one of whose jobs another client cancelled (DELETE /jobs/{id}) ends `error`, saying so."""
    with client() as c:
        sid = c.post("/sweeps", json={"models": ["default"], "tasks": ["syn-sentiment"], "kinds": ["tick"],
                                      "seeds": [0, 1], "params": {"group": 6, "steps": 100, "delay": 0.02}}).json()["id"]

        def submitted() -> list[str]:
            ids = [x["job_id"] for x in c.get(f"/sweeps/{sid}").json()["jobs"] if x["job_id"]]
            return ids if len(ids) == 2 else []

        ids = wait_until(submitted, "both of the sweep's jobs submitted", poll_s=0.02)
        c.delete(f"/jobs/{ids[-1]}")  # the second one, queued behind the first
        s = wait_sweep(c, sid)
    assert s["status"] == "error" and s["counts"]["cancelled"] == 1 and "cancelled outside this sweep" in s["message"]


def upload_pinned_while_queued(mp: Any, tmp: Path) -> None:
    """An upload a queued job needs is neither evicted from memory nor deleted for the quota."""
    from backend.service.task_store import TaskStore

    store = TaskStore(tmp / "uploads", memory_items=1, quota_bytes=1)
    text = lambda i: ("\n".join(f'{{"input": "w{i}x{j}", "output": "y{j % 2}"}}' for j in range(40))).encode()  # noqa: E731
    a, _ = store.add("a.jsonl", text(0))
    store.in_use = lambda: {a}  # a queued job names it
    for i in (1, 2, 3):
        store.add(f"b{i}.jsonl", text(i))
    assert (tmp / "uploads" / f"{a[len('upload:'):]}.json").is_file() and a in store._uploads
    assert store.get(a).name == "a"
    store.in_use = set
    store.add("c.jsonl", text(4))
    assert not (tmp / "uploads" / f"{a[len('upload:'):]}.json").is_file()  # unpinned: the quota takes it
    with client() as c:  # the app wires the pin to its runner's queued jobs and its running sweeps
        up = c.post("/tasks/upload", json={"filename": "p.jsonl", "content": text(9).decode()}).json()["id"]
        block = c.post("/jobs", json={"kind": "tick", "group": 11, "steps": 100, "delay": 0.02}).json()["id"]
        queued = c.post("/jobs", json={"kind": "fit", "task": up}).json()
        assert queued["status"] == "queued" and up in c.app.state.tasks.in_use()
        c.delete(f"/jobs/{block}")
        assert wait_job(c, queued["id"])["status"] == "done"


# -- issue 17: the estimated time, before a run -------------------------------------------------------------------
def estimate_route(mp: Any, _: Path) -> None:
    """POST /jobs/estimate: work and seconds before a run, never queued or computed; the seconds come from the
    model's size until a job has run on it here, then from the runs (borrowed by a kind never run); over the limit
    it says so."""
    mp.setenv("HEADLENS_TIMINGS", "on")
    body = {"kind": "site_alphas", "task": "syn-antonym"}
    with client() as c:
        before = c.post("/jobs/estimate", json=body).json()
        assert c.get("/jobs").json() == [] and c.app.state.pool.loaded() == []  # nothing queued, nothing loaded
        ran = c.post("/jobs", json={"kind": "icl_curve", "task": "syn-antonym", "shots": [0, 2], "prompts": 4})
        assert wait_job(c, ran.json()["id"])["status"] == "done"
        after = c.post("/jobs/estimate", json=body).json()
    assert "assumed from the model's size" in before["basis"] and "other analysis" in after["basis"], (before, after)
    assert before["passes"] == after["passes"] > 0 and after["seconds"] > 0 and after["text"]
    assert after["admitted"] and after["refusal"] is None and after["low"] <= after["seconds"] <= after["high"]
    from backend.service.app import create_app
    from backend.service.limits import Limits

    with TestClient(create_app(limits=Limits(max_work=10))) as c:
        over = c.post("/jobs/estimate", json=body).json()
    assert over["admitted"] is False and "HEADLENS_MAX_WORK" in over["refusal"]


def run_row_states_the_estimate(mp: Any, _: Path) -> None:
    """A Run row states the estimated time of jobs over 5 s (summed), and the refusal of one over the limit."""
    from ui.sections import estimate_text

    quick = {"seconds": 2.0, "passes": 10, "basis": "3 earlier runs of head_maps here", "admitted": True}
    slow = {"seconds": 200.0, "passes": 900, "basis": "assumed from the model's size", "admitted": True}
    over = {"seconds": 9e5, "passes": 3e6, "admitted": False, "refusal": "too big"}
    assert estimate_text([quick]) == ("", None) and estimate_text([None]) == ("", None)
    text, refusal = estimate_text([quick, slow])
    assert "about 3 min" in text and "910 prompt passes" in text and "assumed" in text and refusal is None
    assert estimate_text([over])[1] == "too big" and "about 250.0 h" in estimate_text([over])[0]


# -- 8. Ray --------------------------------------------------------------------------------------------------------
def ray_idle_workers_killed_then_a_job(mp: Any, tmp: Path) -> None:
    """With 2 workers and 1 retry, killing both idle workers and then submitting: the job runs (only deaths during
    a job count), and the dead idle actors are replaced."""
    ray = pytest.importorskip("ray")
    from backend.service.limits import Limits
    from backend.service.model_pool import ModelPool
    from backend.service.ray_cluster import RayConfig
    from backend.service.ray_runner import RayJobRunner
    from backend.service.task_store import TaskStore

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False)
    runner = RayJobRunner(ModelPool(), TaskStore(), limits=Limits(), cache_directory=tmp / "cache",
                          config=RayConfig(max_actors=2, retries=1, poll_s=0.05, idle_s=3600,
                                           pythonpath=(str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent))))
    try:
        jobs = [submit(runner, "tick", {"group": g, "steps": 20, "delay": 0.05}, f"tick-{g}")
                for g in (1, 2)]
        for j in jobs:
            while (j := runner.get(j.id)).status in ("queued", "running"):
                time.sleep(0.05)
            assert j.status == "done", j
        pids = [a["pid"] for a in runner.actors.describe()]
        assert len(pids) == 2
        handles = [a.handle for a in runner.actors._actors]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for h in handles:  # until Ray knows they are dead (instead of a guess of how long that takes)
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(h.poll.remote(""), timeout=HANG_S)
        j = submit(runner, "tick", {"group": 3}, "tick-3")
        while (j := runner.get(j.id)).status in ("queued", "running"):
            time.sleep(0.05)
        assert j.status == "done" and j.result["pid"] not in pids, j
        assert runner.retried == 0
    finally:
        runner.close()
        if started:
            ray.shutdown()


def ray_local_instance_goes_with_the_service(mp: Any, tmp: Path) -> None:
    """kill -9 of a service that started a local Ray instance: Ray's processes (the agents too) go with it."""
    pytest.importorskip("ray")
    from backend.service.ray_watchdog import descendants

    code = ("import sys, time; from backend.service.ray_cluster import RayConfig, connect; "
            "connect(RayConfig(num_cpus=1)); print('up', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    try:
        assert proc.stdout.readline().strip() == "up"
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:  # wait for the agents (started by the raylet a little after)
            kids = descendants(proc.pid)
            names = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in kids if Path(f"/proc/{pid}").exists()}
            if sum(b"Agent" in n for n in names.values()) >= 2:
                break
            time.sleep(0.5)
        assert sum(b"Agent" in n for n in names.values()) >= 2, names
        proc.kill()
        proc.wait(HANG_S)
        deadline = time.monotonic() + HANG_S
        alive = kids
        while time.monotonic() < deadline and alive:
            alive = {p: s for p, s in kids.items() if _running(p)}
            time.sleep(0.5)
        assert not alive, {p: names.get(p) for p in alive}
    finally:
        if proc.poll() is None:
            proc.kill()


def _running(pid: int) -> bool:
    """A process that exists and is no zombie (a container's init may not reap the ones it adopts)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2:].split()[0] != "Z"


RAY = pytest.mark.ray
CASES: dict[str, tuple[Callable[..., None], tuple]] = {
    "5.1 site budget M counted (HEADLENS_MAX_WORK=2000)": (site_budget_counts, ()),
    "5.2 methods counts its site and steer sub-calls": (methods_counts_its_sub_calls, ()),
    "5.3 ltv layer=all: same refusal fresh and loaded": (ltv_all_layers_same_fresh_or_loaded, ()),
    "5.4 CLI honours HEADLENS_JOB_TIMEOUT_S and the work limit": (cli_honours_the_job_time_limit, ()),
    "6.1 interactive job ahead of three 48-job sweeps, no 429": (interactive_goes_ahead_of_three_sweeps, ()),
    "6.2 a long running sweep job gives way": (a_long_sweep_job_gives_way, ()),
    "6.3 oversized grid refused before planning": (oversized_grid_refused_before_planning, ()),
    "7.1 seeds [true] refused": (seed_true_refused, ()),
    "7.2 random_seeds [-1] refused": (random_seed_negative_refused, ()),
    "7.3 rerun served from finished jobs counts cached": (rerun_from_finished_jobs_counts_cached, ()),
    "7.4 sweep job cancelled by another client: not done": (sweep_job_cancelled_elsewhere_is_not_done, ()),
    "7.5 upload pinned while a queued job needs it": (upload_pinned_while_queued, ()),
    "17.1 POST /jobs/estimate: before a run, measured once loaded": (estimate_route, ()),
    "17.2 a Run row states the estimated time over 5 s": (run_row_states_the_estimate, ()),
    "8.2 Ray: idle workers killed, then a job runs": (ray_idle_workers_killed_then_a_job, (RAY,)),
    "8.3 Ray: local instance goes after kill -9 of the service": (ray_local_instance_goes_with_the_service, (RAY,)),
}


@pytest.mark.parametrize("case", [pytest.param(name, marks=marks, id=fn.__name__) for name, (fn, marks)
                                  in CASES.items()])
def test_limit(case, monkeypatch, tmp_path):
    CASES[case][0](monkeypatch, tmp_path)
