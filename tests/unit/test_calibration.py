"""The estimate's learned correction (`service/calibration.py`): its math, its file, what it refuses to learn from,
and an estimate that applies it; the CPU share's moving median (`service/estimate.py`)."""
from __future__ import annotations

import math

import pytest

from backend.analysis.primitives import reuse
from backend.service import calibration as C
from backend.service import estimate as E


@pytest.fixture
def on(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADLENS_CALIBRATION", "on")
    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(tmp_path))
    C._LOADED.clear()
    yield tmp_path
    C._LOADED.clear()


def test_no_runs_no_correction(on):
    assert C.correction("m", "maps") == C.Correction(1.0, 0)


def test_the_correction_is_a_moving_geometric_mean_of_the_ratios(on):
    assert C.record("m", "maps", planned_s=1.0, real_s=2.0) == C.Correction(2.0, 1)
    got = C.record("m", "maps", planned_s=1.0, real_s=0.5)  # log mean of 2 and 0.5, newest weighted ALPHA
    assert got.runs == 2
    assert got.factor == pytest.approx(math.exp((1 - C.ALPHA) * math.log(2.0) + C.ALPHA * math.log(0.5)))
    assert C.correction("other", "maps") == C.Correction()  # per model
    C.record("m", "icl", 1.0, 1.5)
    C.record("m", "steer", 1.0, 3.0)
    borrowed = C.correction("m", "ablate")  # a kind never run here: the median of the model's other kinds
    assert borrowed.runs == 0 and borrowed.others == 3 and borrowed.factor == pytest.approx(1.5)
    C.record("m", "fit", 0.001, 0.004)  # no forward pass: its plan is a job's fixed overhead, it hardly weighs
    C.record("m", "fit", 0.001, 0.004)
    assert C.correction("m", "ablate").factor == pytest.approx(1.5)
    assert C.weighted_median([(1.0, 1.0), (5.0, 3.0)]) == 5.0 and C.weighted_median([(2.0, 1.0), (1.0, 1.0)]) == 1.0


def test_the_correction_is_bounded_and_ignores_what_is_no_measure(on):
    assert C.record("m", "site", 1.0, 100.0).factor == C.HIGH
    assert C.record("m", "fit", 1.0, 1e-6).factor == C.LOW
    for planned, real in ((0.0, 1.0), (1e-9, 1.0), (1.0, 0.0), (float("nan"), 1.0), (1.0, float("inf"))):
        assert C.record("m", "icl", planned, real).runs == 0


def test_the_correction_survives_a_restart_and_a_bad_file_is_ignored(on):
    C.record("m", "maps", 1.0, 1.5)
    C._TABLE.clear(), C._LOADED.clear()  # a new process on the same cache folder
    assert C.correction("m", "maps") == C.Correction(1.5, 1)
    (on / C.FILE).write_text("{not json")
    C._LOADED.clear()
    assert C.correction("m", "maps") == C.Correction()
    (on / C.FILE).write_text('{"m|maps": {"log": "x", "runs": 1}, "m|icl": {"log": 0.1, "runs": -2}}')
    C._LOADED.clear()
    assert C.correction("m", "maps") == C.Correction() and C.correction("m", "icl") == C.Correction()


def test_off_learns_nothing_and_corrects_nothing(on, monkeypatch):
    C.record("m", "maps", 1.0, 2.0)
    monkeypatch.setenv("HEADLENS_CALIBRATION", "off")
    assert C.correction("m", "maps") == C.Correction()
    assert C.record("m", "maps", 1.0, 3.0) == C.Correction()
    monkeypatch.setenv("HEADLENS_CALIBRATION", "on")
    assert C.correction("m", "maps") == C.Correction(2.0, 1)  # the off run was not folded in


def test_measuring_records_a_computed_block_and_skips_reuse_and_errors(on):
    with C.measuring("m", "maps", planned_s=1e-3, cpu=True):
        sum(range(20000))
    assert C.correction("m", "maps").runs == 1
    with C.measuring("m", "maps", planned_s=1e-3, cpu=True):
        reuse.note("k")  # e.g. a cached sub-result: faster than its plan, and no measure of it
    with pytest.raises(RuntimeError):
        with C.measuring("m", "maps", planned_s=1e-3, cpu=True):
            raise RuntimeError("cancelled")
    with C.measuring("m", "maps", planned_s=None, cpu=True):
        pass
    assert C.correction("m", "maps").runs == 1


def test_reuse_counts_only_inside_its_block_and_not_what_it_made():
    reuse.note("x")  # outside any block: nothing to count into, no error
    with reuse.counting() as outer:
        reuse.note("a")
        with reuse.counting() as inner:
            reuse.made("b")
            reuse.note("b")  # computed in this block, then read again: its own work
            reuse.note("c")
    assert outer.count == 1 and inner.count == 1


