"""The Head map's site-patching section (kind `site_patching`): Streamlit's AppTest of the page, the in-process
service, the default model. Closed, it draws nothing; open, before Run it computes nothing; after Run its layer x position and layer x head maps
show the service's recovered shares (the hover their standard errors), and its Copy as Python names
`site_patching`."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("streamlit.testing.v1")
from page_checks import assert_clean, figure, vals  # noqa: E402
from test_pages import HEAD_MAP, MODEL, SMALL, metric, needs_model, page, task_name  # noqa: E402,F401


@needs_model
def test_head_map_site_patching_section(inprocess, task_name):  # noqa: F811 - the fixture of test_pages
    at = page(HEAD_MAP, model=MODEL, task=task_name, **SMALL)
    at.run()
    assert_clean(at)
    assert not any("layer × position and layer × head" in i.value for i in at.info)  # closed: nothing of it drawn
    at.toggle(key="w_sp").set_value(True).run()
    assert any("layer × position and layer × head" in i.value for i in at.info)
    assert not [el for el in at.get("plotly_chart") if el.proto.id.endswith("sp_positions")]  # nothing before Run
    at.selectbox(key="w_sp_site").set_value("mlp_out").run()
    at.button(key="run_site_patching").click().run()
    assert_clean(at)
    want = inprocess.run("site_patching", {"model": MODEL, "task": task_name, "shots": 4, "prompts": 16, "seed": 0,
                                           "target": "random_labels", "site": "mlp_out", "view": "both",
                                           "position": "last"})
    pos = next(t for t in figure(at, "sp_positions")["data"] if t["type"] == "heatmap")
    np.testing.assert_allclose(vals(pos["z"]), np.asarray(want["recovered"], dtype=float))
    assert list(pos["x"]) == want["columns"] and "label:1" in want["columns"]
    se = np.asarray(want["recovered_se"], dtype=float)
    assert pos["customdata"][0][0] == f"{want['recovered'][0][0]:.3f} ± {se[0, 0]:.3f}"
    heads = next(t for t in figure(at, "sp_heads")["data"] if t["type"] == "heatmap")
    np.testing.assert_allclose(vals(heads["z"]), np.asarray(want["head_recovered"], dtype=float))
    assert metric(at, "Gap to recover") == f"{want['gap']:.3f}"
    assert any("site_patching(" in c.value for c in at.code)
