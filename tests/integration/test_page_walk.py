"""The walk's other findings (issue 25, item 7), through the pages (Streamlit's AppTest, the in-process service,
the embedded default model) and the pure parts behind them."""
from __future__ import annotations

import pytest

pytest.importorskip("streamlit.testing.v1")
from page_checks import assert_clean  # noqa: E402
from test_pages import ABLATION, MODEL, SMALL, default_task, needs_model, page  # noqa: E402

HEAD_PAGE = "pages/4_Head.py"


@pytest.fixture(scope="module")
def task_name() -> str:
    return default_task()


# -- the ablation curve's largest k: the model's default applies ------------------------------------------------------
def test_the_kmax_choices_hold_the_models_default_and_the_current_value():
    from ui import state

    assert 27 in state.kmax_choices(270, "smollm2-135m")  # SmolLM2's "ablation up to k = 27"
    assert state.kmax_choices(270, "smollm2-135m")[-1] == 270 and 32 in state.kmax_choices(270, "smollm2-135m")
    assert 5 in state.kmax_choices(64, "default", 5) and 27 not in state.kmax_choices(16, "smollm2-135m", 27)
    assert state.kmax_choices(16, "default") == [1, 2, 4, 8, 16]


@needs_model
def test_a_kmax_off_the_powers_of_two_is_kept(inprocess, task_name):
    """A link's (or a model default's) k that is no power of two stays as it is: it used to snap to the nearest
    power of two (SmolLM2's default 27 showed 32, rewrote the link to kmax=32 and ran to 32)."""
    at = page(ABLATION, model=MODEL, task=task_name, kmax="5", **SMALL)
    at.run()
    assert_clean(at)
    assert at.session_state["s_kmax"] == 5 and at.select_slider(key="w_kmax").value == 5
    assert str(at.query_params["kmax"]).strip("[]'") == "5"


# -- a link's shots and prompts: the sidebar's bounds -----------------------------------------------------------------
def test_bounds_come_from_the_service_limits():
    from ui import state

    assert state.bounds("shots") == (0, None) and state.bounds("prompts") == (1, None)  # no limit stated: the kinds'
    assert state.bounds("shots", {"max_shots": 8}) == (0, 8) and state.bounds("prompts", {"max_prompts": 10}) == (1, 10)


def test_a_link_outside_the_limits_says_the_sidebars_bounds(inprocess):
    at = page(shots="40", prompts="100000")
    at.run()
    assert not at.exception
    warned = " ".join(w.value for w in at.warning)
    assert "`shots=40` in the link is outside this service's 0–32: using 32" in warned, warned
    assert "`prompts=100000` in the link is outside this service's 1–500: using 500" in warned, warned
    assert "1024" not in warned and "100000 " not in warned
    assert at.number_input(key="w_shots").value == 32 and at.number_input(key="w_prompts").value == 500
    assert at.number_input(key="w_shots").max == 32 and at.number_input(key="w_prompts").max == 500


# -- "shown X s after the request": from the click ---------------------------------------------------------------------
@needs_model
def test_the_wait_counts_from_the_start_of_the_run(inprocess, task_name, monkeypatch):
    """A cached result found after the page spent a second on its own work reads at least that second: the wait
    counts from the user's action (the start of the run), not from the request to the service."""
    import time

    from ui import fit

    warm = page(HEAD_PAGE, model=MODEL, task=task_name, **SMALL)
    warm.run()  # computes the scores into the service's cache
    assert_clean(warm)
    slow = fit.check

    def slow_check(*a, **kw):
        time.sleep(1.0)
        return slow(*a, **kw)

    monkeypatch.setattr(fit, "check", slow_check)
    at = page(HEAD_PAGE, model=MODEL, task=task_name, **SMALL)  # a fresh session: the scores come from the cache
    at.run()
    assert_clean(at)
    scores = [v for k, v in at.session_state["_hl_results"].items() if k.startswith("head_scores:")]
    assert scores and scores[0].get("cache_hit") and scores[0]["_waited"] >= 1.0


# -- multi-token labels: one warning on Home ---------------------------------------------------------------------------
@needs_model
def test_home_says_multi_token_labels_once(inprocess, task_name):
    from backend.analysis.primitives.notes import multi_token_warning

    at = page(model=MODEL, task=task_name, **SMALL)
    at.run()
    at.button(key="run").click().run()
    assert_clean(at)
    results = at.session_state["_hl_results"]
    key = next(k for k in results if k.startswith("head_scores:"))
    results[key] = {**results[key], "multi_token_labels": [" tree", " stone"],
                    "warnings": [multi_token_warning([" tree", " stone"], {" tree": " t", " stone": " st"})]}
    at.run()
    assert_clean(at)
    said = [w.value for w in at.warning] + [c.value for c in at.caption] + [m.value for m in at.markdown]
    assert sum("several tokens" in x for x in said) == 1, said


# -- your own prompt: unknown words are said ---------------------------------------------------------------------------
@needs_model
def test_your_own_prompt_of_unknown_words_is_warned(inprocess, task_name):
    at = page(HEAD_PAGE, model=MODEL, task=task_name, head="0.1", text="hello world", **SMALL)
    at.run()
    assert_clean(at)
    warned = " ".join(w.value for w in at.warning)
    assert "every token of your prompt is unknown to this model's tokenizer" in warned, warned
    assert "'hello', 'world'" in warned


