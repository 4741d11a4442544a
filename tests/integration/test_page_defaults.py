"""Every page on its default settings, as a new user opens it, warns about nothing (issue 19, defect 5).

One session (Streamlit's AppTest, the in-process service, the embedded default model) opens the app with no link,
so every setting holds its default (the default model's first task, 8 shots, 50 prompts asked of a task with 20
held-out queries, seed 0), walks every page and presses every Run button that runs on this task (not the two that
run every task of the model: LTV across tasks and SITE transfer, whose per-task runs are the ones pressed here).
Each page: no exception, no error and no warning; notes (how a default recipe was fitted to a small task) are not
warnings and may show. The defaults once warned on the first run, twice ("50 prompts asked, 20 queries exist").
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit.testing.v1")
from streamlit.testing.v1 import AppTest  # noqa: E402
from page_checks import assert_clean  # noqa: E402
from hang import HANG_S  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "app.py")
PAGES = [("app.py", ["run"]), ("pages/1_Head_map.py", []), ("pages/2_Ablation.py", []),
         ("pages/3_Steering_geometry.py", ["run_steer", "run_geometry", "run_perturb"]), ("pages/4_Head.py", []),
         ("pages/5_Learned_task_vectors.py", ["run_ltv"]), ("pages/6_Soft_head_selection.py", ["run_site", "run_methods"]),
         ("pages/7_Sweeps.py", [])]

pytestmark = pytest.mark.skipif(not (REPO / "models" / "headlens-tiny" / "config.json").is_file(),
                                reason="the default model (models/headlens-tiny) is absent")


def test_every_page_on_its_default_settings_warns_about_nothing(inprocess, monkeypatch):
    monkeypatch.delenv("HEADLENS_DEFAULT_MODEL", raising=False)
    at = AppTest.from_file(APP, default_timeout=HANG_S)
    at.run()
    assert_clean(at)
    task = at.session_state["s_task"]
    assert at.session_state["s_prompts"] == 50 and task.startswith("syn-")
    seen = {}
    for path, runs in PAGES:
        if path != "app.py":
            at.switch_page(path)
            at.run()
        for key in runs:
            at.button(key=key).click().run()
        assert_clean(at)
        assert not at.warning, (path, [w.value for w in at.warning])
        seen[path] = [c.value for c in at.caption if ":material/info:" in c.value]
    assert at.session_state["s_prompts"] == 50  # the asked count stays (a link keeps it); the jobs asked for 20
    home = [c.value for c in AppTest.from_file(APP, default_timeout=HANG_S).run().sidebar.caption]
    assert any("held-out queries: all 20 are scored" in c for c in home), home
    assert any("training prompts" in n for n in seen["pages/5_Learned_task_vectors.py"]), seen  # a note, shown
