"""The Head map's view of a result (issue 36's rough edges): colour scales that one saturating head does not flatten,
p-values at the null's floor written as bounds, how many of the outlined top heads are significant, and one prompt
said to have no interval. Pure functions of arrays and result dicts."""
from __future__ import annotations

import numpy as np
import pytest

from ui import figures
from ui.map_colors import CLIP_PCT, color_values
from ui.tsla import map_uncertainty as mu


def _saturated() -> np.ndarray:
    """A TR-like map (30 x 9, as SmolLM2's) with one head 40x above the rest (TR 26 on SmolLM2 does this)."""
    z = np.random.default_rng(0).uniform(0.1, 1.0, size=(30, 9))
    z[26, 0] = 40.0
    return z


def test_colour_scales_spread_the_heads_one_head_saturates():
    z = _saturated()
    lin, kw = color_values(z, signed=False, scale="linear")
    assert lin is z and "zmax" not in kw
    rank, kw = color_values(z, signed=False, scale="rank")  # evenly spaced, in z's order, rank 1 at the top
    assert np.allclose(np.sort(rank.ravel()), np.linspace(0, 1, z.size)) and rank[26, 0] == 1.0
    assert (np.argsort(rank.ravel(), kind="stable") == np.argsort(z.ravel(), kind="stable")).all()
    assert kw["colorbar"]["ticktext"] == [f"rank {z.size}", "rank 1"]
    same, kw = color_values(z, signed=False, scale="clip")  # values as they are, the colour range cut
    assert same is z and kw["zmax"] == pytest.approx(np.percentile(z, CLIP_PCT)) and kw["zmax"] < 1.0
    log, kw = color_values(z, signed=False, scale="log")
    assert (np.argsort(log.ravel()) == np.argsort(z.ravel())).all()  # monotone

    def share(c):  # the other heads' spread, as a share of the colour range
        others = np.delete(c.ravel(), 26 * 9)
        return (others.max() - others.min()) / (c.max() - c.min())

    assert share(lin) < 0.03 and share(log) > 0.2 and share(rank) > 0.99
    ticks = [float(t) for t in kw["colorbar"]["ticktext"]]  # the log bar labelled in TR's own units
    assert ticks[-1] == pytest.approx(z.max(), rel=1e-2) and ticks[0] == pytest.approx(z.min(), rel=1e-2)


def test_signed_maps_keep_their_sign_on_every_scale():
    z = np.array([[-3.0, -0.1, 0.0], [0.2, 0.5, 9.0]])
    for scale in ("log", "rank"):
        c, kw = color_values(z, signed=True, scale=scale)
        assert (np.sign(c) == np.sign(z)).all() and kw["zmid"] == 0.0, scale
    _, kw = color_values(z, signed=True, scale="clip")
    assert kw["zmin"] == -kw["zmax"] and kw["zmax"] == pytest.approx(np.percentile(np.abs(z), CLIP_PCT))
    fig = figures.head_heatmap(z, "tl", scale="rank")  # the figure draws the colour values, hovers the values
    heat = next(t for t in fig.data if t.type == "heatmap")
    assert np.array_equal(np.asarray(heat.z), color_values(z, True, "rank")[0]) and "rank" in heat.colorbar.title.text
    assert np.asarray(next(t for t in fig.data if t.name == "heads").customdata)[:, 0].tolist() == z.ravel().tolist()


def _scores(prompts: int = 30) -> dict:
    L, H, draws = 2, 4, 2700
    p = np.full((L, H), 0.3)
    p[0, :3] = 1 / (1 + draws)
    st = {"se": np.full((L, H), 0.01).tolist(), "ci_low": np.zeros((L, H)).tolist(), "ci_high": np.ones((L, H)).tolist(),
          "p": p.tolist(), "q": p.tolist(), "significant": [[0, 0], [0, 1], [0, 2]], "draws": draws,
          "p_floor": 1 / (1 + draws)}
    return {"prompts": prompts, "fdr": 0.05, "top_k": 4, "stable_at": 0.8, "stats": {"tr": st},
            "top_tr": [[0, 0], [0, 1], [1, 3], [1, 2]]}


def test_p_at_the_nulls_floor_is_a_bound_and_the_top_heads_significance_is_counted():
    s = _scores()
    lines = mu.hover_lines(s, "tr")
    assert "p ≤ 0.00037 (2,700 draws)" in lines[0] and "p = 0.3" in lines[4] and "≤" not in lines[4]
    assert "**2** of the top 4 are significant (q ≤ 0.05)" in mu.caption(s, "tr", False)


def test_one_prompt_says_it_has_no_interval_on_the_map():
    s = _scores(prompts=1)
    nan = np.full((2, 4), np.nan).tolist()
    s["stats"]["tr"].update(se=nan, ci_low=nan, ci_high=nan, p=nan, q=nan, significant=None)
    assert mu.caption(s, "tr", True) == "1 prompt: no interval and no test (they need 2 prompts or more)."
    assert set(mu.hover_lines(s, "tr")) == {"1 prompt: no interval and no test (they need 2 prompts or more)"}
    assert mu.significant(s, "tr") is None  # the "significant only" switch has nothing to blank by


def test_the_pages_sentence_for_one_prompt_is_the_results_warning():
    from backend.analysis.primitives import stats

    from ui import metrics as M

    assert M.too_few(1) == stats.too_few(1) and M.too_few(0) == stats.too_few(0)
    assert M.too_few(2) == "" and stats.too_few(2) is None
    t = {"effect": 1.0, "ci_low": None, "ci_high": None, "p": None, "n": 1, "test": "exact McNemar"}
    assert M.paired_text(t, "top-4 vs random") == f"top-4 vs random: +100 pts ({stats.too_few(1)})"