def test_unknown_words_of_a_typed_prompt_are_named():
    from pathlib import Path

    from transformers import AutoTokenizer

    from backend.analysis.general.head_view import unknown_words

    folder = Path(__file__).resolve().parents[2] / "models" / "headlens-tiny"
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("the default model is absent")
    tok = AutoTokenizer.from_pretrained(str(folder))
    known = [w for w in tok.get_vocab() if w.isalpha() and w.islower()][:3]
    assert unknown_words(tok, " ".join(known)) is None
    msg = unknown_words(tok, " ".join(known) + " qzxv")
    assert msg.startswith("1 of your prompt's 4 tokens are unknown") and "'qzxv'" in msg


# -- cosmetics ---------------------------------------------------------------------------------------------------------
def test_layer_distribution_keeps_its_legend_off_the_axis_title():
    import numpy as np

    from ui import figures

    rng = np.random.default_rng(0)
    r = {"n_layers": 30, **{m: rng.random((30, 9)) for m in ("tr", "tl", "induction")}}  # SmolLM2's shape
    fig = figures.layer_distribution(r, 10, "Layer of the top 10 heads" + figures.subtitle("smollm2 · t · 8 shots"))
    leg = fig.layout.legend
    assert leg.yref == "container" and leg.y == 0 and leg.yanchor == "bottom"  # the figure's bottom edge
    assert fig.layout.margin.b >= 80 and fig.layout.xaxis.dtick == 2
    counts = sum(np.asarray(t.y) for t in fig.data)
    assert counts.sum() == 30 and fig.layout.yaxis.dtick == 1  # 3 x 10 heads, whole-head ticks


@needs_model
def test_the_layer_distribution_is_subtitled_without_another_count(inprocess, task_name):
    import json

    at = page("pages/1_Head_map.py", model=MODEL, task=task_name, **SMALL)
    at.run()
    assert_clean(at)
    title = next(json.loads(el.proto.spec)["layout"]["title"]["text"] for el in at.get("plotly_chart")
                 if el.proto.id.endswith("layer_dist"))
    assert title.startswith("Layer of the top 10 heads") and "top 4 heads" not in title and "heads" not in \
        title.split("<br>", 1)[1]


def test_the_css_wraps_chips_and_links_and_clears_toolbars_on_a_phone():
    from ui import layout

    css = layout.CSS
    assert '[data-testid="stMultiSelectTagsContainer"] {flex-wrap: wrap' in css
    assert '[data-testid="stPageLink-NavLink"]' in css and "@media (max-width: 640px)" in css
    assert ".js-plotly-plot .modebar-group:first-child" in css


def test_the_html_files_settings_are_this_pages_in_words_with_the_prompts_that_ran():
    from ui import share

    q = {"model": "default", "task": "syn-sentiment", "shots": "8", "prompts": "50", "seed": "0", "heads": "0.1",
         "mode": "zero", "map": "tr", "kmax": "16", "top_pct": "3", "sg_layer": "3", "ltv_lr": "0.1", "pt": "1"}
    got = share.page_settings("Ablation", q, [("ablation_curves", {"prompts": 20}), ("head_scores", {"prompts": 20})])
    assert list(got) == ["model", "task", "shots", "prompts", "seed", "selected heads", "top heads (% of all heads)",
                         "ablation mode", "ablation curves up to k"]
    assert got["prompts"] == "20"  # as its commands say (--prompts 20), not the 50 asked
    steer = share.page_settings("Steering & geometry", q)
    assert steer["layer"] == "3" and "ablation mode" not in steer and "lr" not in steer and steer["prompts"] == "50"


def test_the_html_file_wraps_instead_of_overflowing_sideways():
    from backend.report.html_export import CSS, page_html

    out = page_html("Ablation", link="http://x/?" + "a=1&" * 200, include_plotlyjs=False,
                    tables=[{"title": "t", "columns": [f"c{i}" for i in range(40)], "rows": [list(range(40))]}])
    assert "code {overflow-wrap: anywhere" in CSS and "overflow-x: auto" in CSS.split("table {", 1)[1].split("}")[0]
    assert "<code>http://x/?a=1&amp;" in out


@needs_model
def test_the_site_page_has_its_fit_check_line_for_its_own_shots(inprocess, task_name):
    at = page("pages/6_Soft_head_selection.py", model=MODEL, task=task_name, site_shots="3", **SMALL)
    at.run()
    assert_clean(at)
    line = [c.value for c in at.caption if "Fits" in c.value]
    assert line and "prompts of 3 shots take up to" in line[0], line


def test_a_progress_bar_says_its_share_is_the_whole_jobs():
    from ui import jobs

    text = jobs.bar_text("SITE", "training: step 154/400 · loss 0.310", 0.09, 41.0, " of about 3 min")
    assert text == "SITE: training: step 154/400 · loss 0.310 · 9% of the job · 41.0 s of about 3 min"


def test_an_estimate_says_what_it_rests_on():
    from ui.sections import estimate_text

    e = {"seconds": 600.0, "passes": 100, "basis": "assumed from the model's size: nothing ran on it here yet",
         "admitted": True}
    text, _ = estimate_text([e])
    assert "until it is loaded" not in text and "nothing ran on it here yet" in text and "about 10 min" in text
    assert "3 earlier runs" in estimate_text([{**e, "basis": "3 earlier runs of head_maps here"}])[0]
