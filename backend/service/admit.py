"""Admission of a job request, once: validate it, apply the limits and access rules, estimate it and key it. The
record (`Admission`: the validated params, the plan and its estimate, the cache key) travels with the job to the
kernel, which neither validates, plans nor keys it again.

Everything detectable before any model is loaded is refused here with a 4xx: an unknown kind or field, a bad value,
an unknown task (`task`, or a name in `tasks`), a model outside the allowed places or that cannot load, a limit
exceeded, prompts that cannot be built, a field that does not fit the model's shape read from its files (a head, a
layer or a k beyond it: `check_shape_fit`), a saved tensor that is missing or made for another shape, the work
limit. Once the model is resident, a task whose inputs it mostly cannot read is refused too.

The key is the kernel's cache key (`kernel.cache_key`): the model's fingerprint is the resident model's, or the one
recorded when its files were last loaded here (`ModelPool.identity`). A model never loaded here has none yet: its
first job is keyed by its canonical name (`keyed` False) until the kernel, with the model loaded, keys it.

Saved tensors: a `load` field is an id (never a path), and must name a stored, intact file (404 otherwise); it is
pinned for ADMIT_PIN_S so the uploads' quota cannot remove it before the job is queued. A job that trains tensors
is refused with a 507 when the tensor folder cannot take a file, before any training.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..store.tensor_store import TensorStore, TensorWriteError, default_store, missing
from ..errors import BadInput
from .errors import BadRequest, InsufficientStorage, NotFound, clip
from ..analysis.primitives.cost import Shape
from .timing import Estimate, estimate
from .limits import Limits
from .model_pool import ModelPool
from .schemas import JobFields
from .task_store import TaskStore

if TYPE_CHECKING:
    from fastapi.exceptions import RequestValidationError

    from ..analysis.kinds import Kind
    from ..analysis.params import Params
    from ..analysis.results import Result
    from ..tasks.base import Task


ADMIT_PIN_S = 600.0
STORAGE_CHECK_S = 2.0  # a writable tensor folder stands this long (a sweep admits its jobs in one go)


@dataclass
class Admission:
    """An admitted job: `p` its validated params, `params` the normalized request a job shows (model, task and the
    kind's fields, JSON), `key` its cache key (`keyed` False: a stand-in until the model is loaded), `plan` its cost
    plan (`cost.Work`) and `estimate` its time, `tensors` the saved tensors it reads (pinned while it is active)."""

    spec: "Kind"
    p: "Params"
    params: dict[str, Any]
    key: str
    estimate: Estimate
    plan: Any = None
    model: str | None = None
    task: "Task | None" = None
    tensors: tuple[str, ...] = ()
    keyed: bool = True
    ref: Any = None  # the model's name and fingerprint (`kernel.ModelRef`) when known
    precision: str | None = None  # a precision other than the server's default (`ModelPool.precision`), or None

    @property
    def kind(self) -> str:
        return self.spec.name

    def keyed_by(self, lm: Any) -> str:
        """The final key once the model is loaded (`lm`): a stand-in key becomes the cache key of its fingerprint."""
        if not self.keyed:
            from ..analysis.kernel import ModelRef

            self.ref = ModelRef(lm.name, lm.fingerprint)
            self.key, self.keyed = job_key(self.spec, self.p, self.ref, self.model, self.task, self.precision)
        return self.key

    @property
    def fields(self) -> dict[str, Any]:
        """The kind's own fields (the params without model and task)."""
        return {k: v for k, v in self.params.items() if k not in ("model", "task", "precision")}


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
          tensors: TensorStore | None = None, storage: bool = True, check_work: bool = True) -> Admission:
    """Admit a job body: the one admission of POST /jobs (and its views /jobs/estimate, /jobs/cached) and of a
    sweep's jobs; raises ServiceError subclasses (4xx) with a clear message.

    In order: the kind; `model` and `task` (access rules, known tasks, a model that can load); the other fields by
    the kind's params model from the registry; built-in task names in `tasks`; the limits; every field that must fit
    the model's shape, read from its files (heads, layers, ks); the saved tensors it reads (there, and made for a
    model of this shape); (`storage`) whether the tensors it would train can be saved; last the work limit
    (`check_work=False`: skipped, for an estimate that says by how much a job is over it; being last, an estimate
    and a submission refuse the same bodies with the same status otherwise)."""
    from ..analysis.kinds import KINDS, get_kind

    kind = body.get("kind")
    try:
        spec = get_kind(str(kind))
    except KeyError:
        raise BadRequest(f"unknown job kind {clip(str(kind), 60)!r}; kinds: {', '.join(KINDS)}") from None
    allowed = ["kind", *(["model", "precision"] if spec.uses_model else []), *(["task"] if spec.uses_task else []),
               *spec.params.model_fields]
    shared = {k: body[k] for k in ("model", "task", "precision") if k in body and k in allowed}
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
    check_task_names(spec.name, p)
    limits.check_job(p, task)
    model_info = resident = None
    precision = None
    if spec.uses_model:
        identity["model"] = pool.check(jf.model)
        precision = pool.other_precision(jf.precision) if hasattr(pool, "other_precision") else None
        if hasattr(pool, "require_loadable"):  # a pool that loads by other means (tests) may not say
            pool.require_loadable(identity["model"], precision or getattr(pool, "precision", "float32"))
        resident = pool.peek(jf.model, precision) if precision else pool.peek(jf.model)
        model_info = resident.info() if resident is not None else None
    work, plan = estimate(spec, p, identity.get("model"), task, lm=resident,
                          resident=resident is not None if hasattr(pool, "peek") and spec.uses_model else None)
    shape = known_shape(work.shape, model_info)
    try:
        if shape is not None:
            check_shape_fit(p, shape)
        if model_info is not None and task is not None and spec.key != "fit":
            from ..analysis.primitives.fit import require_fit  # a task the model cannot read (kind `task_fit` says so)

            require_fit(resident, task)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    store = tensors or default_store()
    reads = tuple(v for v in (getattr(p, f, None) for f in getattr(p, "tensor_fields", ())) if isinstance(v, str))
    for tid in reads:
        if not store.has(tid):
            raise NotFound(str(missing(tid)))
        if shape is not None:
            check_tensor_fit(store, tid, p, shape, jf.model or "this model")
        store.pin_for(tid, ADMIT_PIN_S)
    if storage and getattr(p, "writes_tensors", lambda: False)():
        try:
            store.check_writable(max_age=STORAGE_CHECK_S)
        except TensorWriteError as e:
            raise InsufficientStorage(f"this server cannot save trained tensors now (its tensor folder: {e.reason}), "
                                      f"so {spec.name} would lose its training; ask its operator to free space or "
                                      f"fix the cache folder") from None
    if check_work:  # from the params, the model's files and the task: the same whether it is loaded or not
        limits.check_work(work)
    params = {**({"model": jf.model} if spec.uses_model else {}), **({"precision": precision} if precision else {}),
              **({"task": jf.task} if spec.uses_task else {}), **p.model_dump(mode="json")}
    model = identity.get("model")
    ref = None
    if model is not None and hasattr(pool, "identity"):
        ref = pool.identity(model, precision) if precision else pool.identity(model)
    key, keyed = job_key(spec, p, ref, model, task, precision)
    return Admission(spec, p, params, key, work, plan, model, task, reads, keyed, ref, precision)


