"""Head maps with their uncertainty and their tests (issue 27, items 1 and 2): per-prompt maps, SE, bootstrap
intervals, top-k stability, the TR null of random label subspaces, the TL sign-flip test and BH across heads."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from backend.analysis.primitives import map_stats as ms
from backend.analysis.primitives.tr_null import BANDS, band, build_null, n_draws, null_rows, null_tr_sum
from backend.analysis.primitives.tsla import label_space, tsla
from backend.analysis.results import pack_array
from backend.analysis.tsla.scoring_pass import MAP_NAMES, PER_PROMPT, score_heads
from backend.analysis.tsla.head_scores import HeadMapsResult
from test_core_invariants import encoded


def test_se_is_the_closed_form():
    x = np.arange(24, dtype=float).reshape(6, 2, 2) ** 1.5
    se = ms.uncertainty(x)["se"]
    np.testing.assert_allclose(se, x.std(axis=0, ddof=1) / math.sqrt(6), rtol=1e-12)
    assert np.isnan(ms.uncertainty(x[:1])["se"]).all()  # one prompt: no standard error


def test_the_anytime_interval_is_mean_plus_minus_z_se():
    """An anytime view's interval (`normal_interval`): SE as the final one's, mean +- 1.959964 SE around the mean
    given, covering it; NaN under 2 prompts."""
    x = np.random.default_rng(3).normal(0.5, 1.0, size=(9, 2, 3))
    iv = ms.normal_interval(x)
    np.testing.assert_allclose(iv["se"], ms.uncertainty(x)["se"], rtol=1e-12)
    np.testing.assert_allclose(iv["ci_high"] - x.mean(0), 1.959963984540054 * iv["se"], rtol=1e-9)
    np.testing.assert_allclose(x.mean(0) - iv["ci_low"], iv["ci_high"] - x.mean(0), rtol=1e-9)
    assert np.all(iv["ci_low"] < x.mean(0)) and np.all(x.mean(0) < iv["ci_high"])
    centred = ms.normal_interval(x, mean=np.zeros((2, 3)))
    np.testing.assert_allclose(centred["ci_low"], -centred["ci_high"], rtol=1e-12)
    assert all(np.isnan(v).all() for v in ms.normal_interval(x[:1]).values())


def test_bootstrap_ci_covers_the_mean_and_is_seeded():
    rng = np.random.default_rng(3)
    x = rng.normal(1.0, 2.0, size=(40, 3, 4))
    a, b, c = ms.uncertainty(x, seed=7), ms.uncertainty(x, seed=7), ms.uncertainty(x, seed=8)
    mean = x.mean(0)
    assert (a["ci_low"] < mean).all() and (mean < a["ci_high"]).all()
    assert np.array_equal(a["ci_low"], b["ci_low"]) and np.array_equal(a["ci_high"], b["ci_high"])
    assert not np.array_equal(a["ci_low"], c["ci_low"])
    # about mean +- 1.96 SE for a normal sample
    np.testing.assert_allclose(a["ci_high"] - a["ci_low"], 2 * 1.96 * a["se"], rtol=0.25)


def test_seeds_pooled_and_resampled_within_seed():
    """Two seeds' prompts pooled: each resample keeps each seed's count; one group is the plain bootstrap."""
    groups = np.array([0] * 5 + [1] * 7)
    c = ms.counts(12, groups, n_boot=200, seed=1)
    assert (c[:, :5].sum(1) == 5).all() and (c[:, 5:].sum(1) == 7).all()
    from backend.analysis.primitives.stats import bootstrap_ci
    x = np.random.default_rng(0).normal(size=(12, 2, 2))
    lo, hi = bootstrap_ci(x, seed=4)
    u = ms.uncertainty(x, groups=np.zeros(12), seed=4)
    assert np.array_equal(lo, u["ci_low"]) and np.array_equal(hi, u["ci_high"])


def test_stability_is_one_for_a_head_far_above_the_rest():
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, size=(30, 3, 4))
    x[:, 1, 2] += 50
    s = ms.stability(x, k=1, seed=0)
    assert s[1, 2] == 1.0 and s.sum() == pytest.approx(1.0)
    assert ms.stable(s) == [(1, 2)]
    s3 = ms.stability(x, k=3, seed=0)
    assert s3.sum() == pytest.approx(3.0) and s3[1, 2] == 1.0


def test_bh_matches_a_hand_computation():
    p = np.array([[0.01, 0.04], [0.03, 0.20]])
    # sorted 0.01, 0.03, 0.04, 0.20 (m = 4): p m / rank = 0.04, 0.06, 0.0533, 0.20; running min from the top
    out = ms.significance(p, 30)
    np.testing.assert_allclose(out["q"], [[0.04, 0.05333333333333334], [0.05333333333333334, 0.20]])
    assert out["significant"] == [(0, 0)]


def test_one_prompt_has_no_test_no_stability_and_no_significant_heads():
    """Issue 36, defect 6: on one prompt the TR null and the TL sign flips still give p-values (the TR null's
    floor, 1/1001, under every head that beats its random subspaces), so nothing may call a head significant: no p,
    no q, `significant` None (not an empty list: no test ran), stability NaN (every resample is that prompt)."""
    p = np.full((2, 3), 1 / 1001)
    out = ms.significance(p, 1)
    assert out["significant"] is None and np.isnan(out["p"]).all() and np.isnan(out["q"]).all()
    assert ms.significance(p, 2)["significant"] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    x = np.random.default_rng(0).normal(size=(1, 2, 3))
    assert np.isnan(ms.stability(x, k=2)).all() and ms.stable(ms.stability(x, k=2)) == []
    assert all(np.isnan(v).all() for v in ms.uncertainty(x).values())


def _synthetic(seed: int, planted: float, prompts: int = 30, heads: int = 40, d: int = 48, vocab: int = 3000):
    """Random writes (prompts, heads, d) against one label set; head 0 writes `planted` x (U[gold] - U[other]) + noise.
    Returns (observed mean TR (heads,), null means (R, heads), R)."""
    g = torch.Generator().manual_seed(seed)
    unembed = torch.randn(vocab, d, generator=g)
    labels = [[1500, 2400]]
    gold = [int(i % 2) for i in range(prompts)]
    o = torch.randn(prompts, heads, d, generator=g)
    u = unembed[labels[0]]
    for i, gi in enumerate(gold):
        o[i, 0] += planted * (u[gi] - u[1 - gi])
    lab = labels * prompts
    st = tsla(o, label_space(unembed, lab, gold))
    null = build_null(unembed, lab, 1000, seed)
    nt = null_tr_sum(o, null, null_rows(null, lab)) / prompts  # (heads, R)
    return st.tr.mean(0).numpy(), nt.T.numpy(), null.draws


def test_tr_null_finds_a_planted_head_and_not_the_random_ones():
    pnull = []
    for seed in range(3):
        obs, null, R = _synthetic(seed, planted=3.0)
        p = ms.tr_p(obs, null)
        assert p[0] == 1 / (R + 1)  # the planted head beats every random subspace
        pnull.extend(p[1:])
        sig = ms.significance(p[None], 30)["significant"]  # as one layer of 40 heads
        assert (0, 0) in sig and len(sig) <= 3
    pnull = np.array(pnull)
    assert 0.35 < pnull.mean() < 0.65  # about uniform under the null
    assert (pnull < 0.05).mean() < 0.12


def test_random_subspaces_are_frequency_matched_and_keep_their_size():
    unembed = torch.randn(1600, 16)
    null = build_null(unembed, [[5, 7, 1500]], 200, seed=0)
    # every draw replaces a label token by a row of its own id band, two labels of one band by distinct rows
    rows = null.rows
    ids = torch.cdist(rows, unembed).argmin(1).numpy()  # the pool's token ids (rows are exact copies)
    rep = ids[null.repl.numpy()]  # (draws, 3) token ids
    assert (band(rep, 1600) == band(np.array([5, 7, 1500]), 1600)).all()
    assert (rep[:, 0] != rep[:, 1]).all()
    assert not np.isin(rep, [5, 7, 1500]).any()
    assert BANDS == 16
    assert n_draws(8) == 1000 and n_draws(270) == 2700 and n_draws(10**6) == 20_000


def test_tl_sign_flip_planted_and_null():
    rng = np.random.default_rng(0)
    tl = rng.normal(0, 1, size=(40, 2, 10))
    tl[:, 0, 0] += 1.0
    p = ms.tl_p(tl, seed=0)
    assert p[0, 0] < 1e-3
    assert 0.3 < np.delete(p.ravel(), 0).mean() < 0.7
    assert ms.significance(p, 40)["significant"][0] == (0, 0)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_head_maps_keep_per_prompt_values_and_the_same_means(arch, gpt2_tokenizer):
    """The means with the null are the means without, exactly; the per-prompt maps average to them; a random-weight
    model's heads are not found significant by the TR null."""
    from backend.model.loading import wrap
    from tiny_models import tiny_model

    lm = wrap(tiny_model(arch), gpt2_tokenizer, f"tiny-{arch}")
    enc = encoded(lm, n=12)
    plain = score_heads(lm, enc, batch_size=5)
    tested = score_heads(lm, enc, batch_size=5, null_seed=0)
    for name in MAP_NAMES:
        assert np.array_equal(getattr(plain, name), getattr(tested, name)), name
    assert plain.null_tr is None and tested.null_tr.shape == (n_draws(lm.n_layers * lm.n_heads), lm.n_layers,
                                                               lm.n_heads)
    for name in PER_PROMPT:
        assert tested.per_prompt[name].shape == (12, lm.n_layers, lm.n_heads)
        np.testing.assert_allclose(tested.per_prompt[name].mean(0), getattr(tested, name), rtol=1e-12, atol=1e-12)
    p = ms.tr_p(tested.tr, tested.null_tr)
    assert ms.significance(p, 12)["significant"] == []
    assert p.mean() > 0.15


