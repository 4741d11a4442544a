"""Nothing long starts by itself (issue 25, item 2): a page shows what is cached at once, but a job estimated over
the service's HOLD_OVER_S is `held` by POST /jobs (start `if_short`) and waits for its Run button with its estimate
shown; pressing Run starts that request (start `always`); a changed setting asks again. Streamlit's AppTest of the
Ablation page, the in-process service, the default model, the service's estimate of the ablation curves
monkeypatched to 10 minutes."""
from __future__ import annotations

import pytest

pytest.importorskip("streamlit.testing.v1")
from page_checks import assert_clean  # noqa: E402
from test_pages import ABLATION, MODEL, SMALL, default_task, has_frame, needs_model, page  # noqa: E402


def test_the_rule(inprocess, monkeypatch):
    """POST /jobs answers a job estimated over HOLD_OVER_S `held` with its estimate (start `if_short`), queues it
    with `always`, and never starts anything with `never`."""
    from backend.service import jobs as J

    body = {"model": "default", "task": "syn-sentiment", "shots": [0, 2], "prompts": 4}
    monkeypatch.setattr(J, "HOLD_OVER_S", 0.0)
    held = inprocess.ask("icl_curve", body, "if_short")
    assert held["status"] == "held" and held["estimate"]["seconds"] > 0 and held["estimate"]["admitted"]
    assert inprocess.ask("icl_curve", body, "never")["status"] == "held"
    assert inprocess.ask("icl_curve", body, "always")["status"] in ("queued", "running", "done")


@pytest.fixture
def long_curves(inprocess, monkeypatch):
    """The service holds every ablation-curves request asked `if_short` (estimated at 10 minutes); every request
    that may start a job is recorded."""
    from ui import api

    real_ask = api.ask
    submitted: list[str] = []

    def ask(kind, params, start="always"):
        if kind == "ablation_curves" and start == "if_short":
            j = real_ask(kind, params, "never")
            if j["status"] == "held":
                j["estimate"] = {**j["estimate"], "seconds": 600.0, "low": 600.0, "high": 600.0}
                return j
        if start != "never":
            submitted.append(kind)
        return real_ask(kind, params, start)

    monkeypatch.setattr(api, "ask", ask)
    return submitted


def _run_rows(at) -> list[str]:
    return [i.value for i in at.info if "waits for Run" in i.value]


@needs_model
def test_the_ablation_page_does_not_start_curves_estimated_over_the_threshold(long_curves):
    at = page(ABLATION, model=MODEL, task=default_task(), kmax="4", **SMALL)
    at.run()
    assert_clean(at)
    assert "ablation_curves" not in long_curves  # not submitted
    assert not has_frame(at, "accuracy_std")  # no curves drawn
    rows = _run_rows(at)
    assert len(rows) == 1 and "**Ablation curves**" in rows[0] and "about 10 min" in rows[0], rows

    at.button(key="autorun_ablation_curves").click().run()  # Run: this request starts
    assert_clean(at)
    assert long_curves.count("ablation_curves") == 1 and has_frame(at, "accuracy_std") and not _run_rows(at)

    at.select_slider(key="w_kmax").set_value(2).run()  # a changed setting: asked again, not started
    assert_clean(at)
    assert long_curves.count("ablation_curves") == 1 and len(_run_rows(at)) == 1 and not has_frame(at, "accuracy_std")


@needs_model
def test_a_short_job_still_starts_by_itself(long_curves):
    """The toggle (estimated well under the threshold on the default model) runs without a Run button."""
    at = page(ABLATION, model=MODEL, task=default_task(), kmax="4", heads="0.1", **SMALL)
    at.run()
    assert_clean(at)
    assert "ablate" in long_curves and has_frame(at, "gold_prob_after")
    assert [r for r in _run_rows(at) if "Ablating" in r] == []
