"""The statistics primitives (backend/analysis/primitives/stats.py): intervals that cover, tests that keep their
nominal rate under the null, find a planted effect, and give p = 1 on identical arms."""
from __future__ import annotations

import numpy as np
import pytest

from backend.analysis.primitives import stats as S


def test_wilson_known_values_and_edges():
    lo, hi = S.wilson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)  # the textbook 0/10 interval
    lo, hi = S.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = S.wilson(np.array([0, 3]), np.array([0, 3]))
    assert lo[0] == 0.0 and hi[0] == 1.0 and hi[1] == 1.0 and lo[1] < 1.0


def test_wilson_covers_at_nominal_rate():
    rng = np.random.default_rng(0)
    p, n = 0.3, 30
    k = rng.binomial(n, p, size=4000)
    lo, hi = S.wilson(k, n)
    cover = ((lo <= p) & (p <= hi)).mean()
    assert 0.92 <= cover <= 0.98, cover  # Wilson oscillates around the nominal rate on small n


def test_bootstrap_ci_contains_the_mean_and_is_seeded():
    x = np.random.default_rng(1).normal(size=(40, 3, 4))
    lo, hi = S.bootstrap_ci(x, seed=7)
    m = x.mean(0)
    assert lo.shape == hi.shape == (3, 4)
    assert np.all(lo <= m) and np.all(m <= hi)
    lo2, hi2 = S.bootstrap_ci(x, seed=7)
    assert np.array_equal(lo, lo2) and np.array_equal(hi, hi2)
    # about mean +- 1.96 se for normal data
    se = S.stderr(x)
    assert np.allclose(hi - lo, 2 * 1.96 * se, rtol=0.25)


def test_stderr_formula_and_small_samples():
    x = np.array([1.0, 2.0, 4.0])
    assert S.stderr(x) == pytest.approx(np.std(x, ddof=1) / np.sqrt(3))
    assert np.isnan(S.stderr(np.array([1.0])))


def test_topk_stability_finds_planted_heads():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(30, 4, 5))
    x[:, 1, 2] += 5.0
    x[:, 3, 0] += 5.0
    st = S.topk_stability(x, k=2, n_boot=300, seed=0)
    assert st.shape == (4, 5)
    assert st[1, 2] == 1.0 and st[3, 0] == 1.0
    assert st.sum() == pytest.approx(2.0)  # every resample has exactly k heads in its top k


def test_benjamini_hochberg_hand_example_and_nan():
    q = S.benjamini_hochberg(np.array([0.01, 0.04, 0.03, 0.005]))
    assert np.allclose(q, [0.02, 0.04, 0.04, 0.02])
    q = S.benjamini_hochberg(np.array([[0.5, np.nan], [0.01, 1.0]]))
    assert np.isnan(q[0, 1]) and q[1, 0] == pytest.approx(0.03) and q[1, 1] == 1.0


def test_benjamini_hochberg_controls_fdr_under_the_null():
    rng = np.random.default_rng(3)
    rejected = [(S.benjamini_hochberg(rng.uniform(size=200)) <= 0.05).any() for _ in range(200)]
    assert np.mean(rejected) <= 0.09  # under the global null, FDR = FWER <= 0.05


def test_sign_flip_identical_arms_give_p_one():
    d = np.zeros((25, 3))
    assert np.all(S.sign_flip_p(d) == 1.0)
    assert np.all(S.sign_flip_p(d, "greater") == 1.0)
    assert np.all(S.sign_flip_p(np.zeros(6)) == 1.0)  # exact branch


def test_sign_flip_exact_small_sample():
    d = np.array([1.0, 2.0, 0.5, 3.0, 1.5])
    assert S.sign_flip_p(d) == pytest.approx(2 / 32)
    assert S.sign_flip_p(d, "greater") == pytest.approx(1 / 32)


def test_sign_flip_finds_a_planted_effect_and_keeps_the_null_rate():
    rng = np.random.default_rng(4)
    planted = rng.normal(0.8, 1.0, size=30)
    assert S.sign_flip_p(planted, "greater", n_perm=4000) < 0.01
    nulls = rng.normal(size=(30, 400))  # 400 null heads at once
    p = S.sign_flip_p(nulls, "greater", n_perm=2000, seed=1)
    assert p.min() > 0
    assert (p <= 0.05).mean() <= 0.08


def test_permutation_p_is_never_zero():
    null = np.random.default_rng(5).normal(size=(99, 3))
    p = S.permutation_p(np.array([100.0, 0.0, -100.0]), null)
    assert p[0] == pytest.approx(1 / 100) and p[2] == pytest.approx(1.0)


def test_paired_comparison_identical_and_binary():
    a = np.array([1, 0, 1, 1, 0, 1, 1, 0], dtype=float)
    r = S.paired_comparison(a, a.copy())
    assert r["effect"] == 0.0 and r["p"] == 1.0 and r["test"] == "exact McNemar"
    b = np.zeros(40)
    a = np.ones(40)
    r = S.paired_comparison(a, b)
    assert r["effect"] == 1.0 and r["p"] < 1e-10 and r["ci_low"] == 1.0
    with pytest.raises(ValueError, match="same length"):
        S.paired_comparison(np.ones(3), np.ones(4))


