"""The Head map's issue-19 views through Streamlit's AppTest (in-process service, the default model): the top heads
outlined, the CIE as a sixth map, activation patching beside TR / TL, a second run side by side (with the
comparison's known answers), every head of a layer at once, and the record the page's Share as HTML file is built
from."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("streamlit.testing.v1")
from page_checks import assert_clean, figure, vals  # noqa: E402
from test_pages import HEAD_MAP, MODEL, SMALL, default_task, frame_with, metric, needs_model, page  # noqa: E402,F401


@pytest.fixture(scope="module")
def task_name() -> str:
    return default_task()


BASE = {"model": MODEL, "shots": 4, "prompts": 16, "seed": 0}


def _heat(fig: dict) -> list[dict]:
    return [t for t in fig["data"] if t["type"] == "heatmap"]


def _outlined(fig: dict, name_start: str = "top") -> list[tuple[int, int]]:
    t = next(t for t in fig["data"] if str(t.get("name", "")).startswith(name_start))
    return [(int(y), int(x)) for x, y in zip(vals(t["x"]), vals(t["y"]))]


# -- the comparison's math: known answers ----------------------------------------------------------------------------
def test_a_map_against_itself_differs_by_nothing_and_correlates_perfectly():
    from ui import compare

    rng = np.random.default_rng(0)
    a = rng.normal(size=(4, 8))
    c = compare.compare_maps(a, a, 4)
    assert c["same_shape"] and np.all(c["diff"] == 0) and c["max_abs_diff"] == 0
    assert c["spearman"] == pytest.approx(1.0) and c["kendall"] == pytest.approx(1.0) and c["jaccard"] == 1.0
    r = compare.compare_maps(a, -a, 4)  # reversed ranks
    assert r["spearman"] == pytest.approx(-1.0) and r["kendall"] == pytest.approx(-1.0) and r["jaccard"] == 0.0
    np.testing.assert_allclose(r["diff"], 2 * a)


def test_rank_correlations_match_scipy_with_ties():
    from scipy import stats

    from ui import compare

    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 5, size=(6, 5)).astype(float), rng.normal(size=(6, 5))  # ties in a
    assert compare.spearman(a, b) == pytest.approx(stats.spearmanr(a.ravel(), b.ravel()).statistic)
    assert compare.kendall(a, b) == pytest.approx(stats.kendalltau(a.ravel(), b.ravel()).statistic)
    assert compare.spearman(np.ones((2, 2)), b[:2, :2]) is None


def test_two_models_compare_by_relative_depth():
    from ui import compare

    a = np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])  # layer means 0, 1, 2 at depths 0, 0.5, 1
    b = np.array([[0.0, 0.0, 0.0], [4.0, 4.0, 4.0]])  # 0, 4 at depths 0, 1
    c = compare.compare_maps(a, b, 2)
    assert not c["same_shape"] and c["jaccard"] is None
    np.testing.assert_allclose(c["depth"], [0, 0.5, 1])
    np.testing.assert_allclose(c["profile_a"], [0, 1, 2])
    np.testing.assert_allclose(c["profile_b"], [0, 2, 4])
    np.testing.assert_allclose(c["diff"], [0, -1, -2])
    assert c["spearman"] == pytest.approx(1.0)
    assert compare.compare_maps(a, a, 2)["same_shape"]


# -- the page ----------------------------------------------------------------------------------------------------------
@needs_model
def test_every_head_map_outlines_its_top_heads(inprocess, task_name):
    at = page(HEAD_MAP, task=task_name, **{**SMALL, "model": MODEL})
    at.run()
    assert_clean(at)
    scores = inprocess.run("scores", {**BASE, "task": task_name, "top_pct": 3.0})
    hm = figure(at, "hm_0")
    assert sorted(_outlined(hm)) == sorted(map(tuple, scores["top_tr"])) and len(scores["top_tr"]) == 4
    at.toggle(key="w_all_maps").set_value(True).run()
    five = figure(at, "all_maps")
    tops = [t for t in five["data"] if t.get("legendgroup") == "top"]
    assert len(tops) == 5 and all(len(vals(t["x"])) == scores["top_k"] for t in tops)
    from ui import figures

    tl = [(int(y), int(x)) for x, y in zip(vals(tops[1]["x"]), vals(tops[1]["y"]))]
    assert sorted(tl) == sorted(figures.top_k(np.asarray(scores["tl"]), scores["top_k"]))


@needs_model
def test_the_cie_is_a_sixth_map(inprocess, task_name):
    at = page(HEAD_MAP, task=task_name, map="cie", **{**SMALL, "model": MODEL})
    at.run()
    assert_clean(at)
    want = inprocess.run("patching", {**BASE, "task": task_name, "top_pct": 3.0, "target": "shuffled_inputs",
                                      "patch": "mean"})
    z = vals(_heat(figure(at, "hm_0"))[0]["z"])
    np.testing.assert_allclose(z, want["prob_gain"])
    top = frame_with(at, "cie_rank")
    assert top["cie_rank"].tolist()[:3] == [1, 2, 3]
    assert any("patching(" in c.value or "activation_patching(" in c.value for c in at.code)


@needs_model
def test_patching_section_shows_the_recovered_share_beside_tr_and_tl(inprocess, task_name):
    at = page(HEAD_MAP, task=task_name, **{**SMALL, "model": MODEL})
    at.run()
    assert not any("Press **Run** to patch" in i.value for i in at.info)  # closed: nothing of it drawn
    at.toggle(key="w_pt").set_value(True).run()
    assert any("Press **Run** to patch" in i.value for i in at.info)
    at.button(key="run_patching").click().run()
    assert_clean(at)
    pt = inprocess.run("patching", {**BASE, "task": task_name, "top_pct": 3.0, "target": "zero_shot",
                                    "patch": "paired"})
    heat = _heat(figure(at, "patching_maps"))
    assert len(heat) == 3
    np.testing.assert_allclose(vals(heat[0]["z"]), 100 * np.asarray(pt["recovered"]))  # in %, as the table says
    assert heat[0]["colorbar"]["ticksuffix"] == "%"
    scores = inprocess.run("scores", {**BASE, "task": task_name, "top_pct": 3.0})
    np.testing.assert_allclose(vals(heat[1]["z"]), scores["tr"])
    np.testing.assert_allclose(vals(heat[2]["z"]), scores["tl"])
    assert pt["gap"] > 0 and np.abs(np.asarray(pt["recovered"])).max() > 0  # a real gap, non-trivial shares
    table = frame_with(at, "recovered %")
    assert table["head"].iloc[0] == f"L{pt['top'][0][0]}.H{pt['top'][0][1]}"
    assert table["recovered %"].iloc[0] == pytest.approx(vals(heat[0]["z"]).max())  # the bar's scale is the table's
    assert metric(at, "Gold logit, clean") == f"{pt['clean_logit']:.3g}"
    at.segmented_control(key="w_pt_target").set_value("shuffled_inputs").run()  # another target: waits for Run
    assert_clean(at)
    assert str(at.query_params["pt_target"]).strip("[]'") == "shuffled_inputs"


@needs_model
def test_attribution_patching_beside_the_exact_cie(inprocess, task_name):
    """The AtP section: its map and the exact CIE of the same prompts on one scale, and their agreement."""
    at = page(HEAD_MAP, task=task_name, **{**SMALL, "model": MODEL})
    at.run()
    assert any("by attribution patching" in i.value for i in at.info)
    at.button(key="run_atp").click().run()
    assert_clean(at)
    params = {**BASE, "task": task_name, "top_pct": 3.0, "target": "shuffled_inputs", "patch": "mean"}
    r = inprocess.run("attribution_patching", params)
    exact = inprocess.run("patching", params)
    heat = _heat(figure(at, "atp_maps"))
    assert len(heat) == 2
    np.testing.assert_allclose(vals(heat[0]["z"]), r["atp"])
    np.testing.assert_allclose(vals(heat[1]["z"]), exact["prob_gain"])
    assert metric(at, "Spearman ρ with exact") == f"{r['agreement']['spearman']:.2f}"
    assert any("attribution_patching(" in c.value for c in at.code)


@needs_model
def test_side_by_side_shows_difference_and_rank_correlation(inprocess, task_name):
    from ui import compare

    at = page(HEAD_MAP, task=task_name, cmp="1", cmp_seed="0", **{**SMALL, "model": MODEL})
    at.run()
    assert_clean(at)
    assert any("B is A" in i.value for i in at.info)  # a map against itself: nothing to compare
    at.number_input(key="w_cmp_seed").set_value(1).run()
    at.button(key="run_compare").click().run()
    assert_clean(at)
    a = inprocess.run("scores", {**BASE, "task": task_name, "top_pct": 3.0})
    b = inprocess.run("scores", {**BASE, "task": task_name, "top_pct": 3.0, "seed": 1})
    c = compare.compare_maps(a["tr"], b["tr"], a["top_k"])
    assert metric(at, "Spearman ρ (A, B)") == f"{c['spearman']:.3f}" and metric(at, "Kendall τ (A, B)") == f"{c['kendall']:.3f}"
    heat = _heat(figure(at, "compare_maps"))
    np.testing.assert_allclose(vals(heat[2]["z"]), np.asarray(a["tr"]) - np.asarray(b["tr"]))
    assert heat[0]["zmin"] == heat[1]["zmin"] and heat[0]["zmax"] == heat[1]["zmax"]  # one scale for A and B
    assert str(at.query_params["cmp_seed"]).strip("[]'") == "1"


@needs_model
def test_all_heads_of_the_drilled_heads_layer(inprocess, task_name):
    at = page(HEAD_MAP, task=task_name, head="1.2", grid="1", **{**SMALL, "model": MODEL})
    at.run()
    assert_clean(at)
    want = inprocess.run("head", {**BASE, "task": task_name, "head": [1, 2], "prompt": 0, "logit_lens": False,
                                  "layer_heads": True})
    heat = _heat(figure(at, "hm_drill_grid"))
    assert len(heat) == len(want["layer_attention"]) == 8  # the default model's 8 heads per layer
    for h, t in enumerate(heat):
        np.testing.assert_allclose(vals(t["z"]), want["layer_attention"][h])
    np.testing.assert_allclose(want["layer_attention"][2], want["attention"], atol=5e-5)  # the drilled head's own
    assert "drilled" in json.dumps(figure(at, "hm_drill_grid")["layout"]["annotations"][2])


def test_a_head_request_without_the_grid_keeps_its_cache_key():
    """layer_heads was added to the head kind later: left at its default it is not in the key, so drill-downs
    cached before keep their results."""
    from backend.analysis.kernel import cache_key
    from backend.analysis.kinds import get_kind
    from backend.store.cache import make_key

    spec = get_kind("head")
    p = spec.params.model_validate({"head": [1, 2]})
    version = {"kind_version": spec.version} if spec.version else {}  # head's random control moved it to 1
    from backend.analysis.params import CONVENTIONS  # (prepend_bos: out of the key at its default too)

    old = make_key("head", model=None, task=None, params=p.model_dump(mode="json", exclude={
        "batch_size", "layer_heads", *CONVENTIONS}), **version)
    assert cache_key(spec, None, None, p) == old
    assert cache_key(spec, None, None, spec.params.model_validate({"head": [1, 2], "layer_heads": True})) != old


@needs_model
def test_share_as_html_holds_the_pages_figures_numbers_and_commands(inprocess, task_name):
    from ui import share

    at = page(HEAD_MAP, task=task_name, **{**SMALL, "model": MODEL})
    at.run()
    assert_clean(at)
    rec = at.session_state["_hl_share"]
    charts = at.get("plotly_chart")
    assert rec.page == "Head map" and {"hm_0", "layer_dist"} <= set(rec.figures) and len(rec.figures) == len(charts)
    assert rec.jobs[0][0] == "head_scores" and rec.settings["task"] == task_name  # (and what else the page showed)
    assert {"Accuracy", "Overlap between rankings"} <= set(rec.tables)
    text = share.build(rec)
    assert f"python -m backend head-scores --model {MODEL} --task {task_name} --shots 4 --prompts 16 --seed 0 " \
           f"--top-pct 3.0" in text
    assert all(f"python -m backend {kind.replace('_', '-')} " in text for kind, _ in rec.jobs)
    assert text.count('class="hl-figure"') == len(charts) and "Overlap between rankings" in text
    assert "headlens_default_" in text and "_4shot_top3pct_headmap-tr" in text  # figure file names


@needs_model
def test_the_map_carries_its_uncertainty_and_tests(inprocess, task_name):
    """TR's hover holds each head's SE, interval, p and q; the stable top heads are outlined; the switch leaves the
    heads that are not significant blank; the table holds the SE and q."""
    at = page(HEAD_MAP, task=task_name, **{**SMALL, "model": MODEL})
    at.run()
    assert_clean(at)
    scores = inprocess.run("scores", {**BASE, "task": task_name, "top_pct": 3.0})
    st = scores["stats"]["tr"]
    hm = figure(at, "hm_0")
    heads = next(t for t in hm["data"] if t.get("name") == "heads")
    first = heads["customdata"][0][2]
    assert f"SE {st['se'][0][0]:.3g}" in first and f"q = {st['q'][0][0]:.3g}" in first and "CI [" in first
    assert "%{customdata[2]}" in heads["hovertemplate"]
    if scores["stable_tr"]:
        assert sorted(_outlined(hm, "stable")) == sorted(map(tuple, scores["stable_tr"]))
    sig = {tuple(x) for x in st["significant"]}
    assert 0 < len(sig) < scores["n_layers"] * scores["n_heads"], "a test case that shows the switch's effect"
    at.toggle(key="w_sig_only").set_value(True).run()
    assert_clean(at)
    z = vals(_heat(figure(at, "hm_0"))[0]["z"])
    for l in range(scores["n_layers"]):
        for h in range(scores["n_heads"]):
            assert np.isnan(z[l][h]) != ((l, h) in sig)
    table = frame_with(at, "tr_se")
    assert "tr_q" in table.columns


@needs_model
def test_a_link_with_the_significance_switch_reopens_with_it_on(inprocess, task_name):
    """`sig_only=1` in a link: the switch is on, the map blank off the significant heads, the link and the page's
    HTML file keep it, and the file's table holds TR's SE, interval, p and q."""
    from ui import share, state

    at = page(HEAD_MAP, task=task_name, sig_only="1", **{**SMALL, "model": MODEL})
    at.run()
    assert_clean(at)
    assert at.toggle(key="w_sig_only").value is True and at.session_state["s_sig_only"] is True
    scores = inprocess.run("scores", {**BASE, "task": task_name, "top_pct": 3.0})
    sig = {tuple(x) for x in scores["stats"]["tr"]["significant"]}
    z = vals(_heat(figure(at, "hm_0"))[0]["z"])
    assert {(l, h) for l in range(len(z)) for h in range(len(z[l])) if not np.isnan(z[l][h])} == sig
    assert state.FIELDS["sig_only"].view and at.query_params["sig_only"] in ("1", ["1"])
    code = [c.value for c in at.code if "r.stats['tr']" in c.value]  # Copy as Python names the heads shown
    assert code and "r.stats['tr'].significant   # the heads shown (Significant heads only)" in code[0]
    rec = at.session_state["_hl_share"]
    assert rec.settings["sig_only"] == "1"
    text = share.build(rec)
    assert "<td>significant heads only</td><td>1</td>" in text
    table = next(t for title, t in rec.tables.items() if title.startswith("Top 10 heads by TR"))
    assert ["tr_se", "tr_ci_low", "tr_ci_high", "tr_p", "tr_q", "tr_stability"] == \
        [c for c in table["columns"] if c.startswith("tr_") and c != "tr_rank"]
    assert all(f"<th>{c}</th>" in text for c in ("tr_se", "tr_ci_low", "tr_ci_high", "tr_p", "tr_q"))
    at.toggle(key="w_sig_only").set_value(False).run()  # off: out of the link, "0" in the file
    assert "sig_only" not in at.query_params and at.session_state["s_sig_only"] is False
    assert share.page_settings("Head map", at.session_state["_hl_share"].settings)["significant heads only"] == "0"
