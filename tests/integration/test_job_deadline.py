"""Jobs stop on time whatever their size: the one cooperative check (`backend/analysis/primitives/stopping.py`) for cancel, preempt and
the time limit runs inside every loop that can run long (embedding, generation, training, patching, batching).

No wall clock here: time is a fake clock that advances one "second" per forward pass of the model, and the deadline
is a number of those. Each test gives a job far more work than the deadline allows and shows that it stops at the
first check past the deadline: the forward passes that *started* once the clock read past the limit are counted, and
at most one (one batch, training step or generated token) may run before the stop.
"""
from __future__ import annotations

from plain_job import submit

import sys
import threading
import types

import pytest

from backend.analysis.kernel import analyze
from backend.model.loading import wrap
from backend.service import execute as execute_mod
from backend.service import jobs as jobs_mod
from backend.service.execute import Cancelled, JobProgress, JobTimeLimit, Preempted, time_limited
from backend.service.jobs import LocalJobRunner
from backend.service.limits import Limits
from backend.analysis.primitives.stopping import Stop, check, checking
from backend.tasks.base import Task, Template
from tiny_models import tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

# 400 examples: held-out queries and demonstrations enough for every size asked below
TASK = Task("tiny-parity-400", "classification", [(str(i), "even" if i % 2 == 0 else "odd") for i in range(400)],
            Template("{input} is {output}\n"))
SITE = dict(m=4, shots=2, prompts=6, steps=4, val_every=2, val_prompts=3, max_new_tokens=2, compare=[], patching=[],
            budget=[], correlations=[])


@pytest.fixture(scope="module")
def lm(gpt2_tokenizer):
    return wrap(tiny_model("llama"), gpt2_tokenizer, "tiny-llama-deadline")


class ForwardClock:
    """A fake clock: one tick per forward pass of the model (counted when the pass ends). `late`: the passes that
    started once the clock read past `limit` (work done after the deadline)."""

    def __init__(self, lm, limit: float = float("inf")):
        self.t, self.limit, self.late = 0, limit, 0
        self._handles = [lm.model.register_forward_pre_hook(self._start), lm.model.register_forward_hook(self._end)]

    def _start(self, module, args):
        if self.t > self.limit:
            self.late += 1

    def _end(self, module, args, out):
        self.t += 1

    def check(self) -> None:
        """The deadline: JobTimeLimit once the clock is past the limit."""
        if self.t > self.limit:
            raise JobTimeLimit(f"past {self.limit} ticks")

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def run(lm, kind: str, limit: float = float("inf"), **params):
    """(the result or the exception raised, the clock) of `kind` with a deadline of `limit` forward passes, checked
    the way a runner checks it (a progress object with a `check`, which `analyze` installs for the loops)."""
    clock = ForwardClock(lm, limit)
    progress = JobProgress(lambda f, m="": None, lambda data: None, clock.check)
    try:
        return analyze(kind, lm, TASK, params, cache=False, progress=progress), clock
    except Stop as e:
        return e, clock
    finally:
        clock.close()


