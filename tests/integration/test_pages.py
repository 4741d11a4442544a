"""The dashboard's pages through Streamlit's AppTest, against the in-process service and the default model.

Every page renders with no exception; the Home page runs a task and shows its summary; the Head map draws
its maps, tables and quick picks; selecting heads on the Ablation page changes the ablation results; a link
reopens the same view; every failure is an st.error, never a traceback; no page imports torch.

HEADLENS_UI_TEST_MODEL / HEADLENS_UI_TEST_TASK run these against another model folder and task.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("streamlit.testing.v1")
from streamlit.testing.v1 import AppTest  # noqa: E402
from page_checks import assert_clean  # noqa: E402
from hang import HANG_S  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
APP = str(REPO / "app.py")
HEAD_MAP = "pages/1_Head_map.py"
ABLATION = "pages/2_Ablation.py"
MODEL = os.environ.get("HEADLENS_UI_TEST_MODEL", "default")
SMALL = {"shots": "4", "prompts": "16", "seed": "0"}


def _model_present() -> bool:
    if MODEL != "default":
        return Path(MODEL).is_dir()
    return (REPO / "models" / "headlens-tiny" / "config.json").is_file()


needs_model = pytest.mark.skipif(not _model_present(), reason=(
    f"model {MODEL!r} is absent (the default model lives in models/headlens-tiny; regenerate it with "
    f"`python -m backend train-default`)"))


@pytest.fixture(scope="module")
def task_name() -> str:
    return default_task()


def default_task() -> str:
    """The task the tests run: HEADLENS_UI_TEST_TASK, or the default model's first synthetic task."""
    if os.environ.get("HEADLENS_UI_TEST_TASK"):
        return os.environ["HEADLENS_UI_TEST_TASK"]
    from backend.tasks.registry import builtin_tasks

    tasks = builtin_tasks()
    if MODEL == "default":
        syn = [n for n, t in tasks.items() if t.models == "default" and t.kind == "classification"]
        if syn:
            return syn[0]
    return "sentiment"


def page(path: str | None = None, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=HANG_S)
    for k, v in query.items():
        at.query_params[k] = v
    if path:
        at.switch_page(path)
    return at


def metric(at: AppTest, label_start: str) -> str:
    found = [m.value for m in at.metric if m.label.startswith(label_start)]
    assert found, f"no metric {label_start!r} among {[m.label for m in at.metric]}"
    return found[0]


def frame_with(at: AppTest, column: str) -> pd.DataFrame:
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with a {column!r} column")


def has_frame(at: AppTest, column: str) -> bool:
    return any(column in df.value.columns for df in at.dataframe)


def plotly_charts(at: AppTest) -> list:
    return at.get("plotly_chart")


# -- pure parts: figures and URL state -------------------------------------------------------------------------
def test_heatmap_hover_shows_value_and_rank_and_selection():
    from ui import figures

    z = np.array([[0.1, 0.5, -0.2], [0.3, 0.0, 0.9]])
    fig = figures.head_heatmap(z, "tl", selected=[(1, 2), (7, 7)])
    heat, grid, sel = fig.data
    assert heat.type == "heatmap" and heat.zmid == 0.0  # signed map: diverging scale centred on 0
    assert "rank %{customdata[1]} of 6" in grid.hovertemplate and "TL = %{customdata[0]" in grid.hovertemplate
    custom = np.asarray(grid.customdata)
    assert custom[list(zip(grid.y, grid.x)).index((1, 2))].tolist() == [0.9, 1]  # largest value has rank 1
    assert list(zip(sel.y, sel.x)) == [(1, 2)]  # out-of-range heads from a stale link are not drawn
    assert figures.ranks(z).tolist() == [[4, 2, 6], [3, 5, 1]]
    assert figures.top_k(z, 2) == [(1, 2), (0, 1)]
    assert figures.png_config("x")["toImageButtonOptions"]["format"] == "png"