def test_per_prompt_maps_pack_exactly_and_an_old_result_is_refused():
    x = np.random.default_rng(0).normal(size=(3, 2, 4))
    packed = pack_array(x)
    fields = dict(n_layers=2, n_heads=4, shots=1, prompts=3, **{k: np.zeros((2, 4)) for k in
                  ("tr", "tl", "dla_tr", "dla_tl", "induction", "flagged")},
                  icl=dict(accuracy=1.0, label_accuracy=1.0, tr_ratio=1.0, n=3))
    stats = {k: {"se": x[0], "ci_low": x[1], "ci_high": x[2]} for k in PER_PROMPT}
    r = HeadMapsResult.model_validate({**fields, "stats": stats, "per_prompt": {"tr": packed}})
    assert np.array_equal(r.per_prompt["tr"], x)
    assert "per_prompt" not in r.to_json()  # kept in the cache and in Python, not in JSON replies
    with pytest.raises(ValueError):  # cached before the statistics: does not fit, so it is recomputed
        HeadMapsResult.model_validate(fields)
    with pytest.raises(ValueError, match="bytes do not fit"):
        HeadMapsResult.model_validate({**fields, "stats": stats, "per_prompt": {"tr": {**packed, "shape": [3, 2, 5]}}})


def test_null_tr_is_the_projection_onto_each_drawn_subspace():
    """TR onto draw r equals ||P_r o|| with P_r the projector onto the drawn rows, also for a rank-deficient draw
    (two label tokens sharing a first token)."""
    from backend.analysis.primitives.tr_null import whitening
    from backend.analysis.primitives.tsla import gram_pinv, projector

    g = torch.Generator().manual_seed(1)
    unembed = torch.randn(800, 12, generator=g)
    lab = [[10, 20, 700], [10, 10, 300]]
    null = build_null(unembed, lab, 50, seed=2)
    o = torch.randn(2, 3, 12, generator=g)
    for i, ids in enumerate(lab):
        got = null_tr_sum(o[i:i + 1], null, null_rows(null, [ids]))  # (3, 50)
        for r in (0, 17, 49):
            rows = null.rows[null.repl[r, [null.col[t] for t in ids]]]
            want = (projector(rows) @ o[i].double().T).norm(dim=0)
            np.testing.assert_allclose(got[:, r].numpy(), want.numpy(), rtol=1e-4, atol=1e-5)
            w = whitening(rows.double() @ rows.double().T)
            np.testing.assert_allclose((w @ w.T).numpy(), gram_pinv(rows).numpy(), rtol=1e-8, atol=1e-10)
