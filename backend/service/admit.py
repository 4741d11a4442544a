"""Admission of a job request: validate it, apply the limits and access rules, and give it a dedupe key.

Everything detectable before any model is loaded is refused here with a 4xx: an unknown kind or field,
a bad value, an unknown task, a model outside the allowed places, a limit exceeded, prompts that
cannot be built (e.g. more shots than the task has demonstrations).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .errors import BadRequest
from .jobs import job_key
from .limits import Limits
from .model_pool import ModelPool
from .registry import get_kind, job_kinds
from .task_store import TaskStore


@dataclass(frozen=True)
class Admitted:
    kind: str
    params: dict[str, Any]
    key: str


def describe_validation(e: ValidationError, allowed: list[str] | None = None) -> str:
    """One line per field: `shots: Input should be a valid integer (got 'x')`."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"] if x != "body") or "request"
        if err["type"] == "extra_forbidden":
            hint = f"; allowed fields: {', '.join(allowed)}" if allowed else ""
            parts.append(f"unknown field {loc!r}{hint}")
            continue
        got = err.get("input")
        shown = f" (got {got!r:.60})" if got is not None and not isinstance(got, dict) else ""
        parts.append(f"{loc}: {err['msg']}{shown}")
    return "; ".join(parts)


def admit(body: dict[str, Any], pool: ModelPool, tasks: TaskStore, limits: Limits) -> Admitted:
    """Validate a POST /jobs body; raises ServiceError subclasses (4xx) with a clear message."""
    kind = body.get("kind")
    try:
        spec = get_kind(str(kind))
    except KeyError:
        raise BadRequest(f"unknown job kind {kind!r}; kinds: {', '.join(sorted(job_kinds()))}") from None
    fields = {k: v for k, v in body.items() if k != "kind"}
    try:
        p = spec.params.model_validate(fields)
    except ValidationError as e:
        raise BadRequest(f"invalid {spec.name} request: "
                         f"{describe_validation(e, ['kind', *spec.params.model_fields])}") from None
    identity: dict[str, Any] = {}
    task = None
    if spec.uses_task and hasattr(p, "task"):
        task = tasks.get(p.task)
        identity["task"] = task.content_hash()
    limits.check_job(p, task)
    model_info = None
    if hasattr(p, "model"):
        identity["model"] = pool.check(p.model)
        resident = pool.peek(p.model)
        model_info = resident.info() if resident is not None else None
    if spec.admit is not None:
        try:
            spec.admit(p, task, model_info)
        except ValueError as e:
            raise BadRequest(str(e)) from None
    params = p.model_dump(mode="json")
    return Admitted(spec.name, params, job_key(spec.name, params, **identity))
