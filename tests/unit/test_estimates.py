"""Time estimates that hold (issue 25, item 3): the speed fit, calls counted, monotone estimates, the load factor,
the remaining time of a running job from its own progress, and no Run button for a job the service refuses.

No wall clock here: the fit and the estimate are checked on given timings and speeds (bench/bench_estimates.py
measures estimate / real).
"""
from __future__ import annotations

import math

import pytest

from backend.analysis.primitives.cost import STEP_BATCH, Sizes, Work, batches, generation, passes, steps, training
from backend.analysis.primitives.pass_speed import MIN_TOKEN_SHARE, fit
from backend.service import estimate as E


# -- the fit ------------------------------------------------------------------------------------------------
def test_fit_recovers_a_linear_cost():
    pts = [(n, 0.002 + 1e-4 * n) for n in (8, 32, 64, 128)]
    per_pass, per_token = fit(pts)
    assert per_pass == pytest.approx(0.002, rel=1e-6) and per_token == pytest.approx(1e-4, rel=1e-6)


@pytest.mark.parametrize("pts", [
    [(8, 0.01), (32, 0.01), (64, 0.01), (128, 0.01)],          # equal: all per-pass overhead
    [(8, 0.02), (32, 0.015), (64, 0.012), (128, 0.01)],        # reversed: noise on a busy CPU
    [(8, 0.002), (64, 0.002)],                                  # the two sizes of the old measurement, equal
    [(8, 0.003), (64, 0.001)],                                  # and reversed
])
def test_fit_never_zeroes_tokens_when_passes_time_alike(pts):
    per_pass, per_token = fit(pts)
    n_max, t_max = max(pts)
    assert per_token >= MIN_TOKEN_SHARE * t_max / n_max and per_token > 100 * 1e-9  # never the old 1e-9 floor
    assert per_token <= min(t / n for n, t in pts)  # never more than a whole pass per token
    assert 0 <= per_pass <= max(t for _, t in pts)
    # what it predicts for the largest pass lies within the timings (not ~0, not beyond the slowest)
    assert 0.9 * min(t for _, t in pts) <= per_pass + per_token * n_max <= 1.1 * max(t for _, t in pts)


def test_fit_ignores_an_outlier():
    pts = [(8, 0.002 + 8e-5), (32, 0.002 + 32e-5), (64, 0.002 + 64e-5), (128, 0.002 + 128e-5), (96, 5.0)]
    per_pass, per_token = fit(pts)
    assert per_token == pytest.approx(1e-5, rel=0.5) or per_token <= 0.05  # the median slope, not the outlier's
    assert per_pass < 0.05


def test_fit_refuses_nothing_to_fit():
    with pytest.raises(ValueError):
        fit([])


# -- calls -------------------------------------------------------------------------------------------------
def test_calls_are_batches():
    assert batches(0, 16) == 0 and batches(1, 16) == 1 and batches(16, 16) == 1 and batches(17, 16) == 2
    w = passes("ICL", 50, 100.0)
    assert (w.tokens, w.calls) == (5000.0, 4.0)
    assert passes("per layer", 8, 10.0, batch=16, repeat=30).calls == 30
    assert steps("configs", 8 * 12).calls == math.ceil(96 / STEP_BATCH)
    t = training("train", 40, 10.0, batch=4)
    assert (t.calls, t.train_calls, t.train) == (10.0, 10.0, 400.0)
    g = generation("gen", 8, 20.0, max_new_tokens=5)
    assert g.calls == 1 + 4  # the prefill, then a decoding step per new token
    both = (w + t) * 2
    assert (both.calls, both.train_calls) == (28.0, 20.0)
    assert w.named("x").calls == w.calls


# -- estimates ---------------------------------------------------------------------------------------------
def _seconds(kind: str, params: dict, model: str = "default", speed=E.ModelSpeed(0.01, 1e-4)) -> float:
    from backend.analysis.kinds import get_kind

    spec = get_kind(kind)
    p = spec.params.model_validate(params)
    w = p.work(E.model_shape(model), Sizes(query=10, demo=8, answer=2, source="test", queries=1000, pool=1000))
    return E.seconds_of(w, speed)


@pytest.mark.parametrize("kind,field,values,base", [
    ("maps", "prompts", [4, 8, 16, 50], {"shots": 4}),
    ("maps", "shots", [0, 2, 8, 16], {"prompts": 8}),
    ("ablation_curves", "prompts", [4, 8, 33], {"shots": 2, "ks": [0, 2, 4]}),
    ("steer", "prompts", [4, 8, 40], {"shots": 2, "layer": "all"}),
    ("site", "steps", [4, 40, 400], {"m": 4, "shots": 2, "prompts": 8}),
    ("site", "prompts", [4, 16, 64], {"m": 4, "shots": 2, "steps": 10}),
    ("ltv_train", "epochs", [1, 2, 5], {"train_prompts": 8, "val_prompts": 4}),
])
def test_estimate_is_monotone(kind, field, values, base):
    got = [_seconds(kind, {**base, field: v}) for v in values]
    assert all(b >= a for a, b in zip(got, got[1:])), got
    assert got[-1] > got[0], got


