"""One root for what the user can act on (`backend.errors.UserError`); everything else is an internal error: the job
runner and the CLI show a user error's message as it is, and anything else as `internal error (Type): ...` with its
traceback in the log."""
from __future__ import annotations

from plain_job import submit

import logging

import pytest

from backend.errors import BadInput, UserError, internal
from hang import wait_until  # noqa: E402


def user_errors() -> dict[str, type]:
    from backend.model.adapters import UnsupportedArchitecture
    from backend.analysis.ltv.learn import TrainingDiverged
    from backend.analysis.primitives.saved import SavedTensorError
    from backend.analysis.site.generate import GenerationError
    from backend.store.atomic_dirs import WriteError
    from backend.weights.gguf_files import GgufError
    from backend.weights.model_sources import ModelLoadError, SourceError
    from backend.weights.presets import PresetError
    from backend.weights.pull import PullError
    from backend.service.errors import BadRequest, InsufficientStorage, ServiceError, UsageError
    from backend.service.pulls import PullFailed
    from backend.service.ray_cluster import RunnerUnavailable
    from backend.tasks.base import TaskError
    from backend.store.tensor_store import TensorMissing, TensorWriteError

    return {c.__name__: c for c in (UnsupportedArchitecture, TrainingDiverged, SavedTensorError, GenerationError,
                                    WriteError, GgufError, ModelLoadError, SourceError, PresetError, PullError,
                                    BadRequest, InsufficientStorage, ServiceError, UsageError, PullFailed,
                                    RunnerUnavailable, TaskError, TensorMissing, TensorWriteError)}


def test_every_user_facing_error_has_the_root_and_keeps_its_old_base():
    classes = user_errors()
    assert all(issubclass(c, UserError) for c in classes.values()), [n for n, c in classes.items()
                                                                      if not issubclass(c, UserError)]
    # what `except ValueError / OSError / RuntimeError` caught before still catches them
    for name in ("TaskError", "UnsupportedArchitecture", "GgufError", "PresetError", "TensorMissing", "UsageError",
                 "SavedTensorError", "TrainingDiverged", "SourceError", "RunnerUnavailable", "GenerationError"):
        assert issubclass(classes[name], ValueError), name
    assert issubclass(classes["WriteError"], OSError) and issubclass(classes["TensorWriteError"], OSError)
    for name in ("ModelLoadError", "PullError", "PullFailed"):
        assert issubclass(classes[name], RuntimeError), name
    e = classes["TensorWriteError"]("no space left on the disk")
    assert str(e) == "no space left on the disk" and isinstance(e, UserError)


def test_describe_error_shows_a_user_error_and_calls_the_rest_internal():
    from backend.service.errors import NotFound
    from backend.service.execute import JobTimeLimit, describe_error
    from backend.tasks.base import TaskError

    assert describe_error(TaskError("task 'x' has 3 examples")) == "task 'x' has 3 examples"
    assert describe_error(BadInput("ks: [33] exceed this model's 32 heads")) == "ks: [33] exceed this model's 32 heads"
    assert describe_error(NotFound("no job 'j'")) == "no job 'j'"
    assert describe_error(JobTimeLimit("past the time limit of 5 s")) == "past the time limit of 5 s"
    assert describe_error(ValueError("operands could not be broadcast")) == \
        "internal error (ValueError): operands could not be broadcast"
    assert describe_error(KeyError("icl")) == "internal error (KeyError): 'icl'"
    assert describe_error(FileNotFoundError(2, "No such file", "/srv/x")).startswith("internal error (FileNotFound")
    assert describe_error(IndexError()) == internal(IndexError()) == "internal error (IndexError)"
    assert describe_error(MemoryError()).startswith("out of memory (MemoryError: no details); try fewer prompts")


def _finished(runner, jid: str):
    return wait_until(lambda: (j := runner.get(jid)).status in ("done", "error", "cancelled") and j,
                      f"job {jid} to end", poll_s=0.01)


def test_the_runner_logs_an_internal_error_with_its_traceback_and_not_a_user_error(caplog):
    from backend.service.jobs import LocalJobRunner
    from backend.service.limits import Limits

    def execute(job, progress):
        kind, params = job.kind, job.params
        if kind == "bug":
            return {}["missing"]  # a KeyError inside the math
        raise BadInput("positions: give at least one offset (-1 = the last prompt token)")

    runner = LocalJobRunner(execute, limits=Limits())
    try:
        with caplog.at_level(logging.ERROR, logger="backend.service.jobs"):
            bug = _finished(runner, submit(runner, "bug", {}, "key-bug").id)
            user = _finished(runner, submit(runner, "user", {}, "key-user").id)
    finally:
        runner.close()
    assert bug.status == user.status == "error"
    assert bug.error == "internal error (KeyError): 'missing'" and bug.error_type == "KeyError"
    assert user.error == "positions: give at least one offset (-1 = the last prompt token)"
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and logged[0].exc_info[0] is KeyError and "bug" in logged[0].getMessage()


@pytest.fixture
def failing_kind():
    from backend.analysis.kinds import Kind, register, unregister
    from backend.analysis.params import Params
    from backend.analysis.results import Result

    class FailParams(Params):
        user: bool = False

    register(Kind("fail_test", FailParams, Result, "test_errors:fail", "fails", api="fail_test", uses_task=False,
                  uses_model=False, cached=False))
    yield
    unregister("fail_test")


def fail(ctx, p) -> dict:
    if p.user:
        raise BadInput("ks: [99] exceed this model's 24 heads (2 layers x 12); use k <= 24")
    return {"x": [1, 2][5]}  # an IndexError inside the math


def test_the_cli_says_a_user_error_in_one_line_and_logs_an_internal_error_with_its_traceback(failing_kind, capsys,
                                                                                             caplog):
    from backend.cli import main

    with caplog.at_level(logging.ERROR, logger="backend.cli"):
        assert main(["fail-test", "--user", "--no-cache"]) == 2
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1] == \
            "error: ks: [99] exceed this model's 24 heads (2 layers x 12); use k <= 24"
        assert not caplog.records
        assert main(["fail-test", "--no-cache"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == "error: internal error (IndexError): list index out of range"
    (logged,) = caplog.records  # the log line (on stderr when nothing else handles the log), with its traceback
    assert logged.exc_info[0] is IndexError and "fail-test failed" in logged.getMessage()


def test_bad_values_inside_the_analyses_are_user_errors(monkeypatch):
    from backend.analysis.primitives.inject import check_positions
    from backend.service.limits import Limits

    with pytest.raises(BadInput, match="negative offsets"):
        check_positions([[1, 2, 3]], [0])
    with pytest.raises(BadInput, match="reaches before the start"):
        check_positions([[1, 2, 3]], [-5])
    monkeypatch.setenv("HEADLENS_MAX_PROMPTS", "many")
    with pytest.raises(BadInput, match="HEADLENS_MAX_PROMPTS"):
        Limits.from_env()
