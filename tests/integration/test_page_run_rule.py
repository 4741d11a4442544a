"""Nothing long starts by itself (issue 25, item 2): a page shows what is cached at once, but a job estimated over
`ui.jobs.AUTO_START_MAX_S` waits for its Run button with its estimate shown; pressing Run starts that request; a
changed setting asks again. Streamlit's AppTest of the Ablation page, the in-process service, the default model, the
service's estimate of the ablation curves monkeypatched to 10 minutes."""
from __future__ import annotations

import pytest

pytest.importorskip("streamlit.testing.v1")
from page_checks import assert_clean  # noqa: E402
from test_pages import ABLATION, MODEL, SMALL, default_task, has_frame, needs_model, page  # noqa: E402


def test_the_rule():
    from ui import jobs

    over = {"seconds": jobs.AUTO_START_MAX_S + 1, "admitted": True}
    assert jobs.waits_for_run(over)
    assert not jobs.waits_for_run({**over, "seconds": jobs.AUTO_START_MAX_S})
    assert not jobs.waits_for_run({**over, "admitted": False})  # its submission says why it is refused
    assert not jobs.waits_for_run(None) and not jobs.waits_for_run({"seconds": None})  # unknown: it starts


@pytest.fixture
def long_curves(inprocess, monkeypatch):
    """The service's estimate of every ablation-curves request says 10 minutes; every submission is recorded."""
    from ui import api

    real_estimate, real_submit = api.estimate, api.submit
    submitted: list[str] = []

    def estimate(kind, params):
        e = real_estimate(kind, params)
        return {**e, "seconds": 600.0, "text": "about 10 min"} if kind == "ablation_curves" and e else e

    def submit(kind, params):
        submitted.append(kind)
        return real_submit(kind, params)

    monkeypatch.setattr(api, "estimate", estimate)
    monkeypatch.setattr(api, "submit", submit)
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
