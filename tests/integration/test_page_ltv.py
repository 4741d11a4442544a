"""The Learned task vectors page through Streamlit's AppTest, against the in-process service; its figure builders
on hand-made results; and the live loss channel of a running `ltv` job.

It runs on the embedded default model when present (one layer, one short epoch), otherwise on a tiny random Llama
with grouped-query attention saved to a temporary folder. Checks: the page renders before anything runs; Run
trains and shows the comparison table, the training curve and the key-head map drawn with the Head map's heatmap;
a sweep link draws one line per condition and the rotation / stretch curves; a shared link reopens the cached
result without pressing Run (and without retraining).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit.testing.v1")
from streamlit.testing.v1 import AppTest  # noqa: E402
from page_checks import assert_clean, figure  # noqa: E402
from hang import HANG_S  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "app.py")
PAGE = "pages/5_Learned_task_vectors.py"
DEFAULT_PRESENT = (REPO / "models" / "headlens-tiny" / "config.json").is_file()


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    if DEFAULT_PRESENT:
        return {"model": "default", "task": "syn-antonym", "shots": 2, "prompts": 6}
    from tiny_models import GPT2_TOKENIZER, tiny_model

    if not GPT2_TOKENIZER.is_dir():
        pytest.skip("neither the default model nor ../shared/gpt2-tokenizer is present")
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama").save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(GPT2_TOKENIZER)).save_pretrained(folder)
    return {"model": str(folder), "task": "sentiment", "shots": 2, "prompts": 6}


def page(setup: dict, **extra: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=HANG_S)
    for k, v in {"model": setup["model"], "task": setup["task"], "shots": str(setup["shots"]),
                 "prompts": str(setup["prompts"]), "seed": "0", "ltv_epochs": "1", **extra}.items():
        at.query_params[k] = v
    at.switch_page(PAGE)
    at.run()
    assert_clean(at)
    return at


def run_button(at: AppTest, key: str):
    return next(b for b in at.button if b.key == key)


def test_page_trains_compares_and_reopens_from_a_link(inprocess, setup):
    at = page(setup, ltv_layer="1")
    assert any("to train (a few seconds" in i.value for i in at.info)
    run_button(at, "run_ltv").click().run()
    assert_clean(at)
    table = next(df.value for df in at.dataframe if "condition" in df.value.columns)
    assert list(table["condition"])[:2] == ["zero-shot", "ICL (k-shot)"] and "learned task vector" in list(
        table["condition"])
    sal = figure(at, "ltv_saliency")
    assert sal["data"][0]["type"] == "heatmap"  # the Head map's component
    assert figure(at, "ltv_loss")["data"][0]["name"] == "training loss"

    params = {"model": setup["model"], "task": setup["task"], "shots": setup["shots"], "prompts": setup["prompts"],
              "seed": 0, "layer": 1, "positions": [-1], "lr": 0.005, "epochs": 1, "batch_size": 4,
              "units": "residual", "top_pct": 3.0}
    cached = inprocess.cached("ltv", params)
    assert cached is not None and cached["table"]["ltv"]["accuracy"] == pytest.approx(
        table.loc[table["condition"] == "learned task vector", "Accuracy %"].iloc[0] / 100)

    again = page(setup, ltv_layer="1")  # a shared link: shown at once, from the cache
    assert not any("to train (a few seconds" in i.value for i in again.info)
    assert figure(again, "ltv_saliency")


def test_sweep_link_draws_a_line_per_condition_and_the_rotation_curves(inprocess, setup):
    at = page(setup, ltv_mech="key_heads,ov,propagation")  # linear propagation is opt-in
    pills = next(p for p in at.get("button_group") if p.key == "w_ltv_mech")
    assert pills.value == ["key_heads", "ov", "propagation"]
    run_button(at, "run_ltv").click().run()
    assert_clean(at)
    sweep = figure(at, "ltv_sweep")
    names = [t["name"] for t in sweep["data"]]
    assert "learned task vector" in names and "vanilla task vector" in names and len(names) == 8
    assert all(len(t["x"]) == len(sweep["data"][0]["x"]) > 1 for t in sweep["data"])
    rot = figure(at, "ltv_rotation")
    assert [t["name"] for t in rot["data"]] == ["cos(θ, Qθ)", "‖Sθ‖ / ‖θ‖"]
    plain = page(setup)  # the default stages: no linear propagation, so no rotation curves (and no error)
    run_button(plain, "run_ltv").click().run()
    assert_clean(plain)
    assert figure(plain, "ltv_sweep") and not any(c.proto.id.endswith("ltv_rotation")
                                                  for c in plain.get("plotly_chart"))


def test_live_loss_of_a_running_job(inprocess, setup):
    params = {"model": setup["model"], "task": setup["task"], "shots": setup["shots"], "prompts": setup["prompts"],
              "seed": 3, "layer": 0, "epochs": 3, "mechanism": False}
    job_id = inprocess.submit("ltv", params)
    seen = None
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        j = inprocess.job(job_id)
        if j.get("live") and j["live"].get("loss"):
            seen = j["live"]
        if j["status"] not in ("queued", "running"):
            break
        time.sleep(0.05)
    assert j["status"] == "done", j.get("error")
    assert seen is not None and seen["kind"] == "ltv_vector" and seen["layers"] == [0]
    assert 0 < len(seen["loss"]) <= seen["steps"] and all(np.isfinite(seen["loss"]))


# -- figure builders ------------------------------------------------------------------------------------------------
RES = {"layers": [0, 1, 2], "layer": 1, "conditions": ["zero_shot", "icl", "vanilla", "ltv"],
       "sweep": {"zero_shot": {"accuracy": [0.2] * 3, "label_accuracy": [1.0] * 3, "tr_ratio": [0.2] * 3},
                 "icl": {"accuracy": [1.0] * 3, "label_accuracy": [1.0] * 3, "tr_ratio": [1.0] * 3},
                 "vanilla": {"accuracy": [0.1, 0.6, 0.9], "label_accuracy": [1.0] * 3, "tr_ratio": [0.3] * 3},
                 "ltv": {"accuracy": [0.5, 1.0, 1.0], "label_accuracy": [1.0] * 3, "tr_ratio": [1.0] * 3}},
       "rotation": [0.4, 0.8, 0.95], "stretch": [200.0, 3.0, 1.5]}


def test_ltv_figures_from_result_dicts():
    from ui.ltv import figures as lf

    fig = lf.layer_sweep(RES)
    assert [t.name for t in fig.data] == ["zero-shot", "ICL (k-shot)", "vanilla task vector", "learned task vector"]
    assert list(fig.data[3].y) == [50.0, 100.0, 100.0] and list(fig.data[0].x) == [0, 1, 2]  # in %, as every page
    assert fig.data[0].line.width > fig.data[1].line.width > fig.data[3].line.width  # lines on top of each other show
    rs = lf.rotation_stretch(RES)
    assert list(rs.data[0].y) == RES["rotation"] and rs.layout.yaxis2.type == "log"  # 200x vs 1.5x: log scale
    assert rs.layout.yaxis2.dtick == 1  # ticks at powers of ten, not "2, 100, 5, 2, 10"
    loss = lf.loss_curve({"loss": [2.0, 1.0, 0.5, 0.2], "val_accuracy": [0.5, 1.0], "steps": 4, "epochs": 2})
    assert list(loss.data[0].y) == [2.0, 1.0, 0.5, 0.2] and list(loss.data[1].x) == [2.0, 4.0]
    assert list(loss.data[1].y) == [50.0, 100.0] and list(loss.layout.yaxis2.tickvals) == [0, 25, 50, 75, 100]
    sim = lf.similarity({"tasks": ["a", "b", "c"], "similarity": [[1, 0.5, -0.2], [0.5, 1, 0.1], [-0.2, 0.1, 1]],
                         "kinds": {"a": "generation", "b": "classification", "c": "generation"},
                         "label_spaces": {"a": "a | c", "b": "b", "c": "a | c"}})
    assert list(sim.data[0].x) == ["b", "a", "c"] and np.asarray(sim.data[0].z)[1, 2] == pytest.approx(-0.2)
    bars = lf.ablation_bars({"ltv": {"accuracy": 1.0}, "ablated": {"accuracy": 0.4}, "random_accuracy_mean": 0.9,
                             "random_accuracy_std": 0.05, "random": [{"accuracy": 0.85}, {"accuracy": 0.95}]})
    assert list(bars.data[0].y) == [100.0, 40.0, 90.0] and len(bars.data[1].y) == 2
