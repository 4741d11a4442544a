"""Estimates from the jobs that ran (`service/timing.py`): a kind's own runs, borrowing across kinds and models,
the size prior, the file read as untrusted and merged on write, the executor teaching a kind (a cache hit does
not), the remaining time of a running job, and the words a page shows. No wall clock: timings are given."""
from __future__ import annotations

import json
import math
import os
import statistics
import threading

import pytest

from backend.analysis.primitives.cost import STEP_BATCH, Sizes, batches, generation, passes, steps, training
from backend.service import timing as T
from hang import HANG_S


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setenv("HEADLENS_TIMINGS", "on")
    T._SEEN[0] = None  # read the (new, empty) cache folder's file afresh


def test_calls_are_batches():
    assert batches(0, 16) == 0 and batches(1, 16) == 1 and batches(16, 16) == 1 and batches(17, 16) == 2
    w = passes("ICL", 50, 100.0)
    assert (w.tokens, w.calls) == (5000.0, 4.0)
    assert passes("per layer", 8, 10.0, batch=16, repeat=30).calls == 30
    assert steps("configs", 8 * 12).calls == math.ceil(96 / STEP_BATCH)
    t = training("train", 40, 10.0, batch=4)
    assert (t.calls, t.train_calls, t.train) == (10.0, 10.0, 400.0)
    assert generation("gen", 8, 20.0, max_new_tokens=5).calls == 1 + 4  # the prefill, then a step per new token
    both = (w + t) * 2
    assert (both.calls, both.train_calls) == (28.0, 20.0)


def _units(kind: str, params: dict) -> float:
    from backend.analysis.kinds import get_kind

    spec = get_kind(kind)
    shape = T.model_shape("default")
    p = spec.params.model_validate(params)
    return p.work(shape, Sizes(query=10, demo=8, answer=2, source="test", queries=1000, pool=1000)).units(shape)


@pytest.mark.parametrize("kind,field,values,base", [
    ("head_maps", "prompts", [4, 8, 16, 50], {"shots": 4}),
    ("head_maps", "shots", [0, 2, 8, 16], {"prompts": 8}),
    ("ablation_curves", "prompts", [4, 8, 33], {"shots": 2, "ks": [0, 2, 4]}),
    ("steer", "prompts", [4, 8, 40], {"shots": 2, "layer": "all"}),
    ("site_alphas", "steps", [4, 40, 400], {"m": 4, "shots": 2, "prompts": 8}),
    ("ltv_vector", "epochs", [1, 2, 5], {"train_prompts": 8, "val_prompts": 4}),
])
def test_a_plans_units_grow_with_its_work(kind, field, values, base):
    got = [_units(kind, {**base, field: v}) for v in values]
    assert all(b >= a for a, b in zip(got, got[1:])) and got[-1] > got[0], got


def test_a_kinds_own_runs_give_its_rate_and_range(on):
    for s in (2.0, 3.0, 4.0):
        T.record("m", "head_maps", 1000.0, s, 1e8)
    rate, lo, hi, basis, runs = T.rate("m", "head_maps", 1e8)
    assert (rate, lo, hi, runs) == (pytest.approx(3e-3), pytest.approx(2e-3), pytest.approx(4e-3), 3)
    assert basis == "3 earlier runs of head_maps here"
    for s in range(10):  # only the newest RUNS count
        T.record("m", "head_maps", 1000.0, 10.0 + s, 1e8)
    assert T.rate("m", "head_maps", 1e8)[0] == pytest.approx(statistics.median(range(15, 20)) / 1000)