def test_other_pages_leave_the_five_head_maps_alone():
    """The LTV and SITE figures draw their maps with the same component without adding to the Head map's list
    (a page that ran earlier in the session must not give the Head map a sixth map it has no values for)."""
    from ui import figures  # noqa: F401
    from ui.ltv import figures as ltv_figures  # noqa: F401
    from ui.site import figures as site_figures

    assert list(figures.METRICS) == ["tr", "tl", "dla_tr", "dla_tl", "induction"]
    fig = site_figures.alpha_map(np.array([[0.0, 1.0], [0.5, 0.25]]))
    assert fig.data[0].colorbar.title.text == "α" and "α = %{customdata[0]" in fig.data[1].hovertemplate
    assert figures.head_heatmap(np.ones((1, 2)), "ltv_saliency").data[0].colorbar.title.text == "Saliency"


def test_curve_figures_from_result_dicts():
    from ui import figures

    abl = {"ks": [0, 1, 2], "mode": "zero", "curves": {
        "tr": {"accuracy": [0.9, 0.5, 0.2], "label_accuracy": [1, 1, 0.9], "tr_ratio": [1.0, 0.8, 0.4], "heads": []},
        "random": {"accuracy": [0.9, 0.85, 0.8], "label_accuracy": [1, 1, 1], "tr_ratio": [1, 1, 1],
                   "accuracy_std": [0, 0.05, 0.1], "label_accuracy_std": [0, 0, 0], "tr_ratio_std": [0, 0, 0],
                   "seeds": [0, 1, 2], "heads": []}}}
    fig = figures.ablation_curves(abl)
    assert figures.rises(abl) == []  # every curve falls or stays: no note
    up = {"ks": [0, 4, 8], "curves": {"tl": {"accuracy": [0.9, 0.2, 0.4], "label_accuracy": [1, 1, 1],
                                             "tr_ratio": [1, 1, 1]}}}
    assert figures.rises(up) == ["top TL, accuracy: k 4 → 8 (20% → 40%)"]  # issue 19: said beside the curves
    names = {t.name for t in fig.data if t.name}
    assert {"top TR", "random (mean ± sd)"} <= names
    band = next(t for t in fig.data if t.fill == "toself")  # the random band: lines only, within 0..100
    assert band.mode == "lines" and max(band.y) <= 100 and min(band.y) >= 0
    lines = [t for t in fig.data if t.fill != "toself" and t.xaxis == "x"]
    assert len({(t.line.dash, t.marker.symbol) for t in lines}) == 2
    assert lines[0].line.width > lines[1].line.width  # a line drawn over an equal one is thinner: both show
    icl = figures.icl_curve({"shots": [0, 2], "accuracy": [0.5, 0.75], "label_accuracy": [0.9, 1.0],
                             "tr_ratio": [0.1, 0.9]})
    assert [t.name for t in icl.data] == ["accuracy", "label accuracy", "TR ratio"]
    assert list(icl.data[0].y) == [50.0, 75.0] and list(icl.data[1].y) == [90.0, 100.0]
    assert len({(t.line.dash, t.marker.symbol) for t in icl.data}) == 3  # told apart where they overlap


def test_changes_that_round_to_zero_show_no_arrow():
    from ui import metrics as M

    assert M.points(0.5, 0.5) is None and M.points(0.3334, 0.3333) is None  # no "-0.0" with a red arrow
    assert M.points(0.75, 0.5) == "+25.0 pts" and M.pct(None) == "n/a"
    zero = {"accuracy": 0.06, "label_accuracy": 1.0, "tr_ratio": 0.06}
    said = M.zero_shot_sentence(zero, {"accuracy": 1.0, "label_accuracy": 1.0, "tr_ratio": 1.0}, 8)
    assert said and "not which task is meant" in said and "6%" in said
    assert M.zero_shot_sentence({**zero, "label_accuracy": 0.1}, zero, 8) is None
    assert M.zero_shot_sentence({**zero, "label_accuracy": 0.44}, zero, 8) is None  # issue 19: not "knows the facts"