def job_key(spec: "Kind", p: "Params", ref: Any, model: str | None, task: "Task | None",
            precision: str | None = None) -> tuple[str, bool]:
    """(the job's cache key, whether it is final): `kernel.cache_key` on the model's identity `ref`; a model never
    loaded here is keyed by its canonical name (and a precision other than the server's) until the kernel keys it
    with its fingerprint (which holds the precision, `loading.fingerprint`)."""
    from ..analysis.kernel import ModelRef, cache_key

    if spec.uses_model and ref is None:
        stand_in = f"unloaded:{model}" + (f"@{precision}" if precision else "")
        return cache_key(spec, ModelRef(model or "", stand_in), task, p), False
    return cache_key(spec, ref, task, p), spec.cached


def cached(a: Admission, tensors: TensorStore | None = None) -> "Result | None":
    """The admitted job's cached result, or None (never computes, never loads a model)."""
    from ..analysis.kernel import lookup

    if not a.keyed:
        return None
    return lookup(a.kind, a.ref, a.task, a.p, key=a.key, tensors=tensors)


def check_task_names(kind: str, p: Any) -> None:
    """A kind over several built-in tasks (`tasks`: findings, ltv_tasks, site_transfer) names only built-in tasks
    (never an upload id or a path): NotFound naming the unknown ones otherwise; ltv_tasks and site_transfer compare
    at least two."""
    names = getattr(p, "tasks", None)
    if "tasks" not in type(p).model_fields or not names:
        return
    from ..tasks.base import TaskError
    from ..tasks.registry import builtin_by_names

    try:
        found = builtin_by_names(list(names), kind)
    except TaskError as e:
        raise NotFound(clip(str(e), 600)) from None
    if kind in ("ltv_across_tasks", "site_transfer") and len(found) < 2:
        raise BadRequest(f"tasks: {kind} compares at least two tasks; give two or more built-in task names (or "
                         f"leave `tasks` out for the model's own tasks)")


