"""The live lane (issue 25, item 1): a job estimated at most a few seconds (a toggle) never waits behind a long job,
whoever started it; the long job gives way at its next progress step, within a bound, and still finishes; a queued
job says what it waits for.

The executor here is a test double: a `long` job is a loop of progress steps (each waiting on an Event, so the test
decides when it moves), a `short` job returns at once. No wall-clock assertions: only order and messages, with a
generous hang guard.
"""
from __future__ import annotations

from plain_job import submit

import threading
import time
from typing import Any

import pytest

from backend.service import jobs as J
from backend.service.jobs import LocalJobRunner, lane_for
from backend.service.timing import remaining_seconds as remaining_s
from backend.service.limits import Limits
from hang import HANG_S, wait_until  # noqa: E402  (a hang guard, never a timing assertion)


class Harness:
    """A runner whose `long` jobs step until the test sets `free` (so none ends before the test lets it)."""

    def __init__(self, yield_points: bool = True):
        self.yield_points = yield_points
        self.order: list[str] = []  # job names in the order they finished
        self.started: dict[str, int] = {}  # times each job started (a job that gave way starts again)
        self.steps = 0  # progress steps the long jobs made
        self.at_step = threading.Event()  # a long job reached a progress step
        self.free = threading.Event()  # long jobs end once it is set
        self.runner = LocalJobRunner(self.execute, limits=Limits())

    def execute(self, job: Any, progress: Any) -> dict[str, Any]:
        kind, params = job.kind, job.params
        name = params["name"]
        self.started[name] = self.started.get(name, 0) + 1
        if kind == "one_step":  # one long step, then one progress call
            self.at_step.set()
            assert self.free.wait(HANG_S)
            progress(0.9, "last step")
        elif kind != "short":
            if not self.yield_points:  # one long step with no progress call: it cannot give way
                self.at_step.set()
                assert self.free.wait(HANG_S)
            deadline = time.monotonic() + HANG_S
            while not self.free.is_set() and time.monotonic() < deadline:
                progress(0.5, "step")
                self.steps += 1
                self.at_step.set()
                time.sleep(0.002)
        self.order.append(name)
        return {"name": name}

    def submit(self, kind: str, name: str, seconds: float | None, lane: str = "interactive") -> Any:
        return submit(self.runner, kind, {"name": name}, f"{kind}:{name}", lane=lane, seconds=seconds)

    def wait(self, job_id: str, states: tuple[str, ...] = ("done",)) -> Any:
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            j = self.runner.get(job_id)
            if j.status in states:
                return j
            time.sleep(0.002)
        raise AssertionError(f"job {job_id} stayed {self.runner.get(job_id).status}: {self.runner.get(job_id).message}")

    def running(self, job_id: str) -> None:
        self.wait(job_id, ("running",))
        assert self.at_step.wait(HANG_S)

    def more_steps(self, n: int = 20) -> None:
        """Wait until the running long job has made `n` more progress steps (any give-way happens at the first)."""
        target, deadline = self.steps + n, time.monotonic() + HANG_S
        while self.steps < target and time.monotonic() < deadline:
            time.sleep(0.002)
        assert self.steps >= target


def test_lane_from_the_estimate():
    assert lane_for("interactive", 0.5) == "live" and lane_for("interactive", J.LIVE_MAX_S) == "live"
    assert lane_for("interactive", J.LIVE_MAX_S + 0.1) == "interactive"
    assert lane_for("interactive", None) == "interactive"  # unknown: not live
    assert lane_for("sweep", 0.5) == "sweep"  # a sweep's jobs stay in the sweep lane


def test_remaining_time_from_progress_else_the_estimate():
    assert remaining_s(0.25, 10.0, 100.0) == pytest.approx(30.0)  # its own pace: 10 s for a quarter
    assert remaining_s(0.0, 10.0, 100.0) == pytest.approx(90.0)  # no progress yet: what the estimate leaves
    assert remaining_s(0.0, 120.0, 100.0) is None and remaining_s(0.0, 5.0, None) is None


@pytest.mark.parametrize("lane", ["interactive", "sweep"])
def test_a_toggle_behind_a_long_job_finishes_first(lane):
    """A page's (interactive) or a sweep's long job gives way to a toggle-sized job at its next step: the toggle
    finishes first; the long job starts again after it and still finishes with its own result."""
    h = Harness()
    try:
        long = h.submit("long", "curves", 600.0, lane=lane)
        h.running(long.id)
        toggle = h.submit("short", "toggle", 1.0)
        assert toggle.lane == "live"
        assert h.wait(toggle.id).result == {"name": "toggle"}
        h.free.set()
        done = h.wait(long.id)
        assert h.order == ["toggle", "curves"]
        assert done.result == {"name": "curves"} and done.preempted == 1 and h.started["curves"] == 2
    finally:
        h.runner.close()


