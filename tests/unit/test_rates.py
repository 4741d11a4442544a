"""Issue 27, items 3 and 4: every rate with its 95% interval, paired tests where two arms share the prompts.

On the committed default model (`models/headlens-tiny`, trained for in-context learning, so ablating heads has an
effect to find): each kind's interval contains its rate; a paired test of identical arms gives p = 1; a planted
effect (every head ablated) gives a small p. The intervals come from the outcomes already computed (no extra pass).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from backend.analysis.kernel import analyze
from backend.analysis.primitives import stats as S
from backend.analysis.primitives.patch import recovered_share, recovered_stderr
from backend.analysis.results import Metrics

RATES = ("accuracy", "label_accuracy", "tr_ratio")


@pytest.fixture(scope="module")
def lm():
    from backend.model.loading import load_model

    return load_model("default", device="cpu")


@pytest.fixture(scope="module")
def task():
    from backend.tasks import load_task

    return load_task("syn-antonym")


def _inside(rate: float, ci) -> bool:
    return ci is not None and ci[0] - 1e-12 <= rate <= ci[1] + 1e-12


def _metrics_ok(m) -> None:
    for r in RATES:
        assert _inside(getattr(m, r), getattr(m, f"{r}_ci")), (r, m)


def test_metrics_intervals_and_outcomes_round_trip():
    m = Metrics.model_validate({"accuracy": 0.7, "label_accuracy": 1.0, "tr_ratio": 0.0, "n": 10})
    assert m.accuracy_ci == pytest.approx(S.rate_ci_of(0.7, 10)) and m.label_accuracy_ci[1] == 1.0
    assert m.tr_ratio_ci[0] == 0.0 and m.outcomes() is None  # a result cached before: intervals from rate and n
    from backend.analysis.primitives.predict import metrics

    c, lc, il = np.array([1, 0, 1, 1], bool), np.array([1, 1, 0, 1], bool), np.array([0, 1, 1, 1], bool)
    m = Metrics.model_validate(metrics(c, lc, il))
    _metrics_ok(m)
    u = m.outcomes()
    assert np.array_equal(u["correct"], c) and np.array_equal(u["label_correct"], lc)
    assert np.array_equal(u["in_labels"], il) and m.per_prompt == "3657"
    json.dumps(m.model_dump(mode="json"))


def test_icl_curve_intervals(lm, task):
    r = analyze("icl", lm, task, shots=[0, 4], prompts=20, examples=0, cache=False)
    for r_ in RATES:
        assert len(getattr(r, f"{r_}_ci")) == 2
        assert all(_inside(v, ci) for v, ci in zip(getattr(r, r_), getattr(r, f"{r_}_ci")))


def test_ablation_curves_intervals_and_tests_against_random(lm, task):
    r = analyze("ablation_curves", lm, task, ks=[0, 4, 16], shots=4, prompts=20, cache=False)
    for name, c in r.curves.items():
        for r_ in RATES:
            assert all(_inside(v, ci) for v, ci in zip(getattr(c, r_), getattr(c, f"{r_}_ci"))), (name, r_)
        if name == "random":
            assert c.vs_random is None
            continue
        t0 = c.vs_random["accuracy"][0]  # k = 0: the same unablated run on both sides
        assert t0.effect == 0.0 and t0.p == 1.0
        for r_ in RATES:
            for v, t, rand in zip(getattr(c, r_), c.vs_random[r_], getattr(r.curves["random"], r_)):
                assert t.effect == pytest.approx(v - rand) and t.ci_low <= t.effect <= t.ci_high
    # the top 16 of 32 heads of a model trained for ICL, against 16 random ones: found on 20 prompts
    assert min(c.vs_random["accuracy"][-1].p for n, c in r.curves.items() if n != "random") < 0.01


def test_ablate_identical_arms_give_p_one_and_a_planted_effect_is_found(lm, task):
    none = analyze("ablate", lm, task, heads=[], shots=4, prompts=20, cache=False)
    _metrics_ok(none.before)
    for r_ in RATES:
        t = none.test[r_]
        assert t.effect == 0.0 and t.p == 1.0 and t.n == none.prompts
    every = [(l, h) for l in range(lm.n_layers) for h in range(lm.n_heads)]
    all_off = analyze("ablate", lm, task, heads=every, shots=4, prompts=20, cache=False)
    _metrics_ok(all_off.after)
    t = all_off.test["accuracy"]
    assert t.effect == pytest.approx(all_off.after.accuracy - all_off.before.accuracy) and t.effect < -0.5
    assert t.p < 0.001 and t.test == "exact McNemar" and t.ci_high < 0


def test_steer_and_geometry_intervals(lm, task):
    s = analyze("steer", lm, task, vectors=["vanilla", "tr"], layer="all", shots=4, prompts=12, cache=False)
    _metrics_ok(s.zero_shot)
    _metrics_ok(s.icl)
    for v in s.vectors.values():
        for r_ in RATES:
            assert all(_inside(a, ci) for a, ci in zip(getattr(v, r_), getattr(v, f"{r_}_ci")))
    g = analyze("geometry", lm, task, shots=4, prompts=12, cache=False)
    for cond in g.conditions.values():
        for ms in cond.values():
            assert all(lo - 1e-9 <= m <= hi + 1e-9 for m, lo, hi in zip(ms.mean, ms.ci_low, ms.ci_high))


def test_recovered_stderr_is_the_delta_method():
    rng = np.random.default_rng(0)
    target = rng.normal(size=30)
    clean = target + 2.0  # a constant gap: R = mean(a) / 2, se = sd(a) / (sqrt(n) 2) exactly
    patched = target[None] + rng.normal(1.0, 0.5, size=(5, 30))
    r, gap = recovered_share(patched, clean, target)
    se = recovered_stderr(patched, clean, target)
    a = patched - target[None]
    assert np.allclose(se, a.std(1, ddof=1) / np.sqrt(30) / 2.0)
    assert np.all(recovered_stderr(patched, target, target) == 0.0)  # no gap: R is 0, and so its error


def test_patching_standard_errors(lm, task):
    r = analyze("patching", lm, task, shots=4, prompts=12, cache=False)
    for name in ("recovered", "logit_gain", "prob_gain"):
        se = getattr(r, f"{name}_se")
        assert se.shape == getattr(r, name).shape and np.all(np.isfinite(se)) and np.all(se >= 0)
    assert r.logit_gain_se.max() > 0
    _metrics_ok(r.clean)
    _metrics_ok(r.target_metrics)


def test_ltv_paired_tests(lm, task):
    r = analyze("ltv", lm, task, layer=2, epochs=2, train_prompts=12, val_prompts=4, prompts=12, shots=2, top_k=4,
                mechanism=False, cache=False)
    for m in r.table.values():
        _metrics_ok(m)
    tests = r.per_layer[0].tests
    assert {"ltv vs vanilla", "ltv vs fv", "ltv vs zero_shot", "ltv vs icl"} <= set(tests)
    for name, per in tests.items():
        other = name.removeprefix("ltv vs ")
        for r_ in RATES:
            t = per[r_]
            assert t.n == r.prompts and t.ci_low <= t.effect <= t.ci_high
            assert t.effect == pytest.approx(getattr(r.table["ltv"], r_) - getattr(r.table[other], r_))
    for c, curve in r.sweep.items():
        assert all(_inside(v, ci) for v, ci in zip(curve.accuracy, curve.accuracy_ci))


def test_site_paired_tests_and_patching_by_alpha(lm):
    from backend.tasks import load_task

    t = load_task("syn-sentiment")
    r = analyze("site", lm, t, m=8, shots=2, steps=8, val_every=4, prompts=12, val_prompts=4, max_new_tokens=2,
                compare=["zero_shot", "icl"], icl_shots=[2], patching=[1, 16], budget=[], correlations=[],
                cache=False)
    _metrics_ok(r.site)
    assert _inside(r.site.exact_match, r.site.exact_match_ci)
    assert {"site vs zero_shot", "site vs icl_2"} <= set(r.tests)
    for name, per in r.tests.items():
        base = r.baselines[name.removeprefix("site vs ")].metrics
        assert per["accuracy"].effect == pytest.approx(r.site.accuracy - base.accuracy)
    pt = r.patching
    for curve in (pt.top, pt.bottom):
        assert all(_inside(v, ci) for v, ci in zip(curve.accuracy, curve.accuracy_ci))
    for j, k in enumerate(pt.ks):
        tt = pt.tests["accuracy"][j]
        assert tt.effect == pytest.approx(pt.top.accuracy[j] - pt.bottom.accuracy[j]) and tt.n == r.prompts


def test_ui_shows_intervals_tests_and_the_noise_sentence():
    from ui import figures
    from ui import metrics as M

    m = {"accuracy": 0.833, "accuracy_ci": [0.71, 0.91]}
    assert M.pct_ci(m, "accuracy") == "83.3% [71–91%]" and M.pct_ci({"accuracy": 0.5}, "accuracy") == "50.0%"
    t = {"effect": -0.42, "ci_low": -0.55, "ci_high": -0.30, "p": 0.0002, "n": 30, "test": "exact McNemar"}
    assert M.paired_text(t, "top-k vs random") == ("top-k vs random: −42 pts [−55, −30], p < 0.001 (exact McNemar, "
                                                   "30 prompts)")
    assert M.noise_sentence(30) == "30 prompts: differences under about 0.18 are within noise."
    assert M.noise_floor(30) == pytest.approx(S.noise_floor(30))
    icl = figures.icl_curve({"shots": [0, 2], "accuracy": [0.5, 0.75], "accuracy_ci": [[0.3, 0.7], [0.55, 0.9]],
                             "label_accuracy": [0.9, 1.0], "tr_ratio": [0.1, 0.9]})
    bars = icl.data[0].error_y
    assert list(bars.array) == pytest.approx([20.0, 15.0]) and list(bars.arrayminus) == pytest.approx([20.0, 20.0])
    assert icl.data[1].error_y.array is None  # a rate without an interval draws no bars
    abl = {"ks": [0, 4], "curves": {
        "tr": {"accuracy": [0.9, 0.2], "accuracy_ci": [[0.7, 0.97], [0.1, 0.4]]},
        "random": {"accuracy": [0.9, 0.8], "accuracy_std": [0, 0.1], "accuracy_ci": [[0.7, 0.97], [0.6, 0.9]],
                   "seeds": [0, 1, 2]}}}
    fig = figures.ablation_curves(abl)
    band = next(t for t in fig.data if t.fill == "toself")
    assert list(band.y) == pytest.approx([97.0, 90.0, 60.0, 70.0])  # the random sets' interval, not ± sd
    top = next(t for t in fig.data if t.name == "top TR")
    assert list(top.error_y.array) == pytest.approx([7.0, 20.0])
    assert "random (mean, 95% interval)" in {t.name for t in fig.data}


def test_methods_rows_carry_intervals(lm, task):
    r = analyze("methods", lm, task, shots=2, prompts=8, site_m=4, site_shots=2, site_steps=4, cache=False)
    assert {"zero_shot", "icl", "site"} <= {row.key for row in r.rows}
    for row in r.rows:
        for r_ in RATES:
            assert _inside(getattr(row, r_), getattr(row, f"{r_}_ci")), (row.key, r_)
        assert row.n and row.n > 0
