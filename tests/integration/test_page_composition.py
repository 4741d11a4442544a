"""The Head page's composition section (kind `composition`): Streamlit's AppTest of the page, the in-process
service, the default model. Before Run it computes nothing; after Run its heatmap, OV circuit and feeders table show
the numbers of the service's result, and its Copy as Python names `composition`."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("streamlit.testing.v1")
from page_checks import assert_clean  # noqa: E402
from test_pages import HEAD_PAGE, MODEL, SMALL, frame_with, needs_model, page, task_name  # noqa: E402,F401


@needs_model
def test_head_page_composition_section(inprocess, task_name):  # noqa: F811 - the fixture of test_pages
    at = page(HEAD_PAGE, model=MODEL, task=task_name, head="1.2", **SMALL)
    at.run()
    assert_clean(at)
    assert not [el for el in at.get("plotly_chart") if el.proto.id.endswith("comp_heat")]  # nothing before Run
    at.button(key="run_composition").click().run()
    assert_clean(at)
    want = inprocess.run("composition", {"model": MODEL, "task": task_name, "shots": 4, "prompts": 16, "seed": 0,
                                         "top_k": 3, "head": [1, 2]})
    charts = {el.proto.id.rsplit("-", 1)[-1]: json.loads(el.proto.spec) for el in at.get("plotly_chart")}
    heat = next(v for k, v in charts.items() if k.endswith("comp_heat"))["data"][0]["z"]
    got = np.array([[np.nan if x is None else x for x in row] for row in heat], dtype=float)
    np.testing.assert_allclose(got, np.asarray(want["v"], dtype=float), equal_nan=True)
    ov = next(v for k, v in charts.items() if k.endswith("comp_ov"))["data"][0]
    np.testing.assert_allclose(ov["z"], want["ov_labels"]) and ov["x"] == want["labels"]
    feeders = frame_with(at, "z among its senders")
    assert len(feeders) == sum(f["mode"] == "v" for f in want["feeders"]) > 0
    assert any("composition(" in c.value for c in at.code)
