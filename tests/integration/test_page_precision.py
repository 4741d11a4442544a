"""The sidebar's Precision picker: float32 (the service's default on CPU) or bfloat16, what bfloat16 changes said
under it, the pick sent with the page's jobs (their results apart from float32's) and kept in the link."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit.testing.v1")
from streamlit.testing.v1 import AppTest  # noqa: E402
from hang import HANG_S  # noqa: E402
from page_checks import assert_clean  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (REPO / "models" / "headlens-tiny" / "config.json").is_file(),
                                reason="the default model (models/headlens-tiny) is absent")


def test_precision_picker_says_what_bfloat16_changes_and_sends_it(inprocess):
    from ui import snippets

    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=HANG_S)
    at.query_params.update({"model": "default", "shots": "2", "prompts": "8", "seed": "0"})
    at.run()
    assert_clean(at)
    pick = at.segmented_control(key="w_precision")
    assert pick.value == "float32" and list(pick.options) == ["float32", "bfloat16"]
    assert not any("bfloat16 runs the model" in c.value for c in at.sidebar.caption)
    pick.set_value("bfloat16").run()
    assert_clean(at)
    assert any("bfloat16 runs the model" in c.value and "cached apart" in c.value for c in at.sidebar.caption)
    assert at.session_state["s_precision"] == "bfloat16"
    assert at.query_params["precision"] == ["bfloat16"] or at.query_params["precision"] == "bfloat16"
    before = set(at.session_state["_hl_results"])  # the fit check of the first run, in float32
    at.button(key="run").click().run()
    assert_clean(at)
    sent = [k for k in at.session_state["_hl_results"] if k not in before]
    assert any(not k.startswith("task_fit") for k in sent)  # the Home page's run
    assert all('"precision": "bfloat16"' in k for k in sent if '"model"' in k), sent
    code = snippets.python("head_maps", {"model": "default", "precision": "bfloat16", "task": "syn-sentiment",
                                         "shots": 2})
    assert "load_model('default', precision='bfloat16')" in code and "head_maps(lm, task, shots=2)" in code
    pick = at.segmented_control(key="w_precision")
    pick.set_value("float32").run()
    assert at.session_state["s_precision"] is None  # the default again: left out of jobs and the link