def test_heads_in_the_url_round_trip():
    from ui import state

    assert state.parse_heads("2.6, 1.5,L3.H0") == [(1, 5), (2, 6), (3, 0)]
    assert state.parse_heads(["1.5", "1.5"]) == [(1, 5)]
    assert state.format_heads([(2, 6), (1, 5)]) == "1.5,2.6"
    with pytest.raises(ValueError, match="layer.head"):
        state.parse_heads("2-6")


def test_pages_never_import_torch_or_the_analyses():
    """Floor rule: app.py, pages/ and ui/ import only the client and the torch-free registry of kinds (its names and
    aliases), statically and at run time."""
    allowed = ("backend.analysis.kinds",)
    banned = ("torch", "transformers", "backend.analysis", "backend.model.loading", "backend.service", "backend.model.hooks")
    files = [REPO / "app.py", *sorted((REPO / "pages").glob("*.py")), *sorted((REPO / "ui").glob("**/*.py"))]
    for f in files:
        tree = ast.parse(f.read_text())
        # the client's in-process path (HEADLENS_BACKEND_URL=inprocess: tests, notebooks) builds the service app
        # inside `inprocess_app`; nothing else may import it
        lazy = {id(n) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and fn.name == "inprocess_app"
                for n in ast.walk(fn)} if f.name == "client.py" else set()
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                if id(node) in lazy and n == "backend.service.app":
                    continue
                assert n in allowed or not any(n == b or n.startswith(b + ".") for b in banned), f"{f.name} imports {n}"
    code = textwrap.dedent(f"""
        import sys
        from streamlit.testing.v1 import AppTest
        for p in (None, {HEAD_MAP!r}, {ABLATION!r}):
            at = AppTest.from_file({APP!r}, default_timeout={HANG_S!r})
            if p:
                at.switch_page(p)
            at.run()
            assert not at.exception, [e.value for e in at.exception]
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
        print("IMPORTED", bad)
        sys.exit(1 if bad else 0)
    """)
    env = dict(os.environ, HEADLENS_BACKEND_URL="http://127.0.0.1:9")  # unreachable: pages render their error
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


# -- errors are messages ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [None, HEAD_MAP, ABLATION])
def test_unreachable_backend_is_an_error_not_a_traceback(monkeypatch, path):
    from ui import api

    monkeypatch.setenv("HEADLENS_BACKEND_URL", "http://127.0.0.1:9")
    api.reset_clients()
    at = page(path, task="sentiment")
    at.run()
    assert not at.exception
    assert at.error and "unreachable" in at.error[0].value.lower()
    assert "HEADLENS_BACKEND_URL" in at.error[0].value
    # issue 19, defect 2: one sentence, and the details in an expander (a code block: it has a copy button)
    assert any(x.label == "Details" for x in at.expander)
    details = [c.value for c in at.code if "unreachable" in c.value.lower()]
    assert details and "service: http://127.0.0.1:9" in details[0] and "kind: unreachable" in details[0]
    assert any("logs/headlens.log" in c.value for c in at.caption)  # where the servers' full output is
    api.reset_clients()


def test_upload_validates_and_picks_the_task(inprocess):
    at = page()
    at.run()
    assert_clean(at)
    at.file_uploader(key="w_upload").set_value(("bad.jsonl", b'{"input": "a", "output": "b"}\nnot json\n',
                                                "application/jsonl")).run()
    assert not at.exception
    assert at.error and "bad.jsonl" in at.error[0].value and "line 2" in at.error[0].value.lower()
    from backend.tasks.registry import load_task

    words = load_task("syn-sentiment").examples  # words the default model knows
    good = "input,output\n" + "".join(f"{x},{y}\n" for x, y in words[:24])
    at.file_uploader(key="w_upload").set_value(("mine.csv", good.encode(), "text/csv")).run()
    assert_clean(at)
    assert any("mine" in m.value and "classification" in m.value for m in at.success)
    # its words are known, the upload template's ("Q: … A: …") are not: a warning, shown with the confirmation
    assert any("may not fit model `default`" in w.value and "0% of the input tokens" in w.value
               and "template" in w.value for w in at.warning)
    picked = at.selectbox(key="w_task").value
    assert picked.startswith("upload:")
    assert str(at.query_params["task"]).strip("[]'") == picked  # the link names the upload
    # English words on the default model: valid as a file, refused by the fit check, nothing runs
    english = "input,output\n" + "".join(f"{w} {n},{'pos' if i % 2 else 'neg'}\n" for i, (w, n) in enumerate(
        (w, n) for n in ("film", "play") for w in "great awful lovely boring superb dull charming tedious brilliant "
                                                  "weak fine poor".split()))
    at.file_uploader(key="w_upload").set_value(("english.csv", english.encode(), "text/csv")).run()
    assert not at.exception
    assert any("english" in m.value for m in at.success)
    refused = [e.value for e in at.error]
    assert len(refused) == 1 and "does not fit model `default`" in refused[0] and "100% of the input tokens" in refused[0]
    assert not any(b.key == "run" for b in at.button)  # the page stops before Run


