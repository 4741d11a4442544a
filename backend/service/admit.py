"""Admission of a job request: validate it, apply the limits and access rules, and give it a dedupe key.

Everything detectable before any model is loaded is refused here with a 4xx: an unknown kind or field,
a bad value, an unknown task, a model outside the allowed places, a limit exceeded, prompts that
cannot be built (e.g. more shots than the task has demonstrations). Once the model is resident, a task
whose inputs it mostly cannot read (kind `fit`) is refused too; before that, the analysis fails with the
same message.

Saved tensors: a `load` field is an id (never a path: the params model refuses anything else), and must name a
stored, intact file (404 otherwise, the same sentence whatever the reason); it is pinned for ADMIT_PIN_S so the
uploads' quota cannot remove it before the job is queued (the routes then pin it for the job's life). A job that
trains tensors is refused with a 507 when the tensor folder cannot take a file, before any training.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..tensor_store import TensorStore, TensorWriteError, default_store, missing
from .errors import BadRequest, InsufficientStorage, NotFound, clip
from .estimate import Estimate, estimate
from .jobs import job_key
from .limits import Limits
from .model_pool import ModelPool
from .schemas import JobFields
from .task_store import TaskStore

if TYPE_CHECKING:
    from fastapi.exceptions import RequestValidationError


ADMIT_PIN_S = 600.0
STORAGE_CHECK_S = 2.0  # a writable tensor folder stands this long (a sweep admits its jobs in one go)


@dataclass(frozen=True)
class Admitted:
    kind: str
    params: dict[str, Any]
    key: str
    tensors: tuple[str, ...] = ()  # the saved tensors the job reads (pin them while it is queued or running)
    estimate: Estimate | None = None


def describe_validation(e: ValidationError | RequestValidationError, allowed: list[str] | None = None) -> str:
    """One line per field: `shots: Input should be a valid integer (got 'x')` (pydantic's ValidationError, or
    FastAPI's RequestValidationError of a route's body model); the echoed input is clipped."""
    parts = []
    for err in e.errors():
        loc = clip(".".join(str(x) for x in err.get("loc", ()) if x != "body") or "request", 60)
        if err.get("type") == "extra_forbidden":
            hint = f"; allowed fields: {', '.join(allowed)}" if allowed else ""
            parts.append(f"unknown field {loc!r}{hint}")
            continue
        got = err.get("input")
        shown = f" (got {clip(repr(got), 60)})" if got is not None and not isinstance(got, dict) else ""
        parts.append(f"{loc}: {clip(err.get('msg', 'invalid'))}{shown}")
    return "; ".join(parts)


def admit(body: dict[str, Any], pool: ModelPool, tasks: TaskStore, limits: Limits, *,
          tensors: TensorStore | None = None, storage: bool = True, check_work: bool = True) -> Admitted:
    """Validate a POST /jobs body; raises ServiceError subclasses (4xx) with a clear message.

    `model` and `task` are checked by the service (access rules, known tasks); the other fields by the
    kind's params model from the registry; then the limits (`check_work=False`: all but the work limit, for an
    estimate that says by how much a job is over it), the saved tensors it reads and (`storage`) whether the
    tensors it would train can be saved."""
    from ..analysis.kinds import KINDS, get_kind

    kind = body.get("kind")
    try:
        spec = get_kind(str(kind))
    except KeyError:
        raise BadRequest(f"unknown job kind {clip(str(kind), 60)!r}; kinds: {', '.join(KINDS)}") from None
    allowed = ["kind", *(["model"] if spec.uses_model else []), *(["task"] if spec.uses_task else []),
               *spec.params.model_fields]
    shared = {k: body[k] for k in ("model", "task") if k in body and k in allowed}
    fields = {k: v for k, v in body.items() if k not in ("kind", *shared)}
    try:
        jf = JobFields.model_validate(shared)
        p = spec.params.model_validate(fields)
    except ValidationError as e:
        raise BadRequest(f"invalid {spec.name} request: {describe_validation(e, allowed)}") from None
    identity: dict[str, Any] = {}
    task = None
    if spec.uses_task:
        if jf.task is None:
            raise BadRequest(f"invalid {spec.name} request: task: field required (a built-in task name or an "
                             f"upload:<hash> id)")
        task = tasks.get(jf.task)
        identity["task"] = task.content_hash()
    limits.check_job(p, task)
    model_info = resident = None
    if spec.uses_model:
        identity["model"] = pool.check(jf.model)
        resident = pool.peek(jf.model)
        model_info = resident.info() if resident is not None else None
    device = pool.device_info()[0] if hasattr(pool, "device_info") else "cpu"
    work = estimate(spec, p, identity.get("model"), task, device, lm=resident)
    if check_work:  # from the params, the model's files and the task: the same whether it is loaded or not
        limits.check_work(work)
    if model_info is not None:
        try:
            check_model_fit(p, model_info)
            if task is not None and spec.name != "fit":  # a task the model cannot read is refused (kind `fit`)
                from ..analysis.primitives.fit import require_fit

                require_fit(resident, task)
        except ValueError as e:
            raise BadRequest(str(e)) from None
    store = tensors or default_store()
    reads = tuple(v for v in (getattr(p, f, None) for f in getattr(p, "tensor_fields", ())) if isinstance(v, str))
    for tid in reads:
        if not store.has(tid):
            raise NotFound(str(missing(tid)))
        store.pin_for(tid, ADMIT_PIN_S)
    if storage and getattr(p, "writes_tensors", lambda: False)():
        try:
            store.check_writable(max_age=STORAGE_CHECK_S)
        except TensorWriteError as e:
            raise InsufficientStorage(f"this server cannot save trained tensors now (its tensor folder: {e.reason}), "
                                      f"so {spec.name} would lose its training; ask its operator to free space or "
                                      f"fix the cache folder") from None
    params = {**({"model": jf.model} if spec.uses_model else {}), **({"task": jf.task} if spec.uses_task else {}),
              **p.model_dump(mode="json")}
    return Admitted(spec.name, params, job_key(spec.name, params, **identity), tensors=reads,
                    estimate=work)


def check_model_fit(p: Any, model: dict[str, Any]) -> None:
    """Fields that must fit the model's shape (heads, layers, ks), checked when the model is resident;
    otherwise the analysis checks them once it is loaded."""
    L, H = model["n_layers"], model["n_heads"]
    bad = [(l, h) for l, h in (getattr(p, "heads", None) or []) if l >= L or h >= H]
    if bad:
        raise ValueError(f"heads: {bad[:5]} outside the model's {L} layers x {H} heads")
    for name in ("layer", "pca_layer"):
        v = getattr(p, name, None)
        if isinstance(v, int) and v >= L:
            raise ValueError(f"{name}: {v} out of range: this model has layers 0..{L - 1}")
    ks = [k for k in (getattr(p, "ks", None) or []) if k > L * H]
    if ks:
        raise ValueError(f"ks: {ks[:5]} exceed this model's {L * H} heads ({L} layers x {H}); use k <= {L * H}")