def known_shape(shape: Shape, model_info: dict[str, Any] | None) -> Shape | None:
    """The model's shape when it is known: read from its files (config.json, a GGUF header), else from the resident
    model; None when neither (a hub id not fetched: the analysis checks its fields once the model is loaded)."""
    if shape.source not in ("assumed", "none") and shape.n_layers > 0 and shape.n_heads > 0:
        return shape
    if model_info is not None and model_info.get("n_layers") and model_info.get("n_heads"):
        return Shape(int(model_info["n_layers"]), int(model_info["n_heads"]), int(model_info.get("d_model") or 0),
                     source="resident")
    return None


def check_shape_fit(p: Any, shape: Shape) -> None:
    """Every field that must fit the model's L layers x H heads, at admission (ValueError, one sentence): `heads`
    and `head` ([layer, head] pairs), `layer` (an index or a list of them) and `pca_layer` (0..L-1), `ks` (at most
    L*H heads ablated). Other sizes clip to the model (top_k, site's patching ks) or depend on the prompts."""
    L, H = shape.n_layers, shape.n_heads
    one = getattr(p, "head", None)
    for name, pairs in (("heads", list(getattr(p, "heads", None) or [])),
                        ("head", [tuple(one)] if isinstance(one, (tuple, list)) else [])):
        bad = [[l, h] for l, h in pairs if l >= L or h >= H]
        if bad:
            raise BadInput(f"{name}: {bad[0] if name == 'head' else bad[:5]} outside this model's {L} layers x {H} "
                             f"heads (layers 0..{L - 1}, heads 0..{H - 1})")
    for name in ("layer", "pca_layer"):
        v = getattr(p, name, None)
        far = [x for x in (v if isinstance(v, list) else [v]) if isinstance(x, int) and x >= L]
        if far:
            shown = far[0] if not isinstance(v, list) else far[:5]
            raise BadInput(f"{name}: {shown} out of range: this model has layers 0..{L - 1}")
    ks = [k for k in (getattr(p, "ks", None) or []) if k > L * H]
    if ks:
        raise BadInput(f"ks: {ks[:5]} exceed this model's {L * H} heads ({L} layers x {H}); use k <= {L * H}")


def check_tensor_fit(store: TensorStore, tid: str, p: Any, shape: Shape, model: str = "this model") -> None:
    """A saved tensor the job loads must be sound and made for a model of this shape (its metadata: d_model, the SITE
    alphas' layers x heads, the LTV's layers, which `layer` must then ask for; the fingerprint is checked once the
    model is loaded): 422 otherwise, in the words the analysis would use (`saved.check_model`). `model`: the name
    as the request gave it."""
    from ..analysis.primitives.saved import SavedTensorError, check_content, decode

    src = f"tensor {tid}"
    try:
        meta = check_content(*decode(store.get(tid), src), src)
    except (SavedTensorError, ValueError) as e:
        raise BadRequest(str(e)) from None
    made, name = clip(meta.get("model") or "?", 80), clip(model, 80)
    if shape.d_model and meta["d_model"] != shape.d_model:
        raise BadRequest(f"{src} was trained for d_model {meta['d_model']} ({made}); {name} has d_model "
                         f"{shape.d_model}")
    if meta["kind"] == "site" and (meta["n_layers"], meta["n_heads"]) != (shape.n_layers, shape.n_heads):
        raise BadRequest(f"{src} holds {meta['n_layers']} x {meta['n_heads']} heads ({made}); {name} has "
                         f"{shape.n_layers} x {shape.n_heads} heads")
    if meta["kind"] == "ltv":
        layers = list(meta["recipe"].get("layers") or [])
        far = [l for l in layers if l >= shape.n_layers]
        if far:
            raise BadRequest(f"{src} holds vectors for layer(s) {far[:4]} ({made}); {name} has layers "
                             f"0..{shape.n_layers - 1}")
        asked = getattr(p, "layer", None)
        if asked is not None:
            want = list(range(shape.n_layers)) if asked == "all" else sorted({asked} if isinstance(asked, int)
                                                                              else set(asked))
            if want != layers:
                raise BadRequest(f"layer: {tid!r} holds a vector for layer(s) {layers}; leave `layer` out or ask "
                                 f"for those")