def test_unknown_task_and_model_are_errors(inprocess):
    at = page(task="no-such-task", **SMALL)
    at.run()
    assert not at.exception
    assert at.error and "no-such-task" in at.error[0].value
    assert "POST" not in at.error[0].value and "Home page" in at.error[0].value  # a UI user's words, not the API's
    at = page(model="/no/such/model/folder", task="sentiment", **SMALL)
    at.run()
    assert not at.exception
    assert at.error and "/no/such/model/folder" in at.error[0].value


def test_bad_values_in_a_link_are_ignored_with_a_warning(inprocess):
    at = page(shots="many", heads="2-6", mode="sideways")
    at.run()
    assert not at.exception
    warned = " ".join(w.value for w in at.warning)
    assert "shots=many" in warned and "heads=2-6" in warned and "mode=sideways" in warned
    assert at.number_input(key="w_shots").value == 8


# -- the pages on the default model ------------------------------------------------------------------------------------
@needs_model
def test_home_first_screen_picks_a_task_and_waits_for_run(inprocess, task_name):
    at = page(model=MODEL)
    at.run()
    assert_clean(at)
    task = at.selectbox(key="w_task").value
    if MODEL == "default":
        assert task.startswith("syn-"), task  # the default model opens on its own tasks
    assert at.button(key="run").label == "Run"
    assert any("Press **Run**" in i.value for i in at.info)
    assert not at.metric  # nothing computed before Run


@needs_model
def test_home_runs_a_task_and_shows_the_summary(inprocess, task_name):
    at = page(model=MODEL, **SMALL)
    at.run()
    at.selectbox(key="w_task").set_value(task_name).run()
    at.button(key="run").click().run()
    assert_clean(at)
    for label in ("Accuracy (4-shot)", "Label accuracy (4-shot)", "TR ratio (4-shot)"):
        assert metric(at, label).endswith("%")
    assert any("computed in" in c.value and "after the request" in c.value for c in at.caption)  # the wait, too
    title = json.loads(plotly_charts(at)[0].proto.spec)["layout"]["title"]["text"]
    assert task_name in title and MODEL in title  # an exported PNG says what it shows
    assert metric(at, "Heads").count("×") == 1
    assert len(plotly_charts(at)) == 1  # the ICL curve
    ex = frame_with(at, "prediction")
    assert len(ex) > 0 and {"query", "gold", "correct", "label_correct"} <= set(ex.columns)
    curve = frame_with(at, "Label accuracy %")
    assert curve["k"].tolist()[0] == 0 and curve["k"].tolist()[-1] == 4
    # the URL now holds the view
    assert at.query_params["task"] == [task_name] or at.query_params["task"] == task_name


