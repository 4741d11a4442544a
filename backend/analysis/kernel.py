"""The analysis kernel: one cached call for every kind, and the context an analysis function gets.

    r = analyze("scores", lm, task, shots=8, prompts=50)      # -> ScoresResult (typed)

`analyze` is the only place that builds cache keys, takes the per-key lock, reads and writes the result
store and adds `cache_hit` and `seconds`. The key hashes the kind, the model fingerprint, the task's content
hash and the *requested* parameters (all but `batch_size`), so a cache hit costs no tokenising. A cached
value that does not fit the kind's result model is logged and recomputed. One feature's result feeds another
through `ctx.call(kind, ...)`, the same cached call; features never import each other.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from pydantic import BaseModel, ValidationError

from ..cache import default_cache, make_key
from ..jsonable import to_jsonable
from ..locks import KeyLocks
from .kinds import Kind, get_kind
from .params import NOT_IN_KEY, Params
from .primitives.fit import require_fit
from .results import Result

if TYPE_CHECKING:
    from ..models import LoadedModel
    from ..tasks.base import Task

Progress = Callable[[float, str], None]
log = logging.getLogger(__name__)
_LOCKS = KeyLocks()  # per-key locks across threads and processes; the folder follows HEADLENS_CACHE_DIR


class Store(Protocol):
    """Where results live: JSON-able dicts by key (`cache.ResultCache` is one)."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, value: dict[str, Any]) -> None: ...


def _noop(fraction: float, message: str = "") -> None:
    return None


@dataclass
class Context:
    """What an analysis function gets besides its params: the model, the task, progress, and cached calls.

    `progress(fraction, message)` may raise (a cancelled job); `stage(lo, hi, name)` maps a sub-step's
    progress into [lo, hi]; `warn` adds a line to the result's warnings.
    """

    lm: "LoadedModel | None"
    task: "Task | None"
    progress: Progress = _noop
    store: Store | None = None
    warnings: list[str] = field(default_factory=list)
    report: Callable[[dict[str, Any]], None] | None = None

    def stage(self, lo: float, hi: float, name: str = "") -> Progress:
        def report(fraction: float, message: str = "") -> None:
            f = min(max(float(fraction), 0.0), 1.0)
            text = f"{name}: {message}" if name and message and message != name else (message or name)
            self.progress(lo + (hi - lo) * f, text)
        return report

    def call(self, kind: str, *, progress: Progress | None = None, warn_prefix: str = "", **params: Any) -> Result:
        """Another kind's result on the same model and task, through the same cache; its warnings become this
        analysis's warnings too (after `warn_prefix`)."""
        r = analyze(kind, self.lm, self.task, params, cache=self.store if self.store is not None else False,
                    progress=progress, live=self.report)
        for w in r.warnings:
            self.warn(warn_prefix + w)
        return r

    def live(self, data: dict[str, Any]) -> None:
        """Data a page may draw while the analysis runs (e.g. {"loss": [...]} of a training so far); the service
        shows the latest as the job's `live` field. May raise (a cancelled job)."""
        if self.report is not None:
            self.report(data)

    def cached(self, kind: str, tries: "list[dict[str, Any]]") -> Result | None:
        """The first of `tries` (param sets, best first) whose `kind` result on this model and task is cached;
        None when none is, or `kind` is not registered, or its params no longer take these fields. Never
        computes (one feature shows another's result only when the user already ran it)."""
        from .kinds import KINDS

        if kind not in KINDS:
            return None
        fields = get_kind(kind).params.model_fields
        store = self.store if self.store is not None else False
        for params in tries:
            try:
                r = lookup(kind, self.lm, self.task, {k: v for k, v in params.items() if k in fields}, cache=store)
            except (ValueError, TypeError):  # the kind's params changed shape: treat as absent
                return None
            if r is not None:
                return r
        return None

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)


def resolve_store(cache: "bool | Store | None") -> Store | None:
    """True -> the default disk cache; False / None -> no caching; a store -> itself."""
    if cache is True:
        return default_cache()
    return cache or None


def validate_params(kind: Kind, params: "Params | Mapping[str, Any] | None" = None, **overrides: Any) -> Params:
    """The kind's params model from a model instance, a mapping, and keyword overrides (ValidationError
    when they do not fit)."""
    if isinstance(params, BaseModel):
        params = params.model_dump()
    return kind.params.model_validate({**(params or {}), **overrides})


