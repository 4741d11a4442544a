"""The Sweeps page through Streamlit's AppTest, against the in-process service: it starts a sweep from its form,
lists the sweeps, and shows a finished one as a models x tasks table with the per-model TR/TL summary; the
sweep and the metric live in the URL. Plus the page's figures from a summary dict."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit.testing.v1")
from streamlit.testing.v1 import AppTest  # noqa: E402
from hang import HANG_S, wait_until  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "app.py")
PAGE = "pages/7_Sweeps.py"
TASKS = ["syn-sentiment", "syn-antonym"]
needs_model = pytest.mark.skipif(not (REPO / "models" / "headlens-tiny" / "config.json").is_file(),
                                 reason="the default model is absent")

SUMMARY = {"depth_bins": 5,
           "rows": [{"model": "/m/a", "task": "t1", "tr_depth": 0.25, "tr_induction": 0.5, "accuracy": 0.9},
                    {"model": "/m/a", "task": "t2", "tr_depth": 0.75, "tr_induction": 0.1, "accuracy": 0.8},
                    {"model": "hub/b", "task": "t1", "tr_depth": 1.0, "accuracy": 0.4}],
           "models": [{"model": "/m/a", "tasks": 2, "tr_depth": 0.5, "tl_depth": 0.2, "tr_induction": 0.3,
                       "tl_induction": 0.0, "tr_depth_hist": [0, 0.5, 0, 0.5, 0], "tl_depth_hist": [1, 0, 0, 0, 0]},
                      {"model": "hub/b", "tasks": 1, "tr_depth": 1.0, "accuracy": 0.4}]}


def test_sweep_figures_from_a_summary():
    from ui import sweep_figures as SF

    df = SF.pivot(SUMMARY, "tr_depth")
    assert list(df.index) == ["a", "hub/b"] and list(df.columns) == ["t1", "t2"]
    assert df.loc["a", "t2"] == 0.75 and df.isna().loc["hub/b", "t2"]
    assert SF.metrics_present(SUMMARY) == ["tr_depth", "tr_induction", "accuracy"]
    heat = SF.table_heatmap(SUMMARY, "tr_depth").data[0]
    assert heat.type == "heatmap" and heat.zmin == 0 and heat.zmax == 1 and heat.text[0][1] == "0.75"
    prof = SF.depth_profile(SUMMARY)
    assert [t.name for t in prof.data] == ["a TR", "a TL"] and list(prof.data[0].y) == [0, 0.5, 0, 0.5, 0]
    scatter = SF.overlap_scatter(SUMMARY)
    assert list(scatter.data[0].x) == [0.5, 1.0] and list(scatter.data[0].text) == ["a", "hub/b"]
    assert list(SF.models_table(SUMMARY)["model"]) == ["a", "hub/b"]


def _page(**query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=HANG_S)
    for k, v in query.items():
        at.query_params[k] = v
    at.switch_page(PAGE)
    return at


def _clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@needs_model
def test_sweeps_page_starts_lists_and_shows_a_sweep(inprocess):
    at = _page(model="default", task=TASKS[0], shots="2", prompts="4", seed="0")
    at.run()
    _clean(at)
    assert any("No sweeps" in i.value for i in at.info)
    # start one from the form: the default model, two tasks, seeds 0 and 1
    at.multiselect(key="w_sw_tasks").set_value(TASKS)
    at.text_input(key="w_sw_seeds_0").set_value("0,1")
    next(b for b in at.button if b.label == "Start sweep").click()
    at.run()
    _clean(at)
    sid = at.session_state["s_sweep"]
    assert sid and at.query_params.get("sweep") in (sid, [sid])
    sw = wait_until(lambda: (sw := inprocess.sweep(sid))["status"] != "running" and sw, "the sweep finishing",
                    poll_s=0.1)
    assert sw["status"] == "done" and sw["counts"]["total"] == 4 and sw["counts"]["error"] == 0
    # a link to the finished sweep and a metric shows the table and the per-model summary
    at = _page(model="default", task=TASKS[0], shots="2", prompts="4", sweep=sid, sw_metric="tr_induction")
    at.run()
    _clean(at)
    frames = {tuple(df.value.columns) for df in at.dataframe}
    assert tuple(TASKS) in frames or tuple(reversed(TASKS)) in frames  # models x tasks
    models = next(df.value for df in at.dataframe if "tr_depth" in df.value.columns)
    assert list(models["model"]) == ["default"] and 0 <= models["tr_depth"][0] <= 1
    charts = at.get("plotly_chart")
    assert len(charts) == 3
    assert at.session_state["s_sw_metric"] == "tr_induction"
    listed = next(df.value for df in at.dataframe if "status" in df.value.columns)
    assert sid in list(listed["id"])
