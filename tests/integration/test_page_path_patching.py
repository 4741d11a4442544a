"""The Head map's path-patching section (kind `path_patching`): Streamlit's AppTest of the page, the in-process
service, the default model. Closed, it draws nothing; open, before Run it computes nothing; after Run its q / k / v
maps show the service's effects of the first top TL head into the later top TL heads' queries, keys and values, the
hover their 95% intervals, and its Copy as Python names `path_patching`."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("streamlit.testing.v1")
from page_checks import assert_clean, figure, vals  # noqa: E402
from test_pages import HEAD_MAP, MODEL, SMALL, needs_model, page, task_name  # noqa: E402,F401


@needs_model
def test_head_map_path_patching_section(inprocess, task_name):  # noqa: F811 - the fixture of test_pages
    at = page(HEAD_MAP, model=MODEL, task=task_name, **SMALL)
    at.run()
    assert_clean(at)
    assert not [t for t in at.toggle if t.key == "w_pp" and t.value]  # closed by default
    assert not any("sender's paths" in i.value for i in at.info)
    at.toggle(key="w_pp").set_value(True).run()
    assert_clean(at)
    base = {"model": MODEL, "task": task_name, "shots": 4, "prompts": 16, "seed": 0}
    scores = inprocess.run("head_scores", base)
    top_tl = [tuple(h) for h in scores["top_tl"]]
    sender = next(h for h in top_tl if any(l > h[0] for l, _ in top_tl))  # a top TL head with one after it
    at.selectbox(key="w_pp_sender").set_value(sender).run()
    assert any("sender's paths" in i.value for i in at.info)  # nothing computed before Run
    assert not [el for el in at.get("plotly_chart") if el.proto.id.endswith("pp_q")]
    at.button(key="run_path_patching").click().run()
    assert_clean(at)
    receivers = [f"{l}.{h}.{c}" for l, h in top_tl if l > sender[0] for c in ("q", "k", "v")]
    want = inprocess.run("path_patching", {**base, "sender": list(sender), "receivers": receivers,
                                           "target": "zero_shot", "freeze": "heads"})
    q = next(t for t in figure(at, "pp_q")["data"] if t["type"] == "heatmap")
    np.testing.assert_allclose(vals(q["z"]), np.asarray(want["q"]["mean"], dtype=float))
    l, h = next((l, h) for l, h in top_tl if l > sender[0])
    m = want["q"]["mean"][l][h]
    assert q["customdata"][l][h] == f"{m:.4f} [{want['q']['ci_low'][l][h]:.4f}, {want['q']['ci_high'][l][h]:.4f}]"
    assert any("path_patching(" in c.value for c in at.code)