def test_an_estimate_applies_the_correction_and_says_so(on, monkeypatch):
    from backend.analysis.kinds import get_kind
    from backend.tasks.registry import load_task

    monkeypatch.setattr(E, "_SPEEDS", {})
    monkeypatch.setattr(E, "cpu_share", lambda: 1.0)
    spec, task = get_kind("maps"), load_task("syn-sentiment")
    p = spec.params.model_validate({"prompts": 8, "shots": 2})
    E.note_speed("default", {"seconds_per_token": 1e-4, "seconds_per_pass": 0.01, "speed_load": 0.0})
    plain = E.estimate(spec, p, "default", task)
    assert plain.correction == 1.0 and plain.seconds == pytest.approx(plain.plan_seconds)
    C.record("default", spec.name, plain.plan_seconds, 1.6 * plain.plan_seconds)
    fixed = E.estimate(spec, p, "default", task)
    assert fixed.seconds == pytest.approx(1.6 * plain.seconds) and fixed.correction_runs == 1
    assert "x1.60 from 1 earlier run of head_maps here" in fixed.to_json()["how"]
    icl = get_kind("icl")
    borrowed = E.estimate(icl, icl.params.model_validate({"prompts": 8, "shots": [0, 2]}), "default", task)
    assert borrowed.correction == pytest.approx(1.6) and borrowed.correction_runs == 0
    assert "x1.60 from the earlier runs of 1 other kind here" in borrowed.to_json()["how"]
    assert fixed.how == plain.how  # the work's own words (a refusal quotes them) are unchanged


def test_a_job_through_the_executor_teaches_its_kind_and_a_cache_hit_does_not(on, monkeypatch):
    from backend.service.execute import make_executor
    from backend.service.model_pool import ModelPool
    from backend.service.task_store import TaskStore

    monkeypatch.setattr(E, "_SPEEDS", {})
    E.note_speed("default", {"seconds_per_token": 1e-5, "seconds_per_pass": 1e-3, "speed_load": 0.0})
    run = make_executor(ModelPool(), TaskStore())
    params = {"model": "default", "task": "syn-sentiment", "prompts": 4, "shots": [0, 2]}
    run("icl", params, lambda *a: None)
    first = C.correction("default", "icl_curve")
    assert first.runs == 1 and C.LOW <= first.factor <= C.HIGH
    run("icl", params, lambda *a: None)  # read from the cache: no measure of the plan
    assert C.correction("default", "icl_curve") == first


def test_the_cpu_share_is_the_median_of_recent_probes(monkeypatch):
    monkeypatch.setattr(E, "_SHARE", [])
    now = E.time.monotonic()
    E._SHARE[:] = [(now - 400, 0.01), (now - 30, 0.2), (now - 20, 0.9), (now - 10, 0.3)]
    assert E.cpu_share(max_age_s=60) == 0.3  # the fresh probes' median, without probing again
    got = E.cpu_share(max_age_s=0.0)  # a new probe joins the recent ones; the stale one is dropped
    assert len(E._SHARE) == 4 and all(now - t <= E.SHARE_MEMORY_S for t, _ in E._SHARE[:-1])
    assert 0 < got <= 1.0


def test_the_page_says_what_an_estimate_rests_on():
    from ui.jobs import basis_words

    measured = {"seconds_basis": "measured", "correction": 1.0, "correction_runs": 0}
    assert basis_words([measured]) == "this model's speed measured here"
    assert basis_words([{**measured, "correction": 1.4, "correction_runs": 3}, measured]).endswith(
        "corrected by 3 earlier runs")
    assert basis_words([{**measured, "correction": 1.4}]).endswith("corrected by earlier runs of other analyses")
    assert basis_words([measured, {"seconds_basis": "assumed"}]).startswith("assumed from the model's size")


def test_a_running_jobs_plan_probes_no_cpu_share(monkeypatch):
    """The executor asks for the plan before every job (a toggle too): it must not wait for the share's busy loop."""
    from backend.analysis.kinds import get_kind
    from backend.tasks.registry import load_task

    def probe(*a, **k):
        raise AssertionError("probed the CPU share")

    monkeypatch.setattr(E, "_SPEEDS", {})
    monkeypatch.setattr(E, "cpu_share", probe)
    E.note_speed("default", {"seconds_per_token": 1e-4, "seconds_per_pass": 0.01, "speed_load": 0.0})
    spec = get_kind("maps")
    e = E.estimate(spec, spec.params.model_validate({"prompts": 8, "shots": 2}), "default", load_task("syn-sentiment"),
                   load=False)
    assert e.load_factor == 1.0 and e.seconds == pytest.approx(e.plan_seconds)