@needs_model
def test_head_map_renders_maps_tables_and_picks_heads(inprocess, task_name):
    at = page(HEAD_MAP, model=MODEL, task=task_name, **SMALL)
    at.run()
    assert_clean(at)
    assert len(plotly_charts(at)) == 2  # the selectable map and the layer distribution
    at.toggle(key="w_all_maps").set_value(True).run()  # all five maps, on demand
    assert_clean(at)
    charts = plotly_charts(at)
    assert len(charts) == 3 and str(at.query_params["all_maps"]).strip("[]'") == "1"
    five = next(json.loads(c.proto.spec) for c in charts if c.proto.id.endswith("all_maps"))
    heat = [t for t in five["data"] if t["type"] == "heatmap"]
    assert len(heat) == 5 and all(t.get("showscale") for t in heat)  # each map its colour bar
    assert len({round(t["colorbar"]["x"], 3) for t in heat}) == 5  # each beside its own map
    scores = inprocess.run("scores", {"model": MODEL, "task": task_name, "shots": 4, "prompts": 16, "seed": 0})
    L, H = scores["n_layers"], scores["n_heads"]
    top = frame_with(at, "tr_rank")
    assert len(top) == min(10, L * H) and top["tr_rank"].tolist() == list(range(1, len(top) + 1))
    overlap = frame_with(at, "Jaccard")
    assert len(overlap) == 3 and {"Spearman ρ", "Kendall τ"} <= set(overlap.columns)
    at.button(key="q_tr_hm").click().run()
    assert_clean(at)
    from ui import figures

    k = int(scores["top_k"])  # issue 36: the quick pick selects the set the map outlines, of the sidebar's size
    want = [figures.head_name(h) for h in sorted(figures.top_k(np.asarray(scores["tr"]), k))]
    assert want == [figures.head_name(tuple(h)) for h in sorted(map(tuple, scores["top_tr"]))] and k != 3
    assert at.multiselect(key="w_heads").value == want
    assert metric(at, "Selected") == str(k)
    qp = at.query_params["heads"]
    assert (qp[0] if isinstance(qp, list) else qp) == ",".join(f"{l}.{h}" for l, h in sorted(
        figures.top_k(np.asarray(scores["tr"]), k)))
    at.segmented_control(key="w_map").set_value("induction").run()
    assert_clean(at)
    assert top["induction_rank"].tolist() != frame_with(at, "induction_rank")["induction_rank"].tolist()
    assert str(at.query_params["map"]).strip("[]'") == "induction"


@needs_model
def test_selecting_heads_changes_the_ablation_results(inprocess, task_name):
    at = page(ABLATION, model=MODEL, task=task_name, kmax="4", **SMALL)
    at.run()
    assert_clean(at)
    assert any("No heads selected" in i.value for i in at.info)
    assert not has_frame(at, "gold_prob_after")
    assert len(plotly_charts(at)) == 1  # the ablation curves, computed anyway
    curves = frame_with(at, "accuracy_std")
    assert set(curves["order"]) == {"tr", "tl", "induction", "random"} and set(curves["k"]) == {0, 1, 2, 4}

    at.button(key="q_tr_ab").click().run()  # the top 3 heads by TR
    assert_clean(at)
    first = frame_with(at, "gold_prob_after").reset_index(drop=True)
    assert len(first) == 16
    assert not np.allclose(first["gold_prob_after"], first["gold_prob_before"])
    acc_first = metric(at, "Accuracy after")
    assert metric(at, "Label accuracy after").endswith("%") and metric(at, "TR ratio after").endswith("%")
    assert any(c.value.startswith("was ") for c in at.caption)  # the value before ablation

    at.multiselect(key="w_heads").set_value(["L0.H0"]).run()  # another selection
    assert_clean(at)
    second = frame_with(at, "gold_prob_after").reset_index(drop=True)
    assert np.allclose(second["gold_prob_before"], first["gold_prob_before"])  # same prompts, same baseline
    assert not np.allclose(second["gold_prob_after"], first["gold_prob_after"])
    assert "0.0" in str(at.query_params["heads"])

    at.segmented_control(key="w_mode").set_value("mean").run()
    assert_clean(at)
    third = frame_with(at, "gold_prob_after").reset_index(drop=True)
    # mean != zero ablation (the default model is confident: the probabilities differ in the 6th digit)
    assert (third["gold_prob_after"] != second["gold_prob_after"]).any()

    at.button(key="q_clear_ab").click().run()
    assert_clean(at)
    assert not has_frame(at, "gold_prob_after")
    assert acc_first.endswith("%")


