"""The Steering & geometry page through Streamlit's AppTest, against the in-process service.

It runs on the embedded default model when models/headlens-tiny exists, and otherwise on a tiny random-weight
Llama with grouped-query attention (GPT-2 tokenizer) saved to a temporary folder and named in the URL, so it
runs either way. It checks: the page renders with no exception before anything runs; the steering bars carry
the numbers of the `steer` job; a layer scan draws one line per vector over every layer; the geometry curves
show the five conditions (mean and spread) and the PCA charts exist in 2D and 3D, with arrows and label
directions; the perturbation panel lists every perturbation, skipped ones with their reason, with difference
maps centred at 0. The figure builders are also checked on hand-made result dicts.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit.testing.v1")
from streamlit.testing.v1 import AppTest  # noqa: E402
from page_checks import assert_clean, figure, vals  # noqa: E402
from hang import HANG_S  # noqa: E402

from ui.tsla.steering_figures import MAX_DIRECTIONS  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "app.py")
PAGE = "pages/3_Steering_geometry.py"
DEFAULT_PRESENT = (REPO / "models" / "headlens-tiny" / "config.json").is_file()
CONDITIONS = ["zero_shot", "zero_shot+tr", "zero_shot+tl", "zero_shot+random", "icl"]
PERTURBATIONS = ["shuffled_inputs", "random_labels", "flipped_labels", "symbol_labels", "number_labels"]


# -- fixtures ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    """Model, tasks and small sizes: the default model and its tasks, or a tiny random Llama on built-in ones."""
    if DEFAULT_PRESENT:
        from backend.tasks.registry import builtin_tasks

        tasks = builtin_tasks()
        cls = next(n for n, t in tasks.items() if t.models == "default" and t.kind == "classification")
        gen = next(n for n, t in tasks.items() if t.models == "default" and t.kind == "generation")
        return {"model": "default", "task": cls, "gen_task": gen, "shots": 4, "prompts": 8}
    from tiny_models import GPT2_TOKENIZER, tiny_model

    if not GPT2_TOKENIZER.is_dir():
        pytest.skip("neither the default model nor ../shared/gpt2-tokenizer is present")
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama").save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(GPT2_TOKENIZER)).save_pretrained(folder)
    return {"model": str(folder), "task": "sentiment", "gen_task": "antonym", "shots": 2, "prompts": 6}


# -- helpers -----------------------------------------------------------------------------------------------------
def page(**query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=HANG_S)
    for k, v in query.items():
        at.query_params[k] = v
    at.switch_page(PAGE)
    return at


def open_page(setup: dict, task: str | None = None, **extra: str) -> AppTest:
    at = page(model=setup["model"], task=task or setup["task"], shots=str(setup["shots"]),
              prompts=str(setup["prompts"]), seed="0", **extra)
    at.run()
    assert_clean(at)
    return at


def base_params(setup: dict, task: str | None = None) -> dict:
    return {"model": setup["model"], "task": task or setup["task"], "shots": setup["shots"],
            "prompts": setup["prompts"], "seed": 0}


def frame_with(at: AppTest, column: str):
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with a {column!r} column")


def model_shape(api, setup: dict) -> tuple[int, int]:
    info = api.run("model_info", {"model": setup["model"]})
    return int(info["n_layers"]), int(info["n_heads"])


# -- pure figure builders ----------------------------------------------------------------------------------------
STEER = {"layers": [0, 1, 2], "alpha": 2.0, "zero_shot": {"accuracy": 0.25, "label_accuracy": 0.9, "tr_ratio": 0.5},
         "icl": {"accuracy": 0.75, "label_accuracy": 1.0, "tr_ratio": 1.0},
         "vectors": {"tr": {"accuracy": [0.3, 0.4, 0.5], "label_accuracy": [0.9, 0.9, 1.0],
                            "tr_ratio": [0.6, 0.7, 0.8], "heads": [[1, 0]], "norm": [2.0, 2.0, 2.0]},
                     "vanilla": {"accuracy": [0.1, 0.2, 0.9], "label_accuracy": [0.5, 0.6, 0.7],
                                 "tr_ratio": [0.1, 0.2, 0.3], "heads": [], "norm": [1.0, 1.5, 3.0]}}}


def test_steer_figures_carry_the_result_numbers():
    from ui.tsla import steering_figures as sf

    fig = sf.steer_bars(STEER, ["vanilla", "tr"], layer_index=2)
    acc, label, ratio = fig.data
    assert list(acc.x) == ["zero-shot", "ICL", "vanilla task vector", "TR vector"]  # in the asked order
    assert np.allclose(acc.y, [25, 75, 90, 50]) and np.allclose(ratio.y, [50, 100, 30, 80])
    assert np.allclose(label.y, [90, 100, 70, 100])
    rows = sf.steer_rows(STEER, ["tr"], 1)
    assert rows[-1]["layer"] == 1 and rows[-1]["norm"] == 2.0 and rows[-1]["heads"] == [[1, 0]]
    sweep = sf.steer_sweep(STEER)
    tr_lines = [t for t in sweep.data if t.name == "TR vector"]
    assert len(tr_lines) == 3 and np.allclose(tr_lines[0].y, [30, 40, 50]) and np.allclose(tr_lines[2].y, [60, 70, 80])
    icl = [t for t in sweep.data if t.name == "ICL"]
    assert np.allclose(icl[0].y, [75, 75, 75])  # a flat reference line over every layer
    assert sweep.data[-1].name == "ICL"  # reference lines are drawn on top
    lines = [t for t in sweep.data if t.xaxis == "x"]
    assert len({(t.line.dash, t.marker.symbol if t.mode != "lines" else None) for t in lines}) == len(lines)


def test_geometry_and_pca_figures():
    from ui.tsla import steering_figures as sf

    rng = np.random.default_rng(0)
    conds = {c: {m: {"mean": list(rng.normal(size=4)), "std": list(rng.random(4))}
                 for m in ("alignment", "ld", "rotation")} for c in CONDITIONS}
    pts = {c: rng.normal(size=(5, 3)).tolist() for c in CONDITIONS}
    geo = {"layers": [0, 1, 2, 3], "inject_layer": 2, "alpha": 1.0, "conditions": conds,
           "pca": {"points": pts, "gold": ["a", "b", "a", "b", "a"], "layer": 3,
                   "label_directions": {"a": [1.0, 0.0, 0.0], "b": [0.0, 1.0, 0.5]},
                   "explained_variance_ratio": [0.5, 0.3, 0.1]}}
    fig = sf.geometry_curves(geo)
    means = [t for t in fig.data if t.fill != "toself"]
    bands = [t for t in fig.data if t.fill == "toself"]
    assert len(means) == len(bands) == 15  # 5 conditions x 3 metrics
    assert {t.name for t in means} == {sf.CONDITION_STYLE[c]["name"] for c in CONDITIONS}
    zs_align = next(t for t in means if t.name == "zero-shot" and t.xaxis == "x")
    assert np.allclose(zs_align.y, conds["zero_shot"]["alignment"]["mean"])
    band = bands[0]  # mean + sd going up the layers, mean - sd coming back
    m, s = np.asarray(conds["zero_shot"]["alignment"]["mean"]), np.asarray(conds["zero_shot"]["alignment"]["std"])
    # clipped to the metric's range (alignment is a share, 0..1), drawn as lines (no stray markers)
    assert np.allclose(band.y, list(np.clip(m + s, 0, 1)) + list(np.clip(m - s, 0, 1)[::-1])) and band.mode == "lines"
    ld_band = next(t for t in bands if t.xaxis == "x2")  # the logit difference is unbounded: not clipped
    m2, s2 = np.asarray(conds["zero_shot"]["ld"]["mean"]), np.asarray(conds["zero_shot"]["ld"]["std"])
    assert np.allclose(ld_band.y, list(m2 + s2) + list((m2 - s2)[::-1]))

    two = sf.pca_scatter(geo, 2, "condition", arrows=True)
    points = [t for t in two.data if t.mode == "markers"]
    assert len(points) == 5 and all(len(t.x) == 5 for t in points)
    assert len(two.layout.annotations) == 3 * 5  # an arrow per prompt for each steered condition
    ann = two.layout.annotations[0]  # from the zero-shot point to the TR-steered one
    assert (ann.ax, ann.ay) == tuple(pts["zero_shot"][0][:2]) and (ann.x, ann.y) == tuple(pts["zero_shot+tr"][0][:2])
    dirs = [t for t in two.data if t.name and t.name.startswith("label ")]
    assert len(dirs) == 2 and list(dirs[0].x) == [0.0, 1.0]
    assert dirs[0].line.color != dirs[1].line.color  # each label direction its own colour
    assert [t.name for t in points][-2:] == ["zero-shot", "ICL"]  # the references on top of the steered clouds
    by_gold = sf.pca_scatter(geo, 2, "gold")
    assert len([t for t in by_gold.data if t.mode == "markers"]) == 10  # conditions x gold labels
    many = [f"w{i}" for i in range(15)] + ["w0", "w0", "w1"]  # a generation task: many gold words
    groups, colors = sf.gold_groups(many)
    assert len(colors) == sf.MAX_GOLD_GROUPS + 1 and groups[:2] == ["w0", "w1"]
    assert groups[9] == sf.OTHER  # w9: among the rarest
    three = sf.pca_scatter(geo, 3, "condition", arrows=True)
    assert {t.type for t in three.data} == {"scatter3d"}
    assert len([t for t in three.data if t.mode == "markers"]) == 5
    assert three.layout.scene.zaxis.title.text.startswith("PC3")


def test_perturbation_figures():
    from ui.tsla import steering_figures as sf

    base_tr, base_tl = [[0.1, 0.2], [0.3, 0.4]], [[0.0, -0.1], [0.2, 0.1]]
    def mt(acc, ratio, label=1.0):
        return {"accuracy": acc, "label_accuracy": label, "tr_ratio": ratio, "n": 10}

    abl = {"none": mt(0.8, 0.9), "tr": mt(0.5, 0.4), "tl": mt(0.6, 0.9), "random": mt(0.8, 0.9)}
    rep = {"top_k": 1, "heads": {"tr": [[1, 1]], "tl": [[1, 0]], "random": [[0, 0]]}, "shots": 4, "prompts": 10,
           "perturbations": {
               "none": {"icl": mt(0.8, 0.9), "tr": base_tr, "tl": base_tl, "ablation": abl},
               "shuffled_inputs": {"icl": mt(0.4, 0.85), "tr": [[0.1, 0.3], [0.3, 0.2]],
                                   "tl": [[0.0, 0.1], [0.0, 0.1]], "tr_diff": [[0.0, 0.1], [0.0, -0.2]],
                                   "tl_diff": [[0.0, 0.2], [-0.2, 0.0]], "ablation": abl},
               "flipped_labels": {"skipped": "flipped labels need a binary task"}}}
    from ui.tsla import perturbation_figures as pf

    rows, skipped = pf.perturbation_table(rep)
    assert [r["key"] for r in rows] == ["none", "shuffled_inputs"]
    assert skipped == [("flipped_labels", "flipped labels need a binary task")]
    assert rows[1]["d_accuracy_tr"] == pytest.approx(-0.3) and rows[1]["d_tr_ratio_tl"] == pytest.approx(0.0)
    bars = pf.perturbation_bars(rep)
    assert list(bars.data[0].x) == ["unperturbed", "shuffled inputs"] and np.allclose(bars.data[0].y, [80, 40])
    assert pf.ablation_changes(rep) == {"accuracy": pytest.approx(0.3), "tr_ratio": pytest.approx(0.5)}
    flat = {**rep, "perturbations": {k: ({**v, "ablation": {s: abl["none"] for s in abl}} if "ablation" in v else v)
                                     for k, v in rep["perturbations"].items()}}
    assert pf.ablation_changes(flat) == {"accuracy": 0.0, "tr_ratio": 0.0}  # the page then says every change is 0
    eff = pf.ablation_effects(rep)
    tr_acc = next(t for t in eff.data if t.name == "top TR ablated" and t.xaxis == "x")
    assert np.allclose(tr_acc.y, [-30, -30])
    maps = pf.map_differences(rep, "shuffled_inputs")
    assert len(maps.data) == 6 and all(t.type == "heatmap" for t in maps.data)
    diffs = [t for t in maps.data if "difference" in t.name]
    assert len(diffs) == 2 and all(t.zmid == 0 and t.zmin == -t.zmax for t in diffs)
    assert np.allclose(diffs[0].z, [[0.0, 0.1], [0.0, -0.2]])
    tr_row = [t for t in maps.data if t.name.startswith("TR ") and "difference" not in t.name]
    assert tr_row[0].zmin == tr_row[1].zmin and tr_row[0].zmax == tr_row[1].zmax  # one scale for the pair


# -- the page ------------------------------------------------------------------------------------------------------
def test_unreachable_backend_is_an_error_not_a_traceback(monkeypatch):
    from ui import api

    monkeypatch.setenv("HEADLENS_BACKEND_URL", "http://127.0.0.1:9")
    api.reset_clients()
    at = page(task="sentiment")
    at.run()
    assert not at.exception
    assert at.error and "unreachable" in at.error[0].value.lower()
    api.reset_clients()


def test_page_renders_and_waits_for_run(inprocess, setup):
    at = open_page(setup)
    L, _ = model_shape(inprocess, setup)
    assert at.multiselect(key="w_sg_vectors").value == ["tr", "tl", "random", "fv", "vanilla"]
    assert at.selectbox(key="w_sg_layer").value == L // 2  # the middle layer by default
    assert at.number_input(key="w_sg_alpha").value == 1.0
    assert sum("Press **Run**" in i.value for i in at.info) == 3  # nothing computed before Run
    assert not at.get("plotly_chart")
    assert {"run_steer", "run_geometry", "run_perturb"} <= {b.key for b in at.button}


def test_steering_bars_show_the_job_numbers(inprocess, setup):
    at = open_page(setup, heads="0.0,1.1", sg_vectors="tr,tl,random,fv,vanilla,custom")
    L, _ = model_shape(inprocess, setup)
    assert "custom" in at.multiselect(key="w_sg_vectors").value  # the selected heads join as a vector
    at.button(key="run_steer").click().run()
    assert_clean(at)
    want = inprocess.run("steer", {**base_params(setup), "vectors": ["tr", "tl", "random", "fv", "vanilla"],
                                   "layer": L // 2, "alpha": 1.0, "heads": [[0, 0], [1, 1]]})
    order = ["zero_shot", "icl", "tr", "tl", "random", "fv", "vanilla", "custom"]
    acc = [want[r]["accuracy"] for r in order[:2]] + [want["vectors"][v]["accuracy"][0] for v in order[2:]]
    ratio = [want[r]["tr_ratio"] for r in order[:2]] + [want["vectors"][v]["tr_ratio"][0] for v in order[2:]]
    label = [want[r]["label_accuracy"] for r in order[:2]] + [want["vectors"][v]["label_accuracy"][0]
                                                               for v in order[2:]]
    bars = figure(at, "steer_bars")["data"]
    assert bars[0]["x"] == ["zero-shot", "ICL", "TR vector", "TL vector", "random-heads vector", "function vector",
                            "vanilla task vector", "selected heads"]
    assert np.allclose(vals(bars[0]["y"]), 100 * np.asarray(acc))
    assert np.allclose(vals(bars[1]["y"]), 100 * np.asarray(label))
    assert np.allclose(vals(bars[2]["y"]), 100 * np.asarray(ratio))
    table = frame_with(at, "‖v‖")
    assert np.allclose(table["Accuracy %"], 100 * np.asarray(acc))
    # zero-shot and ICL have no layer or norm: shown as "—", not "None"
    el = next(d for d in at.dataframe if "‖v‖" in d.value.columns)
    assert el.proto.placeholder == "—" and table["layer"].iloc[:2].isna().all()
    assert table["heads"].iloc[-1] == "L0.H0, L1.H1"
    assert want["vectors"]["custom"]["heads"] == [[0, 0], [1, 1]]

    at.multiselect(key="w_sg_vectors").set_value(["tl"]).run()  # fewer vectors: fewer bars
    assert_clean(at)
    assert figure(at, "steer_bars")["data"][0]["x"] == ["zero-shot", "ICL", "TL vector"]
    at.multiselect(key="w_sg_vectors").set_value(["custom"]).run()  # the selected heads alone
    assert_clean(at)
    bars = figure(at, "steer_bars")["data"][0]
    assert bars["x"] == ["zero-shot", "ICL", "selected heads"]
    assert np.isclose(vals(bars["y"])[2], 100 * want["vectors"]["custom"]["accuracy"][0])


def test_layer_sweep_draws_lines_over_every_layer(inprocess, setup):
    at = open_page(setup)
    L, _ = model_shape(inprocess, setup)
    at.multiselect(key="w_sg_vectors").set_value(["tr", "random"]).run()
    at.selectbox(key="w_sg_layer").set_value("all").run()
    at.button(key="run_steer").click().run()
    assert_clean(at)
    want = inprocess.run("steer", {**base_params(setup), "vectors": ["tr", "random"], "layer": "all", "alpha": 1.0})
    assert want["layers"] == list(range(L))
    lines = {(t["name"], t["xaxis"]): t for t in figure(at, "steer_sweep")["data"]}
    tr = lines[("TR vector", "x")]
    assert list(vals(tr["x"])) == list(range(L))
    assert np.allclose(vals(tr["y"]), 100 * np.asarray(want["vectors"]["tr"]["accuracy"]))
    rnd_ratio = vals(lines[("random-heads vector", "x3")]["y"])
    assert np.allclose(rnd_ratio, 100 * np.asarray(want["vectors"]["random"]["tr_ratio"]))
    # the bars show one layer of the sweep, picked on a slider
    slider = at.select_slider(key="w_sg_bar_layer")
    slider.set_value(0).run()
    assert_clean(at)
    bars = figure(at, "steer_bars")["data"][0]
    assert np.isclose(vals(bars["y"])[2], 100 * want["vectors"]["tr"]["accuracy"][0])


def test_geometry_curves_and_pca(inprocess, setup):
    at = open_page(setup)
    L, _ = model_shape(inprocess, setup)
    at.button(key="run_geometry").click().run()
    assert_clean(at)
    want = inprocess.run("geometry", {**base_params(setup), "layer": L // 2, "alpha": 1.0, "pca_layer": L - 1,
                                      "final_norm": True})  # the page's default: the logit difference in logits
    curves = figure(at, "geometry_curves")["data"]
    means = [t for t in curves if t.get("fill") != "toself"]
    names = {"zero-shot": "zero_shot", "zero-shot + TR": "zero_shot+tr", "zero-shot + TL": "zero_shot+tl",
             "zero-shot + random": "zero_shot+random", "ICL": "icl"}
    assert {t["name"] for t in means} == set(names) and len(means) == 15  # five conditions x three metrics
    for t in means:
        metric = {"x": "alignment", "x2": "ld", "x3": "rotation"}[t["xaxis"]]
        assert list(vals(t["x"])) == list(range(L))
        assert np.allclose(vals(t["y"]), want["conditions"][names[t["name"]]][metric]["mean"])
    assert sum(t.get("fill") == "toself" for t in curves) == 15  # a spread band for each

    two, three = figure(at, "pca_2d"), figure(at, "pca_3d")
    n = setup["prompts"]
    pts2 = [t for t in two["data"] if t.get("mode") == "markers"]
    assert len(pts2) == 5 and all(len(vals(t["x"])) == n for t in pts2)
    zs = next(t for t in pts2 if t["name"] == "zero-shot")
    assert np.allclose(vals(zs["x"]), [p[0] for p in want["pca"]["points"]["zero_shot"]])
    assert {t["type"] for t in three["data"]} == {"scatter3d"}
    labels = [t for t in two["data"] if str(t.get("name", "")).startswith("label ")]
    assert len(labels) == min(MAX_DIRECTIONS, len(want["pca"]["label_directions"])) > 0

    at.toggle(key="w_sg_arrows").set_value(True).run()  # arrows zero-shot -> steered
    assert_clean(at)
    assert len(figure(at, "pca_2d")["layout"]["annotations"]) == 3 * n
    at.segmented_control(key="w_sg_color").set_value("gold").run()
    assert_clean(at)
    golds = {str(g) for g in want["pca"]["gold"]}
    assert len([t for t in figure(at, "pca_2d")["data"] if t.get("mode") == "markers"]) == 5 * len(golds)


def test_perturbation_panel_lists_every_perturbation(inprocess, setup):
    at = open_page(setup)
    want = inprocess.run("perturb", {**base_params(setup), "perturbations": PERTURBATIONS})
    runnable = [p for p in PERTURBATIONS if not want["perturbations"][p].get("skipped")]
    assert at.multiselect(key="w_sg_perturbations").value == runnable  # preselected: only what can run here
    at.multiselect(key="w_sg_perturbations").set_value(PERTURBATIONS).run()
    assert str(at.query_params["sg_perturbations"]).strip("[]'") == ",".join(PERTURBATIONS)
    at.button(key="run_perturb").click().run()
    assert_clean(at)
    table = frame_with(at, "ICL accuracy %")
    listed = table["perturbation"].tolist()
    from ui.tsla.steering_figures import perturbation_name

    for p in PERTURBATIONS:
        r = want["perturbations"][p]
        if r.get("skipped"):
            assert f"{perturbation_name(p)} (skipped)" in listed
            assert any(r["skipped"] in w.value for w in at.warning)
        else:
            row = table[table["perturbation"] == perturbation_name(p)]
            assert len(row) == 1 and np.isclose(row["ICL accuracy %"].iloc[0], 100 * r["icl"]["accuracy"])
            assert np.isclose(row["TR-ablated acc. %"].iloc[0], 100 * r["ablation"]["tr"]["accuracy"])
    assert listed[0] == "unperturbed"
    assert figure(at, "perturb_bars")["data"][0]["x"][0] == "unperturbed"
    assert len(figure(at, "perturb_ablation")["data"]) == 6  # TR, TL, random x (accuracy, TR ratio)
    maps = figure(at, "perturb_maps")["data"]
    assert len(maps) == 6 and all(t["type"] == "heatmap" for t in maps)
    diff = [t for t in maps if "difference" in t["name"]]
    first = next(p for p in PERTURBATIONS if not want["perturbations"][p].get("skipped"))
    assert all(t.get("zmid") == 0 for t in diff)
    assert np.allclose(vals(diff[0]["z"]), want["perturbations"][first]["tr_diff"])


def test_perturbations_that_do_not_apply_show_their_reason(inprocess, setup):
    """On a generation task, flipped, symbol and number labels do not apply: each says why."""
    at = open_page(setup, task=setup["gen_task"])
    at.multiselect(key="w_sg_perturbations").set_value(["shuffled_inputs", "flipped_labels", "number_labels"]).run()
    at.button(key="run_perturb").click().run()
    assert_clean(at)
    warned = [w.value for w in at.warning]
    for name in ("flipped labels", "number labels"):
        assert any(name in w and "skipped" in w and "classification" in w for w in warned), warned
    listed = frame_with(at, "ICL accuracy %")["perturbation"].tolist()
    assert listed == ["unperturbed", "shuffled inputs", "flipped labels (skipped)", "number labels (skipped)"]


def test_a_steering_link_reopens_every_setting_and_its_cached_result(inprocess, setup):
    """Every setting is in the URL; a fresh session opened from it shows the same settings, and what the service
    has cached shows without pressing Run (only uncached work waits)."""
    at = open_page(setup)
    L, _ = model_shape(inprocess, setup)
    at.multiselect(key="w_sg_vectors").set_value(["tl", "random"]).run()
    at.selectbox(key="w_sg_layer").set_value(L - 1).run()
    at.number_input(key="w_sg_alpha").set_value(2.5).run()
    at.toggle(key="w_sg_final_norm").set_value(False).run()  # on by default (the logit difference in logits)
    at.selectbox(key="w_sg_pca_layer").set_value(0).run()
    at.multiselect(key="w_sg_perturbations").set_value(["shuffled_inputs"]).run()
    at.button(key="run_steer").click().run()
    assert_clean(at)
    first = figure(at, "steer_bars")["data"][0]
    link = {k: str(v).strip("[]'") for k, v in at.query_params.items()}
    assert link["sg_vectors"] == "tl,random" and link["sg_layer"] == str(L - 1) and link["sg_alpha"] == "2.5"
    assert link["sg_final_norm"] == "0" and link["sg_pca_layer"] == "0" and link["sg_perturbations"] == "shuffled_inputs"

    fresh = page(**link)  # a colleague opens the link
    fresh.run()
    assert_clean(fresh)
    assert fresh.multiselect(key="w_sg_vectors").value == ["tl", "random"]
    assert fresh.selectbox(key="w_sg_layer").value == L - 1 and fresh.number_input(key="w_sg_alpha").value == 2.5
    assert fresh.toggle(key="w_sg_final_norm").value is False and fresh.selectbox(key="w_sg_pca_layer").value == 0
    assert fresh.multiselect(key="w_sg_perturbations").value == ["shuffled_inputs"]
    again = figure(fresh, "steer_bars")["data"][0]  # shown without a click: the service had it cached
    assert again["x"] == first["x"] and np.allclose(vals(again["y"]), vals(first["y"]))
    assert sum("Press **Run**" in i.value for i in fresh.info) == 2  # geometry and perturbations: not computed
