"""ui/jobs.py against a fake service: one POST /jobs per result (`ask`), cached results skip the queue, one job in flight per slot (a superseded one is
cancelled before the new one is submitted, a rerun re-attaches instead of re-submitting), Cancel withdraws the job
and the page then offers Run again, and results carry the time the user waited."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("streamlit.testing.v1")
from streamlit.testing.v1 import AppTest  # noqa: E402
from hang import HANG_S  # noqa: E402


class FakeService:
    """What ui.api offers, recording every call; jobs finish after `polls` GETs."""

    def __init__(self, polls: int = 2, cached: dict | None = None):
        self.calls: list[tuple] = []
        self.polls, self.cached_results = polls, cached or {}
        self.jobs: dict[str, dict] = {}

    def ask(self, kind, params, start="always"):
        self.calls.append(("ask", kind))
        hit = self.cached_results.get((kind, params.get("x")))
        if hit is not None:
            return {"id": "done-1", "status": "done", "result": hit}
        jid = f"j{len(self.jobs) + 1}"
        self.jobs[jid] = {"kind": kind, "params": params, "seen": 0, "status": "queued"}
        return {"id": jid, "status": "queued", "estimate": None}

    def job(self, jid):
        j = self.jobs[jid]
        j["seen"] += 1
        if j["status"] == "cancelled":
            return {"status": "cancelled", "progress": 0.5, "message": "cancelled"}
        if j["seen"] > self.polls:
            return {"status": "done", "progress": 1.0, "message": "done",
                    "result": {"value": j["params"].get("x"), "seconds": 0.5, "cache_hit": False}}
        return {"status": "running", "progress": 0.5, "message": "stage two: sweep"}

    def cancel(self, jid):
        self.calls.append(("cancel", jid))
        self.jobs[jid]["status"] = "cancelled"
        return {}



@pytest.fixture
def fake(monkeypatch):
    from ui import api

    svc = FakeService()
    for name in ("ask", "job", "cancel"):
        monkeypatch.setattr(api, name, getattr(svc, name))
    return svc


def script():
    import streamlit as st

    from ui import jobs

    if st.session_state.pop("do_cancel", False):
        jobs.cancel_slot("demo")  # what the Cancel button's callback does before the page runs again
    x = st.session_state.get("x", 1)
    r = jobs.fetch("demo", {"x": x}, "Steering")
    if r is not None:
        st.markdown(f"value={r['value']} waited={r['_waited']:.3f}")


def test_fetch_waits_remembers_and_reports_the_wait(fake):
    at = AppTest.from_function(script, default_timeout=HANG_S)
    at.run()
    assert not at.exception
    assert [c[0] for c in fake.calls] == ["ask"]
    shown = [m.value for m in at.markdown if m.value.startswith("value=")]
    assert shown and shown[0].startswith("value=1 waited=")
    at.run()  # a rerun: from the session's memory, no call at all
    assert [c[0] for c in fake.calls] == ["ask"]


def test_a_cached_result_skips_the_queue(fake):
    fake.cached_results[("demo", 1)] = {"value": 1, "seconds": 0.01, "cache_hit": True}
    at = AppTest.from_function(script, default_timeout=HANG_S)
    at.run()
    assert [c[0] for c in fake.calls] == ["ask"] and not fake.jobs  # answered by the one call: no job
    assert any(m.value.startswith("value=1") for m in at.markdown)


def test_a_superseded_job_is_cancelled_before_the_new_one_is_submitted(fake):
    from ui import state

    at = AppTest.from_function(script, default_timeout=HANG_S)
    old_key = state.result_key("demo", {"x": 1})
    at.session_state["_hl_inflight"] = {"demo": {"key": old_key, "id": "j9", "t0": time.monotonic()}}
    fake.jobs["j9"] = {"kind": "demo", "params": {"x": 1}, "seen": 0, "status": "running"}
    at.session_state["x"] = 2  # the settings changed while j9 ran
    at.run()
    assert not at.exception
    assert [c[:2] for c in fake.calls] == [("cancel", "j9"), ("ask", "demo")]
    assert any(m.value.startswith("value=2") for m in at.markdown)


def test_a_rerun_reattaches_to_its_running_job(fake):
    from ui import state

    at = AppTest.from_function(script, default_timeout=HANG_S)
    at.session_state["_hl_inflight"] = {"demo": {"key": state.result_key("demo", {"x": 1}), "id": "j9", "t0": time.monotonic()}}
    fake.jobs["j9"] = {"kind": "demo", "params": {"x": 1}, "seen": 0, "status": "running"}
    at.run()
    assert fake.calls == []  # no new submission (the service would count a second submitter)
    assert any(m.value.startswith("value=1") for m in at.markdown)


def test_cancel_withdraws_the_job_and_offers_run_again(fake):
    from ui import state

    at = AppTest.from_function(script, default_timeout=HANG_S)
    key = state.result_key("demo", {"x": 1})
    at.session_state["_hl_inflight"] = {"demo": {"key": key, "id": "j9", "t0": time.monotonic()}}
    fake.jobs["j9"] = {"kind": "demo", "params": {"x": 1}, "seen": 0, "status": "running"}
    at.session_state["do_cancel"] = True
    at.run()
    assert not at.exception
    assert fake.calls == [("cancel", "j9")]  # withdrawn, and nothing resubmitted until Run again
    assert any("was cancelled" in i.value for i in at.info)
    assert not any(m.value.startswith("value=") for m in at.markdown)
    at.button(key="rerun_demo").click().run()
    assert [c[0] for c in fake.calls] == ["cancel", "ask"]
    assert any(m.value.startswith("value=1") for m in at.markdown)