@needs_model
def test_live_toggle_at_the_last_token_or_every_position(inprocess, task_name):
    """The live toggle ablates at the last token by default (what the kept clean prefix makes fast); a link or the
    control switches it to every position, and the numbers follow the setting."""
    at = page(ABLATION, model=MODEL, task=task_name, heads="0.1,1.0", **SMALL)
    at.run()
    assert_clean(at)
    assert at.segmented_control(key="w_ab_positions").value == "last"
    assert any("zero ablation of L0.H1, L1.H0 at the last token" in c.value for c in at.caption)
    last = frame_with(at, "gold_prob_after")["gold_prob_after"].tolist()
    at.segmented_control(key="w_ab_positions").set_value("all").run()
    assert_clean(at)
    assert any("zero ablation of L0.H1, L1.H0 at every position" in c.value for c in at.caption)
    assert frame_with(at, "gold_prob_after")["gold_prob_after"].tolist() != last
    assert at.query_params.get("ab_positions") in ("all", ["all"])


def test_a_link_reopens_the_same_view(inprocess, task_name):
    at = page(ABLATION, model=MODEL, task=task_name, heads="0.1,1.0", mode="mean", kmax="2", **SMALL)
    at.run()
    assert_clean(at)
    assert at.multiselect(key="w_heads").value == ["L0.H1", "L1.H0"]
    assert at.selectbox(key="w_task").value == task_name
    assert at.number_input(key="w_shots").value == 4 and at.number_input(key="w_prompts").value == 16
    rows = frame_with(at, "gold_prob_after")
    assert len(rows) == 16
    assert any("mean ablation of L0.H1, L1.H0" in c.value for c in at.caption)
    at.switch_page(HEAD_MAP).run()  # the selection follows to the other page
    assert_clean(at)
    assert at.multiselect(key="w_heads").value == ["L0.H1", "L1.H0"]


def _pct_after(text: str, marker: str) -> float:
    """The first percentage after `marker` in `text` ("... TR ratio **6.2%** ..." -> 6.2)."""
    import re

    m = re.search(re.escape(marker) + r"[^0-9]*([0-9.]+)%", text)
    assert m, f"no percentage after {marker!r} in {text!r}"
    return float(m.group(1))


@pytest.mark.skipif(MODEL != "default" or not _model_present(), reason="needs the default model")
def test_tr_ratio_moves_on_head_map_ablation_and_steering(inprocess):
    """Issue 9 on the default model: the TR ratio rises from 0 to 8 shots (Head map), falls when the top 8 TR heads
    are ablated (Ablation), and rises again when the TR vector is injected into zero-shot prompts (Steering)."""
    q = dict(model="default", task="syn-sentiment", shots="8", prompts="16", seed="0")
    at = page(HEAD_MAP, **q)
    at.run()
    assert_clean(at)
    caption = next(c.value for c in at.caption if "with 0 shots" in c.value)
    zero, eight = _pct_after(caption, "TR ratio"), _pct_after(caption, "with 0 shots →")
    assert zero < eight, caption
    assert metric(at, "TR ratio (8-shot)") == f"{eight:.1f}%"

    at = page(ABLATION, kmax="8", **q)
    at.run()
    assert_clean(at)
    caption = next(c.value for c in at.caption if c.value.startswith("TR ratio with the top 8 TR heads ablated"))
    assert _pct_after(caption, "ablated:") < _pct_after(caption, "none ablated:") == eight, caption

    at = page("pages/3_Steering_geometry.py", **q)
    at.run()
    at.multiselect(key="w_sg_vectors").set_value(["tr"]).run()
    at.button(key="run_steer").click().run()
    assert_clean(at)
    text = next(m.value for m in at.markdown if m.value.startswith("TR ratio:"))
    assert _pct_after(text, "TR ratio:") == zero  # the same zero-shot prompts as the Head map's
    assert _pct_after(text, "TR vector") > zero, text