def cache_key(kind: Kind, lm: "LoadedModel | None", task: "Task | None", p: Params) -> str:
    """The result's key: kind, model fingerprint, task content hash, requested params (not batch_size, unless the
    kind's params say it changes the result: `Params.not_in_key`), and the kind's `version` when it is > 0."""
    extra = {"kind_version": kind.version} if kind.version else {}
    return make_key(kind.name, model=lm.fingerprint if lm is not None else None,
                    task=task.content_hash() if task is not None else None,
                    params=p.model_dump(mode="json", exclude=set(getattr(p, "not_in_key", NOT_IN_KEY))), **extra)


def envelope(lm: "LoadedModel | None", task: "Task | None", p: Params) -> dict[str, Any]:
    return {"model": lm.name if lm is not None else None, "task": task.name if task is not None else None,
            "params": p.model_dump(mode="json")}


def analyze(kind: str, lm: "LoadedModel | None", task: "Task | None" = None,
            params: "Params | Mapping[str, Any] | None" = None, *, cache: "bool | Store | None" = True,
            progress: Progress | None = None, live: Callable[[dict[str, Any]], None] | None = None,
            **overrides: Any) -> Result:
    """Run analysis `kind` on `lm` and `task` with `params` (+ keyword overrides), cached; a typed result.

    A miss computes under the key's lock (threads and processes), so a key is never computed twice at once:
    a second caller waits, then reads the first one's result. Nothing that does not fit the result model
    is written to the store.
    """
    spec = get_kind(kind)
    p = validate_params(spec, params, **overrides)
    if spec.uses_task and task is None:
        raise ValueError(f"analysis {kind!r} needs a task")
    if spec.uses_model and lm is None:
        raise ValueError(f"analysis {kind!r} needs a model")
    t0 = time.perf_counter()
    env = envelope(lm, task, p)
    progress = progress or _noop
    store = resolve_store(cache) if spec.cached else None

    def compute() -> dict[str, Any]:
        if spec.needs_fit and lm is not None and task is not None:
            require_fit(lm, task)  # a task whose words the model does not know is an error, not a result
        ctx = Context(lm, task, progress, store, report=live)
        value = spec.function()(ctx, p)
        value = to_jsonable({**value, "warnings": [*ctx.warnings, *value.get("warnings", [])]})
        spec.result.model_validate({**value, **env})  # a malformed result fails here, before it is stored
        return value

    if store is None:
        value, hit = compute(), False
    else:
        key = cache_key(spec, lm, task, p)
        value, hit = _read(store, key, spec, env), True
        if value is None:
            with _LOCKS.hold(key, cancelled=lambda: bool(progress(0.0, "waiting for the same computation"))):
                value = _read(store, key, spec, env)
                if value is None:
                    value, hit = compute(), False
                    store.put(key, value)
    return spec.result.model_validate({**value, **env, "cache_hit": hit, "seconds": time.perf_counter() - t0})


def lookup(kind: str, lm: "LoadedModel | None", task: "Task | None" = None,
           params: "Params | Mapping[str, Any] | None" = None, *, cache: "bool | Store | None" = True,
           **overrides: Any) -> Result | None:
    """The cached result of `analyze(kind, ...)` with these arguments, or None; never computes."""
    spec = get_kind(kind)
    p = validate_params(spec, params, **overrides)
    store = resolve_store(cache) if spec.cached else None
    if store is None:
        return None
    t0 = time.perf_counter()
    env = envelope(lm, task, p)
    value = _read(store, cache_key(spec, lm, task, p), spec, env)
    if value is None:
        return None
    return spec.result.model_validate({**value, **env, "cache_hit": True, "seconds": time.perf_counter() - t0})


def _read(store: Store, key: str, spec: Kind, env: dict[str, Any]) -> dict[str, Any] | None:
    """The stored value when it fits the kind's result model; None (and a log line) otherwise."""
    value = store.get(key)
    if value is None:
        return None
    try:
        spec.result.model_validate({**value, **env})
    except ValidationError as e:
        log.warning("cached %s result %s does not fit %s (%s); recomputing", spec.name, key, spec.result.__name__,
                    str(e).splitlines()[0])
        return None
    return value