def stopped_in(e: BaseException, *functions: str) -> bool:
    """Whether the traceback of `e` runs through one of the named functions (where the check fired)."""
    names, tb = set(), e.__traceback__
    while tb is not None:
        names.add(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return bool(names & set(functions))


def assert_stopped_on_time(e, clock, *where: str) -> None:
    assert isinstance(e, JobTimeLimit), f"the job was not stopped: {e!r}"
    assert clock.t > clock.limit  # it did reach the deadline (the check is not firing early)
    assert clock.late <= 1, f"{clock.late} forward passes ran after the deadline"
    assert stopped_in(e, *where), f"the stop came from elsewhere than {where}"


# -- the check itself ------------------------------------------------------------------------------------------------
def test_check_does_nothing_outside_a_job():
    check()  # no check installed: no error


def test_checks_nest_once_each_and_stay_in_their_thread():
    calls: list[str] = []
    outer, inner = (lambda: calls.append("outer")), (lambda: calls.append("inner"))
    with checking(outer):
        with checking(inner), checking(outer), checking(None):  # `outer` again and None add nothing
            check()
        assert calls == ["outer", "inner"]
        other: list[int] = []
        t = threading.Thread(target=lambda: (check(), other.append(1)))  # another thread: not this job's check
        t.start()
        t.join()
        assert calls == ["outer", "inner"] and other == [1]
        check()
    assert calls == ["outer", "inner", "outer"]
    check()
    assert calls == ["outer", "inner", "outer"]


def test_the_jobs_stops_are_stops():
    assert all(issubclass(c, Stop) for c in (Cancelled, Preempted, JobTimeLimit))


def test_time_limited_checks_with_the_clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(execute_mod, "time", types.SimpleNamespace(monotonic=lambda: now[0], time=lambda: now[0]))
    seen: list[float] = []
    p = time_limited(lambda f, m="": seen.append(f), 20)
    now[0] = 20.0
    p.check()  # at the limit: not past it
    p(0.5)
    now[0] = 20.5
    with pytest.raises(JobTimeLimit, match="time limit of 20 s"):
        p.check()
    with pytest.raises(JobTimeLimit):
        p(0.6)
    assert seen == [0.5]


# -- every long loop checks -------------------------------------------------------------------------------------------
def test_a_small_site_job_finishes_without_a_deadline(lm):
    r, clock = run(lm, "site", **SITE)
    assert not isinstance(r, Exception) and r.m == 4 and clock.t > 0 and clock.late == 0


def test_site_with_a_huge_m_stops_inside_the_task_embedding(lm):
    e, clock = run(lm, "site", limit=5, **{**SITE, "m": 2_000})
    assert_stopped_on_time(e, clock, "capture_sites")


def test_site_with_a_huge_budget_stops_inside_the_budgets_run(lm):
    _, whole = run(lm, "site", **SITE)  # the job without its budget curve
    e, clock = run(lm, "site", limit=whole.t + 3, **{**SITE, "budget": [2_000]})
    assert_stopped_on_time(e, clock, "_budget")
    assert stopped_in(e, "capture_sites")  # in the M=10000 run's task embedding


def test_site_with_many_new_tokens_stops_inside_the_generation(lm):
    _, short = run(lm, "site", **{**SITE, "prompts": 300, "max_new_tokens": 1})
    e, clock = run(lm, "site", limit=short.t, **{**SITE, "prompts": 300, "max_new_tokens": 256})
    assert_stopped_on_time(e, clock, "generate")


def test_generation_checks_every_token(lm):
    from backend.analysis.primitives.batching import encode
    from backend.analysis.site.generate import generate

    enc = encode(lm, TASK.build_prompts(0, 4, 0), TASK.kind)
    clock = ForwardClock(lm, limit=10)
    try:
        with checking(clock.check), pytest.raises(JobTimeLimit):
            generate(lm, enc.ids, max_new_tokens=256, stop=(), batch_size=4)  # one batch: a prefill, then tokens
    finally:
        clock.close()
    assert clock.t == 11 and clock.late == 0  # stopped at the first token past the deadline


def test_site_training_stops_at_the_step_past_the_deadline(lm):
    _, before = run(lm, "site", **{**SITE, "steps": 0})  # embedding, prefixes, validation, evaluation
    e, clock = run(lm, "site", limit=before.t + 20, **{**SITE, "steps": 100_000, "val_every": 100_000})
    assert_stopped_on_time(e, clock, "train_alphas")


def test_ltv_training_stops_at_the_step_past_the_deadline(lm):
    e, clock = run(lm, "ltv_train", limit=30, epochs=1000, patience=1000, train_prompts=100_000, val_prompts=8,
                   batch_size=4, layer=1)
    assert_stopped_on_time(e, clock, "train_injection")


def test_patching_many_prompts_stops_inside_the_head_patches(lm):
    e, clock = run(lm, "patching", limit=40, shots=2, prompts=300, batch_size=8)
    assert_stopped_on_time(e, clock, "patch_heads")


def test_mean_patching_stops_inside_the_sweep(lm):
    e, clock = run(lm, "patching", limit=40, shots=2, prompts=300, batch_size=8, patch="mean")
    assert_stopped_on_time(e, clock, "run_configs")


def test_ablation_curves_stop_inside_the_sweep(lm):
    e, clock = run(lm, "ablation_curves", limit=10, shots=2, prompts=300, orders=["random"], ks=list(range(1, 13)),
                   random_seeds=list(range(16)))
    assert_stopped_on_time(e, clock, "run_configs")


# -- the runners ------------------------------------------------------------------------------------------------------
def _runner_with_clock(lm, monkeypatch, limit_s: int) -> tuple[LocalJobRunner, ForwardClock]:
    """A LocalJobRunner whose clock is the model's forward passes (the job starts at 0)."""
    clock = ForwardClock(lm)
    monkeypatch.setattr(jobs_mod, "time", types.SimpleNamespace(time=lambda: float(clock.t),
                                                                monotonic=lambda: float(clock.t)))
    clock.limit = limit_s

    def execute(job, progress):
        kind, params = job.kind, job.params
        return analyze(kind, lm, TASK, params, cache=False, progress=progress).to_json()

    return LocalJobRunner(execute, limits=Limits(job_timeout_s=limit_s)), clock


def _wait(runner, job_id):
    for _ in range(6000):  # a hang guard only
        st = runner.get(job_id, include_result=False)
        if st.status not in ("queued", "running"):
            return st
        threading.Event().wait(0.05)
    raise AssertionError("the job never ended")


def test_the_local_runner_stops_a_huge_job_at_its_time_limit(lm, monkeypatch):
    runner, clock = _runner_with_clock(lm, monkeypatch, limit_s=5)
    try:
        st = _wait(runner, submit(runner, "site", {**SITE, "m": 2_000}, "k-huge-m").id)
    finally:
        runner.close()
        clock.close()
    assert st.status == "error" and st.error_type == "JobTimeLimit"
    assert "time limit of 5 s" in st.error
    assert clock.late <= 1


def test_a_job_waiting_for_another_process_on_its_key_stops_at_its_time_limit(lm, monkeypatch):
    """The kernel's wait for a key another process computes (a second service or a CLI on the same cache folder)
    runs the job's check: the job stops at its time limit, still at progress 0, having computed nothing."""
    from backend.analysis.kernel import LOCKS
    from backend.store.locks import KeyLocks

    now = [0.0]
    monkeypatch.setattr(jobs_mod, "time", types.SimpleNamespace(time=lambda: now[0], monotonic=lambda: now[0]))
    ran: list[str] = []
    monkeypatch.setattr(lm, "info", lambda: ran.append("computed") or {})

    def execute(job, progress):
        return analyze("model_info", lm, None, {}, key="k-busy", progress=progress).to_json()
    runner = LocalJobRunner(execute, limits=Limits(job_timeout_s=5))
    try:
        with KeyLocks(LOCKS.directory).hold("k-busy"):  # another process's lock file on the same key
            jid = submit(runner, "model_info", {}, "k-busy").id
            for _ in range(6000):  # a hang guard only
                if runner.get(jid).status == "running":
                    break
                threading.Event().wait(0.05)
            now[0] = 6.0
            st = _wait(runner, jid)
    finally:
        runner.close()
    assert st.status == "error" and st.error_type == "JobTimeLimit" and st.progress == 0.0
    assert ran == []  # it never computed


def test_the_time_limit_counts_from_the_first_start_giving_way_included(monkeypatch):
    """A job that gives way and starts again keeps its first start: past the limit from then it stops, however
    short its last attempt (defect 5 of issue 36: an ablation_curves job gave way 71 times and ran 79 s under a
    10 s limit)."""
    from backend.service.execute import Preempted

    now = [0.0]
    monkeypatch.setattr(jobs_mod, "time", types.SimpleNamespace(time=lambda: now[0], monotonic=lambda: now[0]))
    attempts: list[float] = []

    def execute(job, progress):
        attempts.append(now[0])
        now[0] += 4.0  # each attempt runs 4 s of the clock, then gives way
        if len(attempts) < 10:
            raise Preempted()
        progress(0.5, "step")
        return {}
    runner = LocalJobRunner(execute, limits=Limits(job_timeout_s=10))
    try:
        st = _wait(runner, submit(runner, "ablation_curves", {}, "k-gives-way").id)
    finally:
        runner.close()
    assert st.status == "error" and st.error_type == "JobTimeLimit" and "from its first start" in st.error
    assert st.preempted == 3 and attempts == [0.0, 4.0, 8.0]  # the fourth start, at 12 s, stops at its check


def test_a_cancel_stops_the_job_inside_its_loop(lm, monkeypatch):
    runner, clock = _runner_with_clock(lm, monkeypatch, limit_s=10**9)
    job: dict[str, str] = {}

    def cancel_at_ten(module, args, out):  # a DELETE arriving in the middle of the task embedding
        if clock.t == 10:
            runner.cancel(job["id"])
            clock.limit = 9  # from here on, passes count as late
    h = lm.model.register_forward_hook(cancel_at_ten)
    try:
        job["id"] = submit(runner, "site", {**SITE, "m": 2_000}, "k-cancel").id
        st = _wait(runner, job["id"])
    finally:
        h.remove()
        runner.close()
        clock.close()
    assert st.status == "cancelled"
    assert clock.late <= 1  # stopped at the next check: at most one more pass


def test_a_sweep_job_gives_way_inside_its_loop(lm, monkeypatch):
    """An interactive job arriving while a sweep job runs its task embedding: the sweep job stops at its next check
    (Preempted, the same check), the interactive job runs, the sweep job goes back to its lane."""
    runner, clock = _runner_with_clock(lm, monkeypatch, limit_s=10**9)
    marks: dict[str, object] = {}
    inner = runner._execute

    def execute(job, progress):
        kind, params = job.kind, job.params
        try:
            return inner(job, progress)
        except Preempted:
            marks.setdefault("stopped", clock.t)
            raise
    runner._execute = execute

    def interactive_at_ten(module, args, out):
        if clock.t == 10 and "asked" not in marks:
            marks["asked"] = clock.t
            marks["interactive"] = submit(runner, "site", SITE, "k-interactive").id
    h = lm.model.register_forward_hook(interactive_at_ten)
    try:
        sweep = submit(runner, "site", {**SITE, "m": 2_000}, "k-sweep", lane="sweep")
        for _ in range(6000):  # a hang guard only
            if "interactive" in marks:
                break
            threading.Event().wait(0.05)
        done = _wait(runner, marks["interactive"])
        runner.cancel(sweep.id)
        again = _wait(runner, sweep.id)
    finally:
        h.remove()
        runner.close()
        clock.close()
    assert done.status == "done"
    assert again.preempted == 1 and again.status == "cancelled", again.error
    assert marks["stopped"] - marks["asked"] <= 1  # at most one more pass of the sweep job once it had to give way


def test_the_ray_worker_stops_inside_the_loop_once_told_to_cancel(lm, monkeypatch):
    """The Ray actor installs the same check: the service's time limit (or a DELETE) cancels the call, and the
    analysis stops at its next batch, step or token (the service side: ray_runner._run_on raises the time limit
    at its next poll and cancels the call)."""
    from backend.analysis.kinds import get_kind
    from backend.service.ray_worker import ModelWorker

    fake_ray = types.ModuleType("ray")
    fake_ray.get = lambda ref, timeout=None: ref  # the reader's answers come back as they are
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    nothing = types.SimpleNamespace(remote=lambda *a: None)
    reader = types.SimpleNamespace(get=nothing, tensor=nothing, has_tensor=nothing, tensors_writable=nothing)
    worker = ModelWorker.__new__(ModelWorker)
    worker._model, worker._lm, worker._reader, worker._lock, worker._state = "tiny", lm, reader, threading.Lock(), {}
    clock = ForwardClock(lm)

    def cancel_at_ten(module, args, out):
        if clock.t == 10:
            worker.cancel("call-1")
            clock.limit = 9
    h = lm.model.register_forward_hook(cancel_at_ten)
    try:
        with pytest.raises(Cancelled):
            worker.run("call-1", get_kind("site"), {**SITE, "m": 2_000}, TASK)
    finally:
        h.remove()
        clock.close()
    assert clock.late <= 1