def test_one_prompt_has_no_interval_and_no_test():
    """Issue 36, defect 6: a bootstrap of one prompt gives it back (a zero-width interval); a paired test of one
    prompt is no test. Both NaN, for 0/1 arms and for others; two prompts have both."""
    lo, hi = S.bootstrap_ci(np.array([[0.3, 0.7]]))
    assert np.isnan(lo).all() and np.isnan(hi).all()
    for a, b in ((np.ones(1), np.zeros(1)), (np.array([0.4]), np.array([0.1]))):
        r = S.paired_comparison(a, b)
        assert r["n"] == 1 and r["effect"] == pytest.approx(float(a[0] - b[0]))
        assert np.isnan(r["ci_low"]) and np.isnan(r["ci_high"]) and np.isnan(r["p"])
        many = S.paired_comparisons(a[:, None].repeat(3, 1), b[:, None].repeat(3, 1))
        assert all(np.isnan(t["p"]) and np.isnan(t["ci_low"]) for t in many)
    r2 = S.paired_comparison(np.array([1.0, 0.0]), np.array([0.0, 0.0]))
    assert not np.isnan(r2["p"]) and not np.isnan(r2["ci_low"])
    assert S.too_few(1) == "1 prompt: no interval and no test (they need 2 prompts or more)" and S.too_few(2) is None


def test_sign_flips_name_the_smallest_p_the_test_gives():
    for n in (3, 13, 40):  # (at 14, 10,000 draws of 2^14 sign vectors may hold the all-plus one)
        draws, floor = S.sign_flips(n)
        assert draws == (2 ** n if n <= 13 else S.N_PERM)
        assert float(S.sign_flip_p(np.ones((n, 1)), "greater")[0]) == pytest.approx(floor)  # every sign +: the floor


def test_noise_floor_and_detectable_difference():
    assert S.noise_floor(30) == pytest.approx(0.179, abs=1e-3)
    assert S.detectable_difference(30, paired=False) > S.detectable_difference(30)
    assert S.detectable_difference(120) == pytest.approx(S.detectable_difference(30) / 2)


def test_rate_ci_is_wilson_and_contains_the_rate():
    x = np.array([1, 1, 0, 1, 0, 1, 1, 1, 0, 1])
    lo, hi = S.rate_ci(x)
    w = S.wilson(7, 10)
    assert (lo, hi) == (float(w[0]), float(w[1]))
    assert lo <= x.mean() <= hi
    assert S.rate_ci_of(0.7, 10) == (lo, hi)


def test_set_mean_ci_contains_the_mean_and_widens_with_set_spread():
    rng = np.random.default_rng(6)
    same = np.tile((rng.uniform(size=(1, 40)) < 0.5).astype(float), (4, 1))  # 4 identical random sets
    spread = same.copy()
    spread[0] = 1.0
    spread[1] = 0.0  # sets that disagree
    lo1, hi1 = S.set_mean_ci(same, seed=3)
    lo2, hi2 = S.set_mean_ci(spread, seed=3)
    assert lo1 <= same.mean() <= hi1 and lo2 <= spread.mean() <= hi2
    assert hi2 - lo2 > hi1 - lo1
    lo, hi = S.set_mean_ci(rng.uniform(size=(3, 20, 5)))
    assert lo.shape == hi.shape == (5,) and np.all(lo <= hi)
    one = S.set_mean_ci(same[:1], seed=3)  # one set: the prompts' bootstrap only
    assert one[0] <= same[0].mean() <= one[1]


def test_paired_comparisons_equal_one_call_per_column():
    rng = np.random.default_rng(7)
    a = (rng.uniform(size=(30, 3)) < 0.6).astype(float)
    b = np.column_stack([(rng.uniform(size=30) < 0.4).astype(float), rng.uniform(size=30), a[:, 2]])
    many = S.paired_comparisons(a, b, seed=2)
    for j in range(3):
        one = S.paired_comparison(a[:, j], b[:, j], seed=2)
        assert many[j]["effect"] == pytest.approx(one["effect"]) and many[j]["test"] == one["test"]
        assert many[j]["ci_low"] == pytest.approx(one["ci_low"]) and many[j]["ci_high"] == pytest.approx(one["ci_high"])
        assert many[j]["p"] == pytest.approx(one["p"])
    assert many[1]["test"] == "sign-flip permutation"
    assert many[2]["p"] == 1.0 and many[2]["effect"] == 0.0  # identical arms
    with pytest.raises(ValueError, match="same shape"):
        S.paired_comparisons(np.ones((3, 2)), np.ones((3, 1)))


def test_noise_sentence():
    assert S.noise_sentence(30) == "30 prompts: differences under about 0.18 are within noise"
