"""Kind `findings` and `python -m backend report`: the papers' findings on one model as a summary with verdicts and
one self-contained HTML file (tiny sizes on the embedded model: the numbers are meaningless, the plumbing is not)."""
from __future__ import annotations

import html
import re

import pytest

from backend.findings_html import markdown_html, report_html
from backend.analysis.kernel import analyze
from backend.models import load_model

TINY = {"tasks": ["syn-sentiment", "syn-antonym"], "prompts": 4, "shots": 2, "random_sets": 1, "site_prompts": 4,
        "ltv_prompts": 4, "ltv_perturbations": 4}
VERDICT = re.compile(r"^(holds|partly|does not hold|not run)\b")  # not run: SITE transfer needs 2 SITE tasks


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
    assert again.summary == r.summary and again.markdown == r.markdown


def test_the_html_opens_without_a_server(report):
    _, r = report
    page = report_html(r)
    assert "<script src" not in page and "http://" not in page.replace("http://www.w3.org", "")
    assert page.count("<table>") >= 3 and "figure" in page and html.escape(r.command) in page
    assert r.command.startswith("python -m backend report --model default --tasks syn-sentiment,syn-antonym")
    assert " --prompts 4 " in r.command and " --ltv-perturbations 4" in r.command
    for row in r.summary:
        assert html.escape(row.finding, quote=False) in page


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