HEAD_PAGE = "pages/4_Head.py"


@needs_model
def test_head_map_drill_down_shows_the_clicked_heads_pattern(inprocess, task_name):
    at = page(HEAD_MAP, model=MODEL, task=task_name, head="1.2", **SMALL)
    at.run()
    assert_clean(at)
    want = inprocess.run("head", {"model": MODEL, "task": task_name, "shots": 4, "prompts": 16, "seed": 0,
                                  "head": [1, 2], "prompt": 0, "logit_lens": False})
    views = [h.proto.body for h in at.get("html")]
    assert any('class="hl-tv"' in v and "L1.H2" in v for v in views)  # the token view
    token_view = next(v for v in views if 'class="hl-tv"' in v)
    assert token_view.count('class="hl-tok') == len(want["tokens"])
    att = [json.loads(el.proto.spec) for el in at.get("plotly_chart") if el.proto.id.endswith("hm_drill_att")]
    assert att and np.allclose(att[0]["data"][0]["y"], want["attention"][-1])
    dla = frame_with(at, "DLA")
    assert np.allclose(dla["DLA"], want["label_dla"])
    at.number_input(key="w_prompt").set_value(3).run()  # another prompt: in the link too
    assert_clean(at)
    assert str(at.query_params["prompt"]).strip("[]'") == "3" and str(at.query_params["head"]).strip("[]'") == "1.2"


@needs_model
def test_head_page_takes_your_own_prompt_and_shows_the_logit_lens(inprocess, task_name):
    text = inprocess.run("head", {"model": MODEL, "task": task_name, "shots": 4, "prompts": 16, "seed": 0,
                                  "head": [0, 1]})["text"]
    at = page(HEAD_PAGE, model=MODEL, task=task_name, head="0.1", text=text[:-6] + text[-6:], lens="1", **SMALL)
    at.run()
    assert_clean(at)
    assert at.toggle(key="w_own_prompt").value is True and at.text_area(key="w_text").value == text
    lens = frame_with(at, "#1")
    assert len(lens) == 4 and list(lens["layer"]) == [0, 1, 2, 3]  # the default model's 4 layers
    assert len(frame_with(at, "p with the head ablated")) == 10  # top next tokens
    code = [c.value for c in at.code if "head_view(" in c.value]
    assert code and "text=" in code[0] and "logit_lens=True" in code[0]


@needs_model
def test_copy_as_python_reproduces_the_view(inprocess, task_name):
    """The Head map's snippet, run as a notebook would, gives the numbers the page shows."""
    from ui import snippets

    from backend.analysis.kinds import KINDS

    for k in KINDS.values():  # every kind's notebook line calls the function of its name, an alias too
        for name in k.names:
            assert f", {k.name}\n" in snippets.python(name, {"model": "default", "task": "t"})
    at = page(HEAD_MAP, model=MODEL, task=task_name, **SMALL)
    at.run()
    assert_clean(at)
    code = next(c.value for c in at.code if "head_scores(" in c.value)
    assert code.startswith("from backend import load_model, load_task, head_scores")
    scope: dict = {}
    exec(code.split("\nr.")[0], scope)  # the lines that compute r
    shown = inprocess.run("scores", {"model": MODEL, "task": task_name, "shots": 4, "prompts": 16, "seed": 0,
                                     "top_pct": 3.0})
    assert np.allclose(scope["r"].tr, shown["tr"]) and scope["r"].icl.accuracy == shown["icl"]["accuracy"]


def test_natural_language_tasks_are_marked_for_the_default_model():
    from ui import layout

    nl = {"id": "sentiment", "name": "sentiment", "kind": "classification", "n_examples": 224, "models": "any"}
    syn = {"id": "syn-size", "name": "syn-size", "kind": "classification", "n_examples": 40, "models": "default"}
    assert "words unknown to this model" in layout.task_label(nl, "default")
    assert "⊘" not in layout.task_label(syn, "default")
    assert "for the default model" in layout.task_label(syn, "gpt2") and "⊘" not in layout.task_label(nl, "gpt2")
