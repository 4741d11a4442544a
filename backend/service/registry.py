"""The job-kind registry: a new kind of job is one params model and one function.

    @register_job_kind("steering", SteeringParams, "add a task vector at a layer")
    def run_steering(ctx: JobContext, p: SteeringParams) -> dict:
        return steer(ctx.lm(), ctx.task(), ..., progress=ctx.progress)

The function runs on the worker; `ctx.progress(fraction, message)` reports progress and raises
`Cancelled` once the job is cancelled, so cancellation happens at the next progress call.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from pydantic import BaseModel

if TYPE_CHECKING:
    from ..models import LoadedModel
    from ..tasks.base import Task
    from .model_pool import ModelPool
    from .task_store import TaskStore

Progress = Callable[[float, str], None]
BUILTIN_KINDS_MODULE = "backend.service.kinds"


class Cancelled(Exception):
    """Raised inside a job (by its progress callback) once the job has been cancelled."""


@dataclass
class JobContext:
    """What a job function gets besides its params: the model, the task and the progress callback."""

    params: Any
    progress: Progress
    pool: "ModelPool"
    tasks: "TaskStore"

    def lm(self) -> "LoadedModel":
        """The job's model (`params.model`), loaded once and kept resident by the pool."""
        return self.pool.get(self.params.model)

    def task(self) -> "Task":
        """The job's task (`params.task`): a built-in or an uploaded task."""
        return self.tasks.get(self.params.task)


@dataclass(frozen=True)
class JobKind:
    """A registered job kind. `admit(params, task, model_info)` may raise ValueError to refuse a request
    at submit time (model_info is the resident model's `info()`, or None when it is not loaded)."""

    name: str
    params: type[BaseModel]
    run: Callable[[JobContext, Any], dict[str, Any]]
    description: str = ""
    admit: Callable[[Any, "Task | None", "dict[str, Any] | None"], None] | None = None
    uses_task: bool = True


_KINDS: dict[str, JobKind] = {}
_loaded_builtins = False


def register_job_kind(name: str, params: type[BaseModel], description: str = "", *,
                      admit: Callable[..., None] | None = None, uses_task: bool = True,
                      replace: bool = False) -> Callable[[Callable], Callable]:
    """Decorator registering `fn(ctx, params) -> dict` as job kind `name`."""
    def deco(fn: Callable[[JobContext, Any], dict[str, Any]]) -> Callable:
        if name in _KINDS and not replace:
            raise ValueError(f"job kind {name!r} is already registered")
        _KINDS[name] = JobKind(name, params, fn, description or (fn.__doc__ or "").strip().split("\n")[0],
                               admit, uses_task)
        return fn
    return deco


def unregister_job_kind(name: str) -> None:
    _KINDS.pop(name, None)


def _ensure_builtins() -> None:
    global _loaded_builtins
    if not _loaded_builtins:
        _loaded_builtins = True
        importlib.import_module(BUILTIN_KINDS_MODULE)


def job_kinds() -> dict[str, JobKind]:
    """All registered kinds by name (the built-in ones are registered on first use)."""
    _ensure_builtins()
    return dict(_KINDS)


def get_kind(name: str) -> JobKind:
    """The kind named `name`; KeyError with the known names otherwise."""
    kinds = job_kinds()
    if name not in kinds:
        raise KeyError(f"unknown job kind {name!r}; kinds: {', '.join(sorted(kinds))}")
    return kinds[name]