def test_a_kind_never_run_borrows_the_other_kinds_and_a_new_model_the_nearest_size(on):
    T.record("m", "head_maps", 1000.0, 2.0, 1e8)
    T.record("m", "ablate", 1000.0, 6.0, 1e8)
    rate, lo, hi, basis, runs = T.rate("m", "steer", 1e8)
    assert (rate, lo, hi, runs) == (pytest.approx(4e-3), pytest.approx(2e-3), pytest.approx(6e-3), 0)
    assert "other analyses on this model" in basis
    T.record("tiny", "head_maps", 1000.0, 0.01, 1e5)
    big = T.rate("big", "head_maps", 4e8)  # nothing ran on it: m (1e8) is nearest; 4x its parameters
    assert big[0] == pytest.approx(4 * statistics.median([2e-3, 6e-3])) and "assumed" in big[3]
    assert big[1] == pytest.approx(big[0] / T.RANGE_UNKNOWN) and big[2] == pytest.approx(big[0] * T.RANGE_UNKNOWN)
    # a model far from every one that ran (tiny: 1e5, m: 1e8; 1.35e9 is 13.5x m) takes the rate from its size
    assert T.rate("huge", "head_maps", 1.35e9)[0] == pytest.approx(2 * 1.35e9 / T.FALLBACK_FLOPS)


def test_with_nothing_run_the_rate_comes_from_the_size(on):
    assert T.rate("m", "head_maps", 1e9)[0] == pytest.approx(2e9 / T.FALLBACK_FLOPS)
    assert T.rate("m", "head_maps", 10)[0] == T.MIN_RATE


def test_off_learns_nothing(monkeypatch):
    monkeypatch.setenv("HEADLENS_TIMINGS", "off")
    T.record("m", "head_maps", 1000.0, 2.0, 1e8)
    assert "assumed" in T.rate("m", "head_maps", 1e8)[3]
    assert not (T.cache_dir() / T.FILE).exists()


def test_the_file_survives_a_restart_and_values_out_of_range_are_ignored(on):
    T.record("m", "head_maps", 1000.0, 2.0, 1e8)
    path = T.cache_dir() / T.FILE
    data = json.loads(path.read_text())
    T._TABLE.clear(), T._SEEN.__setitem__(0, None)  # a restarted service
    assert T.rate("m", "head_maps", 1e8)[4] == 1
    data["m|ablate"] = [[data["m|head_maps"][0][0], 1000.0, 1e300, 1e8], ["x", 1, 2, 3], [1e10, -1, 2, 3]]
    data["m|icl_curve"] = {"log": 1000, "runs": 3, "plan": 1}  # defect 1's entry: no list of runs
    data[7] = 3
    path.write_text(json.dumps(data))
    got = T.rate("m", "ablate", 1e8)  # nothing usable for ablate: borrowed, finite
    assert got[4] == 0 and math.isfinite(got[0]) and got[0] == pytest.approx(2e-3)


@pytest.mark.parametrize("content", ["[" * 100_000, "{" * 50 + "}" * 50, "not json", "x" * (2 << 20)])
def test_a_deep_huge_or_broken_file_is_ignored(on, content):
    (T.cache_dir()).mkdir(parents=True, exist_ok=True)
    (T.cache_dir() / T.FILE).write_text(content)
    assert "assumed" in T.rate("m", "head_maps", 1e8)[3]
    T.record("m", "head_maps", 1000.0, 2.0, 1e8)  # and writing replaces it
    assert T.rate("m", "head_maps", 1e8)[4] == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_never_blocks_an_estimate(on):
    T.cache_dir().mkdir(parents=True, exist_ok=True)
    os.mkfifo(T.cache_dir() / T.FILE)
    done = []
    t = threading.Thread(target=lambda: done.append(T.rate("m", "head_maps", 1e8)), daemon=True)
    t.start()
    t.join(HANG_S)  # a hang guard: a blocking open never returns
    assert done and "assumed" in done[0][3]


def test_two_services_sharing_a_folder_keep_each_others_runs(on):
    T.record("m", "head_maps", 1000.0, 2.0, 1e8)
    T._TABLE.clear(), T._SEEN.__setitem__(0, "another process")  # the other service: it never saw the first run
    T.record("m", "ablate", 1000.0, 4.0, 1e8)
    data = json.loads((T.cache_dir() / T.FILE).read_text())
    assert set(data) == {"m|head_maps", "m|ablate"}


