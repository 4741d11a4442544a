"""What leaves the dashboard: the self-contained HTML file (backend/report/html_export.py), the CLI lines it carries
(ui/snippets.cli, parsed back by the real CLI to the same parameters) and figure file names (ui/share.py)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _figure():
    import plotly.graph_objects as go

    fig = go.Figure(go.Heatmap(z=np.array([[0.1, 0.9], [0.4, -0.2]]), x=["<s>", "b"], y=[0, 1]))
    fig.update_layout(title="TR: task recognition </script><script>alert(1)</script>")
    return fig


def test_page_html_is_self_contained_and_holds_figures_settings_numbers_and_commands():
    from backend.report.html_export import page_html, plotly_js

    kw = dict(figures=[{"title": "TR map", "figure": _figure(), "filename": "tr-map"}],
              settings={"model": "default", "task": "syn-sentiment", "shots": "8"},
              tables=[{"title": "Top heads", "columns": ["head", "tr"], "rows": [["L1.H2", 0.123456], ["<b>", None]]}],
              commands=["python -m backend scores --model default --task syn-sentiment --shots 8"],
              link="http://127.0.0.1:8501/Head_map?task=syn-sentiment", created="2026-01-01 00:00 UTC")
    full, text = page_html("Head map", **kw), page_html("Head map", include_plotlyjs=False, **kw)
    assert len(full) > 3_000_000 and full.replace(f'<script type="text/javascript">{plotly_js()}</script>\n', "") == text
    assert "Plotly.newPlot" in text and not re.search(r"<script[^>]+src=|<link|@import|https?://(?!127\.0\.0\.1)", text)
    assert text.count("</script>") == text.count("<script")  # the title's </script> did not end a script early
    data = re.search(r'<script type="application/json" class="hl-figure"[^>]*>(.*?)</script>', text, re.S).group(1)
    fig = json.loads(data)
    assert fig["data"][0]["type"] == "heatmap" and fig["layout"]["title"]["text"].startswith("TR: task recognition")
    assert 'data-filename="tr-map"' in text
    assert "python -m backend scores --model default --task syn-sentiment --shots 8" in text
    assert "<td>syn-sentiment</td>" in text and '<td class="num">0.1235</td>' in text and "<td>&lt;b&gt;</td>" in text
    assert "<td>—</td>" in text  # a missing value
    assert "Head_map?task=syn-sentiment" in text


def test_page_html_needs_no_torch():
    code = "import sys, backend.report.html_export as h; h.page_html('x', include_plotlyjs=False); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


CASES = [
    ("scores", {"model": "default", "task": "syn-sentiment", "shots": 8, "prompts": 50, "seed": 0, "top_pct": 3.0}),
    ("icl", {"model": "default", "task": "syn-antonym", "shots": [0, 1, 2, 4, 8], "prompts": 20, "seed": 1,
             "examples": 3}),
    ("ablate", {"model": "default", "task": "syn-sentiment", "shots": 8, "prompts": 20, "seed": 0,
                "heads": [[1, 2], [3, 0]], "mode": "mean"}),
    ("head", {"model": "default", "task": "syn-sentiment", "shots": 4, "prompts": 16, "seed": 0, "head": [2, 5],
              "prompt": 3, "logit_lens": True, "text": "a b\nc 'quoted' -1"}),
    ("geometry", {"model": "default", "task": "syn-sentiment", "shots": 8, "prompts": 20, "seed": 0, "layer": 2,
                  "alpha": -1.5, "final_norm": False, "top_k": 4}),
    ("steer", {"model": "default", "task": "syn-sentiment", "shots": 8, "prompts": 20, "seed": 0, "layer": "all",
               "vectors": ["tr", "random"], "alpha": 1.0}),
    ("ltv", {"model": "default", "task": "syn-antonym", "shots": 8, "prompts": 20, "seed": 0, "layer": "all",
             "positions": [-1, -2], "lr": 0.005, "epochs": 10, "batch_size": 4, "units": "residual"}),
    ("patching", {"model": "default", "task": "syn-sentiment", "shots": 8, "prompts": 20, "seed": 0,
                  "target": "zero_shot", "patch": "paired", "top_pct": 3.0}),
]


@pytest.mark.parametrize("kind,params", CASES, ids=[c[0] for c in CASES])
def test_the_cli_line_parses_back_to_the_same_parameters(kind, params):
    """The command in an HTML file is the page's job: the real CLI parser reads it back to the very parameters the
    page sent (its params model's validation of both)."""
    import shlex

    from backend.analysis.kinds import get_kind
    from backend.cli import build_parser, negative_lists, read_params
    from ui import api, snippets

    spec = get_kind(api.kind_name(kind))
    defaults = {spec.name: {n: f.get_default(call_default_factory=True) for n, f in spec.params.model_fields.items()
                            if not f.is_required()}}
    line = snippets.cli(kind, params, defaults, out="out.json")
    argv = shlex.split(line)
    assert argv[:3] == ["python", "-m", "backend"] and argv[3] == spec.cli
    a = build_parser().parse_args(negative_lists(argv[3:]))
    assert a.model == params["model"] and a.task == params["task"] and a.out == "out.json"
    got = read_params(spec.params, a)
    want = spec.params.model_validate({k: v for k, v in params.items() if k not in ("model", "task")})
    assert got.model_dump(exclude={"batch_size"}) == want.model_dump(exclude={"batch_size"})


def test_an_upload_is_named_by_its_file_on_the_command_line():
    from ui import snippets

    line = snippets.cli("scores", {"model": "default", "task": "upload:abc123", "shots": 4}, task_file="my data.csv")
    assert "--task 'my data.csv'" in line and "upload:" not in line


def test_figure_file_names_carry_model_task_shots_and_heads():
    from ui import share, state

    s = state.Settings(model="smollm2-135m", task="present-past", shots=10, prompts=50, seed=0, top_k=4)
    assert share.file_stem("headmap-tr", s=s) == "headlens_smollm2-135m_present-past_10shot_top4_headmap-tr"
    assert share.file_stem("attention", heads=[(3, 5)], s=s).endswith("_10shot_L3.H5_attention")
    assert share.file_stem("x", heads=[(1, 2), (0, 1)], s=s).endswith("_L1.H2+L0.H1_x")
    assert share.file_stem("x", heads=[(i, 0) for i in range(6)], s=s).endswith("_6heads_x")
    s2 = state.Settings(model="/models/my model", task="upload:ab", shots=0, prompts=5, seed=0, task_name="a b.csv")
    assert share.file_stem("icl", heads="", s=s2) == "headlens_models-my-model_a-b.csv_0shot_icl"


def test_the_dashboard_warm_up_imports_the_pages_modules_without_torch():
    code = ("import os, sys; os.environ.pop('HEADLENS_BACKEND_URL', None); from ui.warm import warm; warm(); "
            "assert 'torch' not in sys.modules and 'ui.head_view' in sys.modules and 'pandas' in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_the_head_maps_file_states_the_significance_switch():
    """The Head map's file names the *Significant heads only* switch, off too (the link leaves a default out)."""
    from ui import share

    q = {"model": "default", "task": "syn-sentiment", "shots": "8", "map": "tr"}
    assert share.page_settings("Head map", q)["significant heads only"] == "0"
    assert share.page_settings("Head map", {**q, "sig_only": "1"})["significant heads only"] == "1"
    assert "significant heads only" not in share.page_settings("Ablation", {**q, "sig_only": "1"})


def test_the_head_maps_html_table_holds_each_heads_interval_and_test():
    """The per-head table of the file: SE, 95% CI, p, q and stability of the map, with their numbers."""
    import pandas as pd

    from ui import share
    from ui.tsla import map_uncertainty as mu

    rng = np.random.default_rng(0)
    grid = lambda: rng.uniform(0.01, 0.9, size=(2, 3))  # noqa: E731
    scores = {"stats": {"tr": {f: grid() for f in ("se", "ci_low", "ci_high", "p", "q")},
                        "dla_tr": {f: grid() for f in ("se", "ci_low", "ci_high")}},
              "stability": {"tr": grid(), "tl": grid()}}
    extra = mu.table_columns(scores)
    cols = mu.stat_columns("tr", extra)
    assert cols == ["tr_se", "tr_ci_low", "tr_ci_high", "tr_p", "tr_q", "tr_stability"]
    assert mu.stat_columns("dla_tr", extra) == ["dla_tr_se", "dla_tr_ci_low", "dla_tr_ci_high"]
    frame = pd.DataFrame([{"head": f"L{l}.H{h}", "tr": 0.5, **{c: float(v[l, h]) for c, v in extra.items()}}
                          for l in range(2) for h in range(3)])
    rec = share.Record("Head map", settings={"model": "default", "sig_only": "1"})
    rec.tables["Top heads"] = {"title": "Top heads", "frame": frame, "columns": ["head", "tr", *cols]}
    text = share.build(rec)
    head = re.search(r"<thead><tr>((?:<th>[^<]*</th>)+)</tr></thead><tbody><tr><td>L0\.H0</td>", text).group(1)
    assert re.findall(r"<th>([^<]*)</th>", head) == ["head", "tr", *cols]
    assert f'<td class="num">{extra["tr_ci_low"][0, 0]:.4g}</td>' in text
    assert f'<td class="num">{extra["tr_q"][0, 0]:.4g}</td>' in text
    assert "<td>significant heads only</td><td>1</td>" in text
