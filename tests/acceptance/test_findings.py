"""Kind `findings` and `python -m backend report`: the papers' findings on one model as a summary with verdicts, each
resting on per-task tests corrected across tasks, and one self-contained HTML file with figures (tiny sizes on the
embedded model: the numbers are meaningless, the plumbing and the statistics are not)."""
from __future__ import annotations

import argparse
import html
import json
import math
import re

import numpy as np
import pytest

from backend.analysis.findings import verdicts as V
from backend.report.findings_html import markdown_html, report_html
from backend.report.html_export import plotly_js
from backend.analysis.kernel import analyze
from backend.model.loading import load_model

TINY = {"tasks": ["syn-sentiment", "syn-antonym"], "prompts": 4, "shots": 2, "random_sets": 1, "site_prompts": 4,
        "ltv_prompts": 4, "ltv_perturbations": 4}
VERDICT = re.compile(r"^(holds|partly|does not hold|not run|not tested)\b")  # SITE transfer: 2 SITE tasks


@pytest.fixture(scope="module")
def report(shared_cache):
    """One report per module, computed on the module's cache folder (results and saved tensors)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HEADLENS_CACHE_DIR", str(shared_cache))
        lm = load_model("default")
        return lm, analyze("findings", lm, None, TINY)


def test_every_section_gives_each_finding_a_verdict(report):
    _, r = report
    assert r.sections == ["tsla", "site", "ltv"] and r.tasks == TINY["tasks"]
    papers = [row.paper for row in r.summary]
    assert set(papers) == {"TSLA", "SITE", "LTV"}, papers
    assert all(VERDICT.match(row.ours) for row in r.summary), [row.ours for row in r.summary]
    assert all(row.paper_figure for row in r.summary)
    assert "## Summary" in r.markdown and "python -m backend report --model" in r.markdown


def test_a_second_run_is_the_cached_result(report, shared_cache, monkeypatch):
    lm, r = report
    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(shared_cache))
    again = analyze("findings", lm, None, TINY)
    assert again.cache_hit and not r.cache_hit
    assert again.summary == r.summary and again.markdown == r.markdown and again.data == r.data
    assert report_html(again).replace(again.command, "") == report_html(r).replace(r.command, "")  # same figures


def test_the_html_opens_without_a_server_and_shows_each_finding(report):
    _, r = report
    page = report_html(r)
    bundle = f'<script type="text/javascript">{plotly_js()}</script>'
    assert page.count(bundle) == 1  # plotly.js inlined once, whatever the number of figures
    text = page.replace(bundle, "")
    assert not re.search(r"<script[^>]+src=|<link|@import|https?://(?!www\.w3\.org)", text)
    assert text.count("</script>") == text.count("<script")
    figs = [json.loads(m) for m in re.findall(r'<script type="application/json" class="hl-figure"[^>]*>(.*?)</script>',
                                              text, re.S)]
    types = [tr["type"] for f in figs for tr in f["data"]]
    tested = [row for row in r.summary if row.tests]
    # a forest plot per tested finding, and per TSLA task its maps (heatmaps) and ablation curves (error bars)
    forests = [f for f in figs if f["layout"].get("xaxis", {}).get("title", {}).get("text") == "effect (95% CI)"]
    assert len(forests) == len(tested) and types.count("heatmap") == 3 * len(r.tasks)
    curves = [tr for f in figs for tr in f["data"] if tr["type"] == "scatter" and tr.get("error_y")]
    assert len(curves) >= 2 * 3 * len(r.tasks)  # accuracy and TR ratio, three orders, with their intervals
    assert any(tr["type"] == "bar" and tr.get("error_y") for f in figs for tr in f["data"])  # methods' accuracies
    assert page.count("<table>") >= 3 and html.escape(r.command) in page and "Plotly.newPlot" in page
    assert r.command.startswith("python -m backend report --model default --tasks syn-sentiment,syn-antonym")
    assert " --prompts 4 " in r.command and " --ltv-perturbations 4" in r.command
    for row in r.summary:
        assert html.escape(row.finding, quote=False) in page


def test_every_verdict_carries_its_test_p_q_effect_and_ci(report):
    _, r = report
    tested = [row for row in r.summary if row.verdict not in ("not run", "not tested")]
    assert len(tested) >= 10, [(row.key, row.verdict) for row in r.summary]
    assert r.rule == V.RULE and "Benjamini-Hochberg" in r.markdown and "2/3" in r.markdown
    for row in tested:
        assert row.test and row.correction == "Benjamini-Hochberg" and row.tests, row.key
        assert row.ours.startswith(row.verdict)
        for t in row.tests:
            assert t.test and 0 < t.p <= 1 and t.p - 1e-12 <= t.q <= 1 and t.outcome in ("for", "against", "neither")
            assert t.direction in (-1, 1) and t.n > 0
            assert t.ci is not None or t.ci_note, (row.key, t)
            if t.ci is not None and t.effect is not None and math.isfinite(t.effect):
                assert t.ci[0] - 1e-9 <= t.ci[1], (row.key, t)
        # the verdict is the rule applied to the per-task outcomes
        per_task = V.task_outcomes([t.model_dump() for t in row.tests])
        assert row.verdict == V.decide(list(per_task.values())), row.key
        if any(t.ci for t in row.tests):
            assert row.detectable, row.key
        # the report shows every test beside the paper's figure
        assert row.paper_figure and html.escape(row.finding, quote=False) in html.escape(r.markdown, quote=False)
    assert "| task | k | effect | 95% CI | p | q (BH) | outcome |" in r.markdown


def test_the_rule_turns_per_task_outcomes_into_verdicts():
    assert V.decide(["for", "for", "neither"]) == "holds"  # 2 of 3 is 2/3
    assert V.decide(["for", "for", "for", "neither", "neither"]) == "partly"  # 3 of 5 < 2/3
    assert V.decide(["for", "for", "against"]) == "partly"  # one task against: never holds
    assert V.decide(["for"]) == "holds" and V.decide(["for", "neither", "neither"]) == "partly"
    assert V.decide(["neither", "against"]) == V.decide([]) == V.decide(["neither"]) == "does not hold"
    assert V.task_outcomes([{"task": "a", "outcome": "neither"}, {"task": "a", "outcome": "for"},
                            {"task": "b", "outcome": "against"}, {"task": "b", "outcome": "neither"}]) == {
        "a": "for", "b": "against"}


def _t(task: str, p: float, effect: float, direction: int = 1) -> dict:
    return {"task": task, "test": "t", "p": p, "effect": effect, "ci": [effect - 0.1, effect + 0.1],
            "direction": direction, "n": 30, "sd": 0.5}


def test_correction_and_direction_decide_each_tasks_outcome():
    # BH over 3 tests: p = 0.01, 0.03, 0.04 -> q = 0.03, 0.04, 0.04 (all under 0.05); p = 0.2 stays out
    f = V.finding([_t("a", 0.01, 0.3), _t("b", 0.03, 0.2), _t("c", 0.04, 0.1), _t("d", 0.2, 0.1)])
    assert [round(t["q"], 4) for t in f["tests"]] == [0.04, 0.0533, 0.0533, 0.2]
    assert f["per_task"] == {"a": "for", "b": "neither", "c": "neither", "d": "neither"} and f["verdict"] == "partly"
    # significant the wrong way: against, and the finding cannot hold
    f = V.finding([_t("a", 1e-4, 0.3), _t("b", 1e-4, 0.3), _t("c", 1e-4, -0.3)])
    assert f["per_task"] == {"a": "for", "b": "for", "c": "against"} and f["verdict"] == "partly"
    f = V.finding([_t("a", 1e-4, -0.3, -1), _t("b", 1e-4, -0.2, -1), _t("c", 0.5, 0.1, -1)])
    assert f["verdict"] == "holds" and f["n_for"] == 2 and f["detectable"].startswith("0.26 (30 prompts")
    assert V.finding([])["verdict"] == "not tested"


def test_a_composite_needs_every_part_in_its_direction():
    a, b = _t("x", 0.001, 0.3), _t("x", 0.02, 0.1)
    both = V.both(a, b)
    assert both["p"] == 0.02 and both["effect"] == 0.3 and len(both["parts"]) == 2  # the main part's effect
    wrong = V.both(a, _t("x", 0.001, -0.3))
    assert wrong["p"] == 1.0  # a part the wrong way cannot support the whole
    # non-inferiority: a one-sided part counts when significant whatever its sign
    same = np.array([1.0, 0, 1, 1, 0, 1, 1, 1] * 5)
    ni = V.noninferior(same, same, margin=0.2)
    assert ni["effect"] == 0 and ni["p"] < 0.001 and V.both(a, ni)["p"] == 0.001
    far = V.noninferior(np.zeros(40), np.ones(40), margin=0.2)
    assert far["p"] == 1.0


def test_the_tests_on_known_data():
    x = np.array([1.0, 0, 1, 1, 0, 1, 0, 1])
    t = V.paired(x, x, +1)
    assert t["effect"] == 0 and t["p"] == 1.0 and t["ci"] == [0.0, 0.0]  # identical arms
    big = V.paired(np.ones(30), np.zeros(30), +1)
    assert big["effect"] == 1 and big["p"] < 1e-8 and "McNemar" in big["test"]
    w = V.welch(1.0, 0.5, 40, 0.0, 0.5, 40, +1)
    assert w["p"] < 1e-10 and w["ci"][0] < 1.0 < w["ci"][1]
    m, sd, n = V.pooled_summary([(0.0, 1.0, 10), (2.0, 1.0, 10)])
    z = np.concatenate([np.r_[np.full(5, -1.0), np.full(5, 1.0)], np.r_[np.full(5, 1.0), np.full(5, 3.0)]])
    assert n == 20 and math.isclose(m, z.mean()) and math.isclose(sd, z.std(ddof=1))
    score = np.zeros((4, 4))
    score[0] = 1.0  # set a: layer 0, set b: layer 3
    h = V.head_sets(score, [(0, i) for i in range(4)], [(3, i) for i in range(4)], +1)
    assert h["effect"] == 1 and h["p"] < 0.05 and h["ci"] == [1.0, 1.0]
    tr = V.trend([0, 1, 2, 3], {"a": [0.1, 0.2, 0.3, 0.4], "b": [1, 2, 3, 4]}, +1)
    assert tr["effect"] == 1 and math.isclose(tr["p"], 2 / 24)
    g = V.group_permutation(np.array([[0, 9, 1, 1], [9, 0, 1, 1], [1, 1, 0, 9], [1, 1, 9, 0]]), "aabb", +1)
    assert g["effect"] == 8 and math.isclose(g["p"], 1 / 3)  # 3 ways to split 4 tasks in 2 pairs: p >= 1/3
    assert V.group_permutation(np.eye(2), "ab", +1)["untestable"]


def test_a_rerun_reads_each_section_from_the_section_cache(shared_cache, tmp_path, monkeypatch):
    """bench/real_findings.py's resumability: a section measured once is read back, equal to the fresh one."""
    from backend.analysis.findings.report import measure_model
    from backend.tasks.registry import builtin_by_names

    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(shared_cache))
    lm = load_model("default")
    tasks = [(t.name, t) for t in builtin_by_names(["syn-sentiment"], "findings")]
    a = argparse.Namespace(seeds=[0], prompts=4, shots=2, random_sets=1, site_prompts=4, site_tasks="",
                           ltv_main_tasks="syn-sentiment", ltv_tasks="", ltv_layers="quarters", ltv_prompts=4,
                           ltv_shots=2, ltv_perturbations=4, site_recipe={}, ltv_recipe={"epochs": 1, "train_prompts": 4,
                                                                                         "val_prompts": 4},
                           light="", section_cache=tmp_path / "sections")
    logs: list[str] = []
    fresh = measure_model(lm, "default", "default", tasks, a, ["tsla", "ltv"], log=logs.append)
    assert len(list((tmp_path / "sections").glob("default-*.json"))) == 2 and not fresh.get("tsla_cached")
    again = measure_model(lm, "default", "default", tasks, a, ["tsla", "ltv"], log=logs.append)
    assert again["tsla"] == fresh["tsla"] and again["ltv"] == fresh["ltv"]
    assert again["tsla_cached"] and again["tsla_seconds"] == fresh["tsla_seconds"]
    assert sum("read from" in m for m in logs) == 2
    a.prompts = 5  # another setting: another key, measured afresh
    assert not measure_model(lm, "default", "default", tasks, a, ["tsla"]).get("tsla_cached")


def test_markdown_tables_lists_and_code_become_html():
    out = markdown_html("## Head\n\nText with `code` and **bold**.\n\n- one\n  more\n- two\n\n| a | b |\n|---|---|\n"
                        "| 1 | <x> |")
    assert "<h2>Head</h2>" in out and "<code>code</code>" in out and "<b>bold</b>" in out
    assert "<li>one more</li><li>two</li>" in out and "<td>&lt;x&gt;</td>" in out and "---" not in out


def test_the_report_command_writes_one_file(tmp_path, report):
    from backend.cli import main

    out = tmp_path / "r.html"
    args = ["report", "--model", "default", "--tasks", "syn-sentiment,syn-antonym", "--out", str(out)]
    for k, v in TINY.items():
        if k != "tasks":
            args += [f"--{k.replace('_', '-')}", str(v)]
    assert main(args) == 0 and out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", "--model", "default", "--tasks", "no-such-task", "--out", str(out)]) == 2
    assert main(["report", "--model", "default", "--tasks", "syn-sentiment", "--out", str(tmp_path)]) == 2