def test_a_running_job_giving_way_says_so():
    h = Harness(yield_points=False)  # no progress step: it keeps its promise to give way only at its end here
    try:
        long = h.submit("ablation_curves", "curves", 600.0)
        h.running(long.id)
        toggle = h.submit("ablate", "toggle", 1.0)
        assert h.runner.get(toggle.id).message == "queued (behind ablation_curves (giving way at its next step))"
    finally:
        h.free.set()
        h.runner.close()


def test_live_jobs_go_before_queued_interactive_ones():
    """Behind a long running job and a queued interactive one, a live job is taken first."""
    h = Harness(yield_points=False)
    try:
        first = h.submit("long", "first", 600.0)
        h.running(first.id)
        queued = h.submit("short", "queued", 60.0)
        toggle = h.submit("short", "toggle", 1.0)
        assert queued.lane == "interactive" and toggle.lane == "live"
        h.free.set()
        h.wait(queued.id)
        h.wait(toggle.id)
        assert h.order == ["first", "toggle", "queued"]
    finally:
        h.free.set()
        h.runner.close()


def test_the_queued_message_names_what_it_waits_for(monkeypatch):
    """A queued job's message names the running job and its time left, and the queued jobs ahead, never `0 jobs
    ahead`. The long job here has no budget to give way, so the toggle waits."""
    monkeypatch.setattr(J, "LIVE_LOSS_MIN_S", 0.0)
    monkeypatch.setattr(J, "LIVE_LOSS_SHARE", 0.0)
    h = Harness(yield_points=False)
    try:
        long = h.submit("ablation_curves", "curves", 600.0)
        h.running(long.id)
        other = h.submit("scores", "other", 45.0)
        toggle = h.submit("ablate", "toggle", 1.0)
        msg = h.runner.get(toggle.id).message
        assert msg.startswith("queued (behind ablation_curves (about ") and " min left)" in msg, msg
        assert "ahead" not in msg and "scores" not in msg  # the live toggle goes before the queued scores
        msg = h.runner.get(other.id).message
        assert "behind ablation_curves (about" in msg and "1 queued job (ablate: about 1 s)" in msg, msg
        h.free.set()
        h.wait(long.id)
        h.wait(other.id)
        h.wait(toggle.id)
    finally:
        h.free.set()
        h.runner.close()


def test_a_job_gives_way_to_live_jobs_only_within_its_budget(monkeypatch):
    """Once the work a job may lose by giving way passes its budget, it runs to its end and the toggle waits (so a
    long job always finishes under a stream of toggles); the toggle's message then says what it waits for."""
    monkeypatch.setattr(J, "LIVE_LOSS_MIN_S", 0.0)
    h = Harness()
    try:
        long = h.submit("long", "curves", 0.0)  # a budget of 0 s: it never gives way
        h.running(long.id)
        toggle = h.submit("short", "toggle", 1.0)
        h.more_steps()
        j = h.runner.get(toggle.id)
        assert j.status == "queued" and j.message.startswith("queued (behind long ("), j.message
        h.free.set()
        h.wait(toggle.id)
        assert h.order == ["curves", "toggle"] and h.runner.get(long.id).preempted == 0
    finally:
        h.free.set()
        h.runner.close()


def test_a_sweep_job_gives_way_to_interactive_jobs_at_most_preempt_max_times():
    h = Harness()
    try:
        long = h.submit("long", "sweep-job", None, lane="sweep")
        for i in range(J.PREEMPT_MAX):
            h.at_step.clear()
            h.running(long.id)
            h.wait(h.submit("short", f"i{i}", None).id)
        h.at_step.clear()
        h.running(long.id)
        last = h.submit("short", "last", None)
        h.more_steps()
        assert h.runner.get(last.id).status == "queued"
        h.free.set()
        assert h.wait(long.id).preempted == J.PREEMPT_MAX
        h.wait(last.id)
        assert h.order == [f"i{i}" for i in range(J.PREEMPT_MAX)] + ["sweep-job", "last"]
    finally:
        h.free.set()
        h.runner.close()


def test_a_live_request_moves_a_queued_job_up():
    """A request of a higher lane for a job queued in a lower one moves it to that lane (the sweep's job a page now
    waits for)."""
    h = Harness(yield_points=False)
    try:
        first = h.submit("long", "first", 600.0)
        h.running(first.id)
        queued = h.submit("short", "shared", 1.0, lane="sweep")
        assert queued.lane == "sweep"
        again = h.submit("short", "shared", 1.0)
        assert again.id == queued.id and again.lane == "live" and again.submitters == 2
        h.free.set()
        h.wait(queued.id)
    finally:
        h.free.set()
        h.runner.close()


# -- through the service, on the embedded default model -------------------------------------------------------------
def _service_wait(c: Any, jid: str) -> dict[str, Any]:
    return wait_until(lambda: (j := c.get(f"/jobs/{jid}").json())["status"] not in ("queued", "running") and j,
                      f"job {jid} to finish", poll_s=0.02)


