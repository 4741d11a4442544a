"""The Soft head selection page through Streamlit's AppTest, against the in-process service, and its figures.

The page runs on the embedded default model (or, without it, a tiny random Llama with grouped-query attention saved
to a folder) with small settings from the URL. Checked: nothing runs before Run; after Run the α map carries the
result's alphas and is selectable like the Head map; the comparison table, patching and budget curves show the
job's numbers; a second session opened from the same link shows the cached result without pressing Run; the
transfer and all-methods sections run. The figure builders are also checked on hand-made results.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit.testing.v1")
from streamlit.testing.v1 import AppTest  # noqa: E402
from page_checks import assert_clean, figure, vals  # noqa: E402
from hang import HANG_S, wait_until  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "app.py")
PAGE = "pages/6_Soft_head_selection.py"
DEFAULT_PRESENT = (REPO / "models" / "headlens-tiny" / "config.json").is_file()
SMALL = {"site_m": "4", "site_shots": "2", "site_steps": "6", "prompts": "6", "seed": "0", "shots": "2"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    if DEFAULT_PRESENT:
        return {"model": "default", "task": "syn-sentiment"}
    from tiny_models import GPT2_TOKENIZER, tiny_model

    if not GPT2_TOKENIZER.is_dir():
        pytest.skip("neither the default model nor ../shared/gpt2-tokenizer is present")
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama").save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(GPT2_TOKENIZER)).save_pretrained(folder)
    return {"model": str(folder), "task": "sentiment"}


def page(setup: dict) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=HANG_S)
    for k, v in {"model": setup["model"], "task": setup["task"], **SMALL}.items():
        at.query_params[k] = v
    at.switch_page(PAGE)
    at.run()
    assert_clean(at)
    return at


def site_params(setup: dict) -> dict:
    return {"model": setup["model"], "task": setup["task"], "m": 4, "shots": 2, "steps": 6, "prompts": 6, "seed": 0}


def test_page_trains_and_shows_the_result(inprocess, setup):
    at = page(setup)
    assert not at.get("plotly_chart")  # nothing computed before Run
    assert any("Press **Run** to train the α" in i.value for i in at.info)
    at.button(key="run_site").click().run()
    assert_clean(at)
    res = inprocess.run("site", site_params(setup))  # the same job (answered by the finished one, or the cache)
    amap = figure(at, "site_alpha_0")
    assert np.allclose(vals(amap["data"][0]["z"]), np.asarray(res["alpha"]), atol=1e-9)
    assert amap["data"][0]["zmin"] == 0 and amap["data"][0]["zmax"] == 1
    assert "α =" in amap["data"][1]["hovertemplate"]
    table = next(df.value for df in at.dataframe if "exact match %" in df.value.columns)
    site_row = table[table["method"] == "SITE"].iloc[0]
    assert site_row["accuracy %"] == pytest.approx(100 * res["site"]["accuracy"])
    assert site_row["trained"] == res["params_count"]["site"]
    assert "0-shot" in set(table["method"]) and any(str(m).endswith("-shot ICL") for m in table["method"])
    patch = figure(at, "site_patching")
    assert np.allclose(vals(patch["data"][0]["y"]), 100 * np.asarray(res["patching"]["top"]["accuracy"]))
    budget = figure(at, "site_budget")
    assert list(vals(budget["data"][0]["x"])) == res["budget"]["m"]

    # a second session from the same link: the cached result, without Run
    again = page(setup)
    assert np.allclose(vals(figure(again, "site_alpha_0")["data"][0]["z"]), np.asarray(res["alpha"]), atol=1e-9)

    # the transfer matrix and every method: each waits for its Run button
    hints = [i.value for i in again.info]
    assert any("Press **Run** to build the transfer matrix" in h for h in hints), hints
    assert any("Press **Run** to compare every method" in h for h in hints), hints
    assert not [el for el in again.get("plotly_chart") if el.proto.id.endswith(("site_transfer", "site_methods_bars"))]
    again.button(key="run_methods").click().run()
    assert_clean(again)
    again.button(key="run_transfer").click().run()
    assert_clean(again)
    tr = figure(again, "site_transfer")
    n = len(tr["data"][0]["x"])
    assert n >= 2 and vals(tr["data"][0]["z"]).shape == (n, n)
    mt = next(df.value for df in again.dataframe if "family" in df.value.columns)
    assert list(mt["method"])[-1] == "SITE" and "function vector" in set(mt["method"])


def test_an_uncached_run_with_its_budget_runs_draws_the_live_curve_without_a_key_clash(inprocess, setup):
    """Issue 19, defect 1: the live chart's key was `site_live_{step}` and the step restarts for each budget run
    (M = 1, 5, 10, 50), so the first uncached run crashed with StreamlitDuplicateElementKey. Here: a fresh seed
    (nothing cached), the default budget curve, and enough steps that the page polls each run mid-training."""
    at = AppTest.from_file(APP, default_timeout=HANG_S)
    for k, v in {"model": setup["model"], "task": setup["task"], **SMALL, "site_steps": "200", "seed": "3"}.items():
        at.query_params[k] = v
    at.switch_page(PAGE)
    at.run()
    assert_clean(at)
    at.button(key="run_site").click().run()
    assert_clean(at)
    res = inprocess.run("site", {**site_params(setup), "steps": 200, "seed": 3})
    assert res["budget"]["m"] == [1, 5, 10, 50] and res["steps"] == 200
    assert list(vals(figure(at, "site_budget")["data"][0]["x"])) == [1, 5, 10, 50]
    assert not [el for el in at.get("plotly_chart") if "_live_" in el.proto.id]  # the live chart is gone


def test_alpha_selection_feeds_the_heads_field(inprocess, setup):
    at = page(setup)
    at.button(key="run_site").click().run()
    at.button(key="site_pick_half").click().run()
    assert_clean(at)
    res = inprocess.run("site", site_params(setup))
    a = np.asarray(res["alpha"])
    want = sorted((l, h) for l in range(a.shape[0]) for h in range(a.shape[1]) if a[l, h] > 0.5)
    assert sorted(map(tuple, at.session_state["s_heads"])) == want
    if want:
        assert at.query_params.get("heads")


def test_a_running_training_shows_its_loss_and_can_be_cancelled(inprocess, setup):
    import time

    params = {**site_params(setup), "steps": 5000, "val_every": 100, "seed": 7}
    job_id = inprocess.submit("site", params)
    live, deadline = None, time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        j = inprocess.job(job_id)
        if j.get("live") and len(j["live"].get("loss") or []) >= 10:
            live = j["live"]
            break
        assert j["status"] in ("queued", "running"), j
        time.sleep(0.2)
    assert live is not None, "no live loss curve while the job ran"
    assert live["steps"] == 5000 and live["val"][0]["step"] == 0 and all(x >= 0 for x in live["loss"])
    inprocess.cancel(job_id)
    wait_until(lambda: inprocess.job(job_id)["status"] in ("cancelled", "failed", "done"), "the job stopping",
               poll_s=0.2)
    assert inprocess.job(job_id)["status"] == "cancelled"


# -- figure builders -----------------------------------------------------------------------------------------------------
RES = {"alpha": [[0.05, 0.95], [0.5, 0.99]], "site": {"accuracy": 0.9, "exact_match": 0.8, "tr_ratio": 1.0,
                                                      "label_accuracy": 1.0},
       "site_hard": {"accuracy": 0.85, "exact_match": 0.8, "tr_ratio": 1.0, "label_accuracy": 1.0},
       "baselines": {"zero_shot": {"label": "0-shot", "metrics": {"accuracy": 0.2, "exact_match": 0.1,
                                                                  "tr_ratio": 0.3, "label_accuracy": 0.5},
                                   "params": 0, "trainable": 0, "note": ""},  # every field, as the service sends it
                     "icl_10": {"label": "10-shot ICL", "note": "does not fit", "trainable": 0}},
       "params_count": {"site": 4, "lora": 100, "task_embedding": 32}, "train_seconds": 1.5,
       "patching": {"ks": [1, 2, 4], "top": {"accuracy": [0.5, 0.7, 0.9], "label_accuracy": [1, 1, 1],
                                             "tr_ratio": [1, 1, 1]},
                    "bottom": {"accuracy": [0.1, 0.1, 0.9], "label_accuracy": [1, 1, 1], "tr_ratio": [1, 1, 1]}},
       "budget": {"m": [1, 5], "accuracy": [0.5, 0.9], "exact_match": [0.4, 0.8], "tr_ratio": [1, 1],
                  "decided": [0.1, 0.5], "train_seconds": [1, 1]}}


def test_figures_carry_the_numbers():
    from ui.site import figures as sf

    rows = sf.comparison_rows(RES)
    assert [r["method"] for r in rows] == ["0-shot", "10-shot ICL", "SITE", "SITE, α rounded"]
    assert not rows[1]["ran"] and rows[2]["trainable"] == 4 and rows[2]["params"] == 36
    bars = sf.comparison_bars(RES)
    assert list(bars.data[0].x) == ["0-shot", "SITE", "SITE, α rounded"]  # the baseline that did not run is left out
    assert np.allclose(bars.data[0].y, [20, 90, 85])
    pc = sf.patching_curves(RES["patching"], {"site": 0.9})
    assert np.allclose(pc.data[0].y, [50, 70, 90]) and np.allclose(pc.data[1].y, [10, 10, 90])
    amap = sf.alpha_map(RES["alpha"], [(0, 1)])
    assert amap.data[0].zmin == 0 and np.allclose(amap.data[0].z, RES["alpha"]) and "α =" in amap.data[1].hovertemplate
    loss = sf.loss_curve([1.0, 0.5, 0.1], [{"step": 0, "loss": 1.2, "accuracy": 0.5}, {"step": 3, "loss": 0.2,
                                                                                       "accuracy": 1.0}], 3)
    assert len(loss.data) == 3
    tr = sf.transfer_heatmap({"tasks": ["syn-a", "syn-b"], "accuracy": [[1.0, 0.5], [0.25, 0.75]],
                              "accuracy_top_k": [[0.5, 0.0], [0.0, 0.5]]})
    assert list(tr.data[0].x) == ["a", "b"] and np.allclose(tr.data[0].z, [[100, 50], [25, 75]])
    assert np.allclose(sf.transfer_heatmap(tr_res := {"tasks": ["a", "b"], "accuracy": [[1, 1], [1, 1]],
                                                      "accuracy_top_k": [[0.5, 0.0], [0.0, 0.5]]},
                                           which="accuracy_top_k").data[0].z, [[50, 0], [0, 50]]) and tr_res
    bud = sf.budget_curve(RES["budget"])
    assert list(bud.data[0].x) == [1, 5]