def test_the_executor_teaches_a_kind_and_a_cache_hit_does_not(on):
    from backend.service.admit import admit
    from backend.service.execute import make_executor
    from backend.service.limits import Limits
    from backend.service.model_pool import ModelPool
    from backend.service.task_store import TaskStore

    pool, tasks = ModelPool(), TaskStore()
    run = make_executor(pool, tasks)
    body = {"kind": "icl_curve", "model": "default", "task": "syn-sentiment", "prompts": 4, "shots": [0, 2]}
    first = admit(body, pool, tasks, Limits())
    assert "loading the model first" in first.estimate.time_notes  # not resident: its load is part of the wait
    __import__(first.spec.module)  # a kind's first run in a process imports its module: not timed
    run(first, lambda *a: None)
    assert T.rate("default", "icl_curve", 1)[4] == 1 and T._rates("default")[T.LOAD]  # the run, and the load
    again = admit(body, pool, tasks, Limits())
    assert "loading" not in again.estimate.how
    run(again, lambda *a: None)  # read from the cache: not a run
    assert T.rate("default", "icl_curve", 1)[4] == 1
    assert T.load_seconds("default", 1e6) == pytest.approx(T._rates("default")[T.LOAD][0])
    assert T.load_seconds("never-loaded", 1e8) == pytest.approx(T.LOAD_PRIOR_S + 4e8 / T.LOAD_BYTES_PER_S)


def test_remaining_time_comes_from_progress_else_the_estimate():
    assert T.remaining_seconds(0.0, 100.0) is None
    assert T.remaining_seconds(0.5, 1.0) is None
    assert T.remaining_seconds(0.5, 1.0, 10.0) == pytest.approx(9.0)
    assert T.remaining_seconds(0.25, 30.0) == pytest.approx(90.0)
    assert T.remaining_seconds(1.0, 50.0) == 0.0
    left = [T.remaining_seconds(f, 100.0) for f in (0.1, 0.3, 0.6, 0.9)]
    assert all(b < a for a, b in zip(left, left[1:]))


def test_a_running_jobs_status_has_its_remaining_time():
    import time

    from backend.service.jobs import _Job

    job = _Job(id="j", kind="head_maps", params={}, key="k", status="running", progress=0.25, started=time.time() - 30)
    left = job.snapshot().remaining_s
    assert left is not None and 85 <= left <= 100  # 30 s x 3, plus the moments since
    assert _Job(id="q", kind="head_maps", params={}, key="k2").snapshot().remaining_s is None  # queued


def test_the_page_words():
    from backend.text import describe_seconds
    from ui.jobs import estimated, time_left

    assert describe_seconds(40.0) == "about 40 s" and describe_seconds(40, 30, 50) == "about 40 s"
    assert describe_seconds(40, 20, 120) == "20 s to 2 min"
    e = {"seconds": 40.0, "low": 20.0, "high": 120.0, "passes": 50, "basis": "3 earlier runs of head_maps here"}
    assert estimated([e]) == "**20 s to 2 min** (50 prompt passes; from 3 earlier runs of head_maps here)"
    assert time_left({"status": "running", "remaining_s": 40.0}, " of about 3 min") == " · about 40 s left"
    assert time_left({"status": "running", "remaining_s": None}, " of about 3 min") == " of about 3 min"


def test_a_refused_job_gets_no_run_button():
    from ui.api import ApiError, not_admitted

    assert not_admitted(ApiError("model 'nope' cannot be loaded: no such folder", kind="refused", status=400))
    assert not_admitted(ApiError("model 'x' not found", kind="refused", status=404))
    assert not not_admitted(ApiError("Not Found", kind="refused", status=404))  # an older service: no route
    assert not not_admitted(ApiError("down", kind="unreachable"))