def test_a_toggle_on_prompts_whose_prefix_is_held_is_estimated_at_its_token_steps(monkeypatch):
    """Once the Head map's pass has kept the prompts' clean prefix, a last-token toggle's estimate leaves its clean
    pass out of the seconds (not of the work, which the limit checks), and POST /jobs runs it in the live lane; an
    every-position toggle keeps its full estimate."""
    from starlette.testclient import TestClient

    from backend.analysis.primitives.prefix_store import STORE
    from backend.service.app import create_app

    STORE.clear()
    common = {"model": "default", "task": "syn-antonym", "shots": 2, "prompts": 6}
    toggle = {"kind": "ablate", **common, "heads": [[0, 0]], "positions": "last"}
    with TestClient(create_app()) as c:
        cold = c.post("/jobs/estimate", json=toggle).json()
        assert _service_wait(c, c.post("/jobs", json={"kind": "head_scores", **common}).json()["id"])["status"] == "done"
        warm = c.post("/jobs/estimate", json=toggle).json()
        every = c.post("/jobs/estimate", json={**toggle, "positions": "all"}).json()
        assert cold["held_tokens"] == 0 and warm["held_tokens"] > 0 and every["held_tokens"] == 0, (cold, warm)
        assert warm["tokens"] == cold["tokens"] and warm["passes"] == cold["passes"]  # the work limit's figures
        assert warm["units"] < cold["units"] and warm["seconds"] < cold["seconds"], (cold, warm)
        assert "held in memory" in warm["how"]
        # between the two (the answers' seconds are rounded to 3 decimals): live once held, not before
        monkeypatch.setattr(J, "LIVE_MAX_S", (warm["seconds"] + cold["seconds"]) / 2)
        job = c.post("/jobs", json=toggle).json()
        assert job["lane"] == "live", (warm, job)
        assert _service_wait(c, job["id"])["status"] == "done"
        monkeypatch.setattr(J, "LIVE_MAX_S", 0.0)
        job = c.post("/jobs", json={**toggle, "heads": [[0, 1]], "positions": "all"}).json()
        assert job["lane"] == "interactive"
        _service_wait(c, job["id"])
    STORE.clear()


def test_an_ablation_curve_after_its_head_map_is_estimated_without_the_head_scores():
    """Issue 35: the curve reads its rankings from the cached head scores of the same prompts (the Head map's), so
    once they are cached its estimate leaves that stage out of the seconds (not of the work); other prompts keep it."""
    from starlette.testclient import TestClient

    from backend.service.app import create_app

    common = {"model": "default", "task": "syn-antonym", "shots": 2, "prompts": 5, "seed": 3}
    curve = {"kind": "ablation_curves", **common, "orders": ["tr"], "ks": [0, 2]}  # every position: no prefix held
    with TestClient(create_app()) as c:
        cold = c.post("/jobs/estimate", json=curve).json()
        assert _service_wait(c, c.post("/jobs", json={"kind": "head_maps", **common}).json()["id"])["status"] == "done"
        warm = c.post("/jobs/estimate", json=curve).json()
        other = c.post("/jobs/estimate", json={**curve, "seed": 4}).json()
    assert cold["held_tokens"] == 0 and other["held_tokens"] == 0 and warm["held_tokens"] > 0, (cold, warm)
    assert warm["tokens"] == cold["tokens"] and warm["units"] < cold["units"], (cold, warm)
    assert "held in memory" in warm["how"]


def test_a_job_asked_to_give_way_goes_on_when_the_toggle_is_cancelled_first():
    h = Harness()
    try:
        long = h.submit("one_step", "curves", 600.0)
        h.running(long.id)
        toggle = h.submit("short", "toggle", 1.0)  # asks the long job to give way at its next step
        assert h.runner.get(toggle.id).message.endswith("(giving way at its next step))")
        assert h.runner.cancel(toggle.id).status == "cancelled"
        h.free.set()  # its next step comes after the cancel: nothing to give way to
        assert h.wait(long.id).preempted == 0 and h.started["curves"] == 1
    finally:
        h.free.set()
        h.runner.close()


def test_a_finer_check_than_the_progress_steps_gives_way_too():
    """`progress.check()` (a loop finer than its progress steps) stops the job for a live one as a step does."""
    seen: list[str] = []
    go = threading.Event()

    def execute(job, progress):
        kind, params = job.kind, job.params
        if kind == "long":
            progress(0.1, "one step")
            go.wait(HANG_S)
            for _ in range(10000):
                progress.check()
                time.sleep(0.001)
        seen.append(params["name"])
        return {}

    runner = LocalJobRunner(execute, limits=Limits())
    try:
        long = submit(runner, "long", {"name": "curves"}, "k1", seconds=600.0)
        deadline = time.monotonic() + HANG_S
        while runner.get(long.id).message != "one step" and time.monotonic() < deadline:
            time.sleep(0.002)
        toggle = submit(runner, "short", {"name": "toggle"}, "k2", seconds=1.0)
        go.set()
        while runner.get(toggle.id).status != "done" and time.monotonic() < deadline:
            time.sleep(0.002)
        assert seen[0] == "toggle" and runner.get(long.id).preempted == 1
    finally:
        go.set()
        runner.close()