def test_a_tiny_models_estimate_counts_passes():
    """All per-pass cost, no per-token cost: the estimate is still the calls' time, not ~0 (the 1e-9 floor)."""
    s = _seconds("site", {"m": 4, "shots": 2, "prompts": 8, "steps": 100}, speed=E.ModelSpeed(0.01, 0.0))
    assert s >= 100 * 3 * 0.01  # a forward and a backward pass per training step at least


def test_estimate_uses_the_measured_speed_and_says_the_load(monkeypatch):
    from backend.analysis.kinds import get_kind
    from backend.tasks.registry import load_task

    monkeypatch.setattr(E, "_SPEEDS", {})
    spec, task = get_kind("maps"), load_task("syn-sentiment")
    p = spec.params.model_validate({"prompts": 8, "shots": 2})
    E.note_speed("default", {"seconds_per_token": 1e-4, "seconds_per_pass": 0.01, "speed_threads": 1,
                             "speed_load": 0.0})
    monkeypatch.setattr(E, "cpu_share", lambda: 1.0)
    quiet = E.estimate(spec, p, "default", task)
    assert quiet.seconds_basis == "measured" and quiet.seconds_per_pass == 0.01 and quiet.load_factor == 1.0
    w = p.work(quiet.shape, quiet.sizes)
    assert quiet.seconds == pytest.approx(E.JOB_OVERHEAD_S + E.ANALYSIS_OVERHEAD * (w.calls * 0.01 + w.tokens * 1e-4))
    monkeypatch.setattr(E, "cpu_share", lambda: 0.25)  # a quarter of a core: 4x slower
    busy = E.estimate(spec, p, "default", task)
    assert busy.seconds == pytest.approx(4 * quiet.seconds) and busy.how == quiet.how  # the work alone: a refusal quotes it
    assert "x4.0 for the CPU's load" in busy.to_json()["how"]


@pytest.mark.parametrize("result", [{}, {"seconds_per_token": 0}, {"seconds_per_token": -1},
                                    {"seconds_per_token": float("nan")}, {"seconds_per_token": True}])
def test_note_speed_ignores_a_figure_that_is_not_a_speed(monkeypatch, result):
    monkeypatch.setattr(E, "_SPEEDS", {})
    E.note_speed("m", result)
    assert E.measured_speed("m") is None


def test_load_factor():
    cpu_timed = E.ModelSpeed(0.01, 1e-4, threads=1, load=0.0)  # timed in CPU seconds: a quiet machine's figure
    assert E.load_factor(cpu_timed, 1.0) == 1.0 and E.load_factor(cpu_timed, 0.5) == 2.0
    assert E.load_factor(cpu_timed, None) == 1.0
    assert E.load_factor(cpu_timed, 1e-6) == E.LOAD_FACTOR_MAX
    assert E.load_factor(E.ModelSpeed(0.01, 1e-4, load=3.0), 0.5) == 1.0  # timed by the wall clock, under its load


def test_cpu_share_is_a_share():
    E._SHARE.clear()
    s = E.cpu_share(max_age_s=0.0)
    assert 0 < s <= 1.0


def test_assumed_speed_counts_passes():
    shape = E.model_shape("default")
    sp = E.assumed_speed(shape)
    assert sp is not None and sp.per_pass > 0 and sp.per_token > 0


# -- remaining time of a running job ------------------------------------------------------------------------
def test_remaining_time_comes_from_progress():
    assert E.remaining_seconds(0.0, 100.0) is None            # nothing done yet
    assert E.remaining_seconds(0.5, 1.0) is None              # too soon to extrapolate
    assert E.remaining_seconds(0.25, 30.0) == pytest.approx(90.0)
    assert E.remaining_seconds(0.5, 200.0) == pytest.approx(200.0)
    assert E.remaining_seconds(1.0, 50.0) == 0.0
    left = [E.remaining_seconds(f, 100.0) for f in (0.1, 0.3, 0.6, 0.9)]
    assert all(b < a for a, b in zip(left, left[1:]))


def test_a_running_jobs_status_has_its_remaining_time():
    import time

    from backend.service.jobs import _Job

    job = _Job(id="j", kind="maps", params={}, key="k", status="running", progress=0.25, started=time.time() - 30)
    left = job.snapshot().remaining_s
    assert left is not None and 85 <= left <= 100  # 30 s x 3, plus the moments since
    assert _Job(id="q", kind="maps", params={}, key="k2").snapshot().remaining_s is None  # queued


def test_progress_bar_says_time_left_from_progress():
    from ui.jobs import time_left

    assert time_left({"status": "running", "remaining_s": 40.0}, " of about 3 min") == " · about 40 s left"
    assert time_left({"status": "running", "remaining_s": None}, " of about 3 min") == " of about 3 min"
    assert time_left({"status": "queued"}, "") == ""


# -- no Run for a job the service refuses ---------------------------------------------------------------------
def test_a_refused_estimate_blocks_the_run_button():
    from ui.api import ApiError, not_admitted
    from ui.sections import cannot_run

    assert not_admitted(ApiError("model 'nope' cannot be loaded: no such folder", kind="refused", status=400))
    assert not_admitted(ApiError("model 'x' not found", kind="refused", status=404))
    assert not not_admitted(ApiError("Not Found", kind="refused", status=404))  # an older service: no route
    assert not not_admitted(ApiError("down", kind="unreachable"))
    assert cannot_run([None, "model 'nope' cannot be loaded"]) == "model 'nope' cannot be loaded"
    assert cannot_run([None, None]) is None
