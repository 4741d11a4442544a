"""The analysis kernel: one cached call for every kind, and the context an analysis function gets.

    r = analyze("head_scores", lm, task, shots=8, prompts=50)      # -> HeadScoresResult (typed)

`analyze` is the only place that builds cache keys, takes the per-key lock, reads and writes the result
store and adds `cache_hit` and `seconds`. The key hashes the kind, the model fingerprint, the task's content
hash and the *requested* parameters (all but `batch_size`), so a cache hit costs no tokenising. A cached
value that does not fit the kind's result model is logged and recomputed. One feature's result feeds another
through `ctx.call(kind, ...)`, the same cached call; features never import each other.

Also here, once for every kind: a result's `notes` (`ctx.warn(Note(...))`) apart from its `warnings`; one
warning for the labels that span several tokens, wherever they were tokenised (`primitives/notes.py`); and
`ctx.cached`, another kind's cached result found by the parameters the caller reads (an index per kind, model and
task lists what is cached). A result that looked for another kind's result and found none is recomputed once
that result is cached, so a cached result always equals a fresh one.

Trained tensors (`ltv_vector`, `site_alphas`) are files named by the hash of their bytes (`backend/store/tensor_store.py`); an
analysis reads and writes them through `ctx.tensors`, one `TensorSession` per call tree. A cached result that refers
to a tensor (a `tensor` or `tensors` field) is a hit only while that file is there and intact; otherwise it is
recomputed. A tensor that could not be written (a full or read-only disk) comes back inline with the result
(`unsaved_tensors`: the file's bytes, base64, ready for POST /tensors) and a warning, and that result is not cached.
"""
from __future__ import annotations

import base64
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from pydantic import BaseModel, ValidationError

from ..store.cache import default_cache, make_key
from ..errors import BadInput
from ..store.jsonable import to_jsonable
from ..store.locks import KeyLocks
from .primitives.stopping import check, checking
from ..store.tensor_store import TensorSession, TensorStore, is_id, tensor_refs
from .kinds import Kind, get_kind, stored_name
from .params import CONVENTIONS, NOT_IN_KEY, Params
from .primitives import bos
from .primitives.fit import require_fit
from .primitives.notes import Note, collect_multi_token, is_multi_token_warning, multi_token_warning
from .results import Result

if TYPE_CHECKING:
    from ..model.loading import LoadedModel
    from ..tasks.base import Task

Progress = Callable[[float, str], None]
log = logging.getLogger(__name__)
LOCKS = KeyLocks()  # per-key locks across threads and processes; the folder follows HEADLENS_CACHE_DIR
INDEX = "index:"  # the namespace of the index entries (`index_key`)
INDEX_MAX = 256  # entries kept per kind, model and task (the newest)


@dataclass(frozen=True)
class ModelRef:
    """What a cache key and a result's envelope need of a model: its name and fingerprint (no weights)."""

    name: str
    fingerprint: str


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
    progress into [lo, hi]; `check()` raises once the job must stop (cancelled, preempted, past its time limit:
    `stopping.check`; call it once per batch, step or token of a long loop); `warn` adds a line to the result's
    warnings (a `Note`: to its notes).
    """

    lm: "LoadedModel | None"
    task: "Task | None"
    progress: Progress = _noop
    store: Store | None = None
    warnings: list[str] = field(default_factory=list)
    report: Callable[[dict[str, Any]], None] | None = None
    notes: list[str] = field(default_factory=list)
    multi_token: set[str] = field(default_factory=set)
    absent: list[dict[str, Any]] = field(default_factory=list)
    """`ctx.cached` lookups that found nothing: {"kind", "tries"} (the result is recomputed once one would hit)."""
    tensors: TensorSession = field(default_factory=TensorSession)
    """Where trained tensors are read and written (`saved.save_tensors`, `saved.load_tensors`)."""
    plan: Any = None
    """The admission's plan of this call (`cost.Work`) for `planned_params`: `stages.planned` reads it instead of
    planning again."""
    planned_params: Any = None

    @staticmethod
    def check() -> None:
        """Raise a `stopping.Stop` once the job must stop; nothing otherwise (cheap: once per batch, step, token)."""
        check()

    def stage(self, lo: float, hi: float, name: str = "") -> Progress:
        def report(fraction: float, message: str = "") -> None:
            f = min(max(float(fraction), 0.0), 1.0)
            text = f"{name}: {message}" if name and message and message != name else (message or name)
            self.progress(lo + (hi - lo) * f, text)
        return report

    def call(self, kind: str, *, progress: Progress | None = None, warn_prefix: str = "", **params: Any) -> Result:
        """Another kind's result on the same model and task, through the same cache; its warnings and notes become
        this analysis's too (after `warn_prefix`), its multi-token labels join this one's (one warning for all)."""
        r = analyze(kind, self.lm, self.task, params, cache=self.store if self.store is not None else False,
                    progress=progress, live=self.report, tensors=self.tensors)
        self.multi_token.update(r.multi_token_labels)
        self.absent.extend(a for a in r.absent_inputs if a not in self.absent)
        stored = stored_name(kind)
        if any(a["kind"] == stored for a in self.absent):  # looked up, missed, then computed here: no longer missing
            self.absent = [a for a in self.absent if a["kind"] != stored
                           or find_cached(kind, self.lm, self.task, a["tries"], self.store, self.tensors) is None]
        for w in r.warnings:
            if not is_multi_token_warning(w):
                self.warn(warn_prefix + w)
        for n in r.notes:
            self.warn(Note(warn_prefix + n))
        return r

    def cached_on(self, kind: str, tasks: "Sequence[Task]", params: Mapping[str, Any]) -> set[str]:
        """The names of `tasks` whose `kind` result with `params` is already in this analysis's cache on its model
        (a stage of its progress plan that will cost nothing); never computes. A task the kind cannot take (a
        `TaskError`) counts as not cached: the run itself says why."""
        from ..tasks.base import TaskError

        store = self.store if self.store is not None else False
        found = set()
        for t in tasks:
            try:
                if lookup(kind, self.lm, t, params, cache=store, tensors=self.tensors) is not None:
                    found.add(t.name)
            except TaskError:
                pass
        return found

    def live(self, data: dict[str, Any]) -> None:
        """Data a page may draw while the analysis runs (e.g. {"loss": [...]} of a training so far); the service
        shows the latest as the job's `live` field. May raise (a cancelled job)."""
        if self.report is not None:
            self.report(data)

    def cached(self, kind: str, tries: "list[dict[str, Any]]", record: bool = True) -> Result | None:
        """A cached `kind` result on this model and task that matches the first of `tries` it can: a try names
        the fields the caller's reading depends on; every other field may hold any value (the defaults
        preferred, then the newest). None when nothing matches, `kind` is not registered or its params no longer
        take these fields. Never computes (one feature shows another's result only when the user already ran
        it); a miss is recorded, and this result is recomputed once the other is cached. `record=False`: a
        lookup that changes no number of the result (a progress bar's stage costs), so its miss is not recorded."""
        r = find_cached(kind, self.lm, self.task, tries, self.store, self.tensors)
        if r is None and record:
            miss = {"kind": stored_name(kind), "tries": to_jsonable(tries)}
            if miss not in self.absent:
                self.absent.append(miss)
        return r

    def warn(self, message: str) -> None:
        into = self.notes if isinstance(message, Note) else self.warnings
        if message not in into:
            into.append(str(message))


def session(tensors: "TensorSession | TensorStore | None") -> TensorSession:
    """The call tree's tensor session: the one given, or a new one over the store given (default: the cache's)."""
    return tensors if isinstance(tensors, TensorSession) else TensorSession(tensors)


def local_files(kind: Kind, params: "Mapping[str, Any] | None") -> dict[str, Any]:
    """`params` with every tensor field (`Params.tensor_fields`, e.g. `load`) that names a local file instead of an
    id replaced by the id of that file, copied into the tensor store once checked. For the CLI and the Python API,
    which run as the user; the service never calls it (over HTTP a path is never accepted)."""
    out = dict(params.model_dump() if isinstance(params, BaseModel) else params or {})
    for name in getattr(kind.params, "tensor_fields", ()):
        v = out.get(name)
        if (isinstance(v, str) or hasattr(v, "__fspath__")) and not is_id(v):
            from .primitives.saved import register_file

            out[name] = register_file(v)
    return out


def unsaved_warning(tid: str, reason: str) -> str:
    return (f"could not save tensor {tid} ({reason}): this result is not cached, and the file comes inline "
            f"(`unsaved_tensors`, base64: POST it to /tensors to keep it)")


def resolve_store(cache: "bool | Store | None") -> Store | None:
    """True -> the default disk cache; False / None -> no caching; a store -> itself."""
    if cache is True:
        return default_cache()
    return None if cache is None or cache is False else cache  # an empty store (a dict, say) is falsy, not absent


def validate_params(kind: Kind, params: "Params | Mapping[str, Any] | None" = None, **overrides: Any) -> Params:
    """The kind's params model from a model instance, a mapping, and keyword overrides (ValidationError
    when they do not fit); an instance of the kind's own model with nothing to add is taken as it is (admitted)."""
    if type(params) is kind.params and not overrides:  # its fields all set, a convention too
        return params
    if isinstance(params, BaseModel):
        params = params.model_dump()
    given = {**(params or {}), **overrides}
    inherited = bos.current()  # a kind called inside another: its convention unless the call names one
    if inherited is not None and "prepend_bos" in kind.params.model_fields and given.get("prepend_bos") is None:
        given["prepend_bos"] = inherited
    return kind.params.model_validate(given)


def cache_key(kind: Kind, lm: "LoadedModel | None", task: "Task | None", p: Params) -> str:
    """The result's key: kind (its `key`, the name before a rename), model fingerprint, task content hash, requested params (not batch_size, unless the
    kind's params say it changes the result: `Params.not_in_key`; a field added later only when it is set:
    `Params.added_fields`, and the shared conventions such as `prepend_bos`: `params.CONVENTIONS`), and the kind's
    `version` when it is > 0."""
    exclude = set(getattr(p, "not_in_key", NOT_IN_KEY))
    fields = type(p).model_fields
    added = set(getattr(p, "added_fields", ())) | CONVENTIONS
    exclude |= {f for f in added if f in fields and getattr(p, f) == fields[f].default}
    extra = {"kind_version": kind.version} if kind.version else {}
    return make_key(kind.key, model=lm.fingerprint if lm is not None else None,
                    task=task.content_hash() if task is not None else None,
                    params=p.model_dump(mode="json", exclude=exclude), **extra)


def envelope(lm: "LoadedModel | None", task: "Task | None", p: Params) -> dict[str, Any]:
    return {"model": lm.name if lm is not None else None, "task": task.name if task is not None else None,
            "params": p.model_dump(mode="json")}


def analyze(kind: str, lm: "LoadedModel | None", task: "Task | None" = None,
            params: "Params | Mapping[str, Any] | None" = None, *, cache: "bool | Store | None" = True,
            progress: Progress | None = None, live: Callable[[dict[str, Any]], None] | None = None,
            tensors: "TensorSession | TensorStore | None" = None, key: str | None = None, plan: Any = None,
            **overrides: Any) -> Result:
    """Run analysis `kind` on `lm` and `task` with `params` (+ keyword overrides), cached; a typed result.

    A miss computes under the key's lock (threads and processes), so a key is never computed twice at once:
    a second caller waits, then reads the first one's result. Nothing that does not fit the result model
    is written to the store, nor a result whose tensors could not be saved. `tensors`: where trained tensors go
    (default: the cache folder's store). A `progress` with a `check` (`service.execute.JobProgress`) has it installed
    while the analysis runs (`stopping.checking`): its loops stop at their next batch, step or token once it raises.
    An admitted job (`service/admit.py`) brings its validated params, its cache `key` and its `plan`: nothing is
    validated, keyed or planned again.
    """
    spec = get_kind(kind)
    p = validate_params(spec, params, **overrides)
    if spec.uses_task and task is None:
        raise BadInput(f"analysis {kind!r} needs a task")
    if spec.uses_model and lm is None:
        raise BadInput(f"analysis {kind!r} needs a model")
    check_each_layer(lm)
    with checking(getattr(progress, "check", None)):
        return _analyze(spec, p, lm, task, cache, progress, live, tensors, key, plan)


def check_each_layer(lm: "LoadedModel | None") -> None:
    """A `check()` before every decoder layer of `lm`'s forward passes (installed once per model): a job gives way,
    stops or times out within one layer of a pass, not only between batches, whose one pass of 32 long prompts ran
    35-86 s on SmolLM2 at a load of 17 while a toggle waited for it. Outside a job the check does nothing."""
    if lm is not None:
        from ..model.interventions import check_before_layers

        check_before_layers(lm, check)


def _analyze(spec: Kind, p: Params, lm: "LoadedModel | None", task: "Task | None", cache: "bool | Store | None",
             progress: Progress | None, live: Callable[[dict[str, Any]], None] | None,
             tensors: "TensorSession | TensorStore | None", key: str | None = None, plan: Any = None) -> Result:
    kind = spec.name
    t0 = time.perf_counter()
    env = envelope(lm, task, p)
    progress = progress or _noop
    store = resolve_store(cache) if spec.cached else None
    tensors = session(tensors)

    def compute() -> dict[str, Any]:
        check()
        if spec.needs_fit and lm is not None and task is not None:
            require_fit(lm, task)  # a task whose words the model does not know is an error, not a result
        ctx = Context(lm, task, progress, store, report=live, tensors=tensors, plan=plan, planned_params=p)
        before = len(tensors.failures)
        with collect_multi_token() as firsts, bos.convention(getattr(p, "prepend_bos", None)):
            value = spec.function()(ctx, p)
        unsaved = {t: tensors.unsaved[t] for t in tensors.failures[before:]}  # this call's and its sub-calls'
        labels = sorted(set(firsts) | ctx.multi_token | set(value.get("multi_token_labels") or []))
        warnings = [w for w in [*ctx.warnings, *value.get("warnings", [])] if not is_multi_token_warning(w)]
        if unsaved:
            warnings = list(dict.fromkeys([*warnings, *(unsaved_warning(t, why) for t, (_, why) in unsaved.items())]))
        value = to_jsonable({**value, "warnings": ([multi_token_warning(labels, firsts)] if labels else []) + warnings,
                             "notes": list(dict.fromkeys([*ctx.notes, *value.get("notes", [])])),
                             "multi_token_labels": labels, "absent_inputs": ctx.absent})
        if unsaved:
            value["unsaved_tensors"] = {t: base64.b64encode(data).decode("ascii") for t, (data, _) in unsaved.items()}
        spec.result.model_validate({**value, **env})  # a malformed result fails here, before it is stored
        return value

    if store is None:
        value, hit = compute(), False
    else:
        key = key or cache_key(spec, lm, task, p)
        value, hit = _read(store, key, spec, env, lm, task, tensors=tensors), True
        if value is None:
            with LOCKS.hold(key, cancelled=lambda: bool(check() or progress(0.0, "waiting for the same computation"))):
                value = _read(store, key, spec, env, lm, task, tensors=tensors)
                if value is None:
                    value, hit = compute(), False
                    if not value.get("unsaved_tensors"):  # its tensors are not on disk: not a result to keep
                        store.put(key, value)
                        if spec.indexed:
                            _index(store, spec, lm, task, key, p)
    return spec.result.model_validate({**value, **env, "cache_hit": hit, "seconds": time.perf_counter() - t0})


def lookup(kind: str, lm: "LoadedModel | ModelRef | None", task: "Task | None" = None,
           params: "Params | Mapping[str, Any] | None" = None, *, cache: "bool | Store | None" = True,
           tensors: "TensorSession | TensorStore | None" = None, key: str | None = None,
           **overrides: Any) -> Result | None:
    """The cached result of `analyze(kind, ...)` with these arguments (or this `key`), or None; never computes.
    `lm` may be a `ModelRef`: the name and fingerprint are all a lookup needs."""
    spec = get_kind(kind)
    p = validate_params(spec, params, **overrides)
    store = resolve_store(cache) if spec.cached else None
    if store is None:
        return None
    t0 = time.perf_counter()
    env = envelope(lm, task, p)
    value = _read(store, key or cache_key(spec, lm, task, p), spec, env, lm, task, tensors=session(tensors))
    if value is None:
        return None
    return spec.result.model_validate({**value, **env, "cache_hit": True, "seconds": time.perf_counter() - t0})


def _read(store: Store, key: str, spec: Kind, env: dict[str, Any], lm: "LoadedModel | None" = None,
          task: "Task | None" = None, fresh: bool = True, tensors: TensorSession | None = None) -> dict[str, Any] | None:
    """The stored value when it fits the kind's result model, every tensor it refers to is there and intact, and
    (`fresh`) none of the other kinds' results it looked for and missed (`absent_inputs`) is cached now; None (and
    a log line) otherwise."""
    value = store.get(key)
    if value is None:
        return None
    try:
        spec.result.model_validate({**value, **env})
    except ValidationError as e:
        log.warning("cached %s result %s does not fit %s (%s); recomputing", spec.name, key, spec.result.__name__,
                    str(e).splitlines()[0])
        return None
    tensors = tensors or TensorSession()
    for tid in tensor_refs(value):
        if not tensors.has(tid):
            log.warning("cached %s result %s refers to tensor %s, which is gone or damaged; recomputing", spec.name,
                        key, tid)
            return None
    for miss in (value.get("absent_inputs") or []) if fresh else []:
        try:
            found = find_cached(miss["kind"], lm, task, miss["tries"], store) is not None
        except (KeyError, TypeError):
            found = False
        if found:
            log.info("cached %s result %s looked for a %s result that is cached now; recomputing", spec.name, key,
                     miss["kind"])
            return None
    return value


# -- the index: what is cached per kind, model and task, for `Context.cached` ---------------------------------------
def index_key(kind: str, lm: "LoadedModel | None", task: "Task | None") -> str:
    """The key of the index entry of `kind` on this model and task: {"entries": [{"key", "params"}, ...]}."""
    return make_key(INDEX + kind, model=lm.fingerprint if lm is not None else None,
                    task=task.content_hash() if task is not None else None)


def merge_index(store: Store, ikey: str, value: dict[str, Any]) -> None:
    """Add `value`'s entries to the index entry `ikey` (each key once, the newest last, at most INDEX_MAX). The
    caller holds the key's lock."""
    have = (store.get(ikey) or {}).get("entries") or []
    new = [e for e in value.get("entries") or [] if isinstance(e, dict) and isinstance(e.get("key"), str)]
    keys = {e["key"] for e in new}
    store.put(ikey, {"entries": ([e for e in have if isinstance(e, dict) and e.get("key") not in keys] + new)[-INDEX_MAX:]})


def _index(store: Store, spec: Kind, lm: "LoadedModel | None", task: "Task | None", key: str, p: Params) -> None:
    ikey = index_key(spec.key, lm, task)
    with LOCKS.hold(ikey):
        merge_index(store, ikey, {"entries": [{"key": key, "params": p.model_dump(mode="json")}]})


def find_cached(kind: str, lm: "LoadedModel | None", task: "Task | None", tries: "list[dict[str, Any]]",
                store: Store | None, tensors: TensorSession | None = None) -> Result | None:
    """What `Context.cached` finds (see there): for each try, the exact result with every other field at its
    default, else (an indexed kind) the cached results whose params hold the try's values, the one with the
    fewest fields off their defaults first, then the newest."""
    from .kinds import KINDS

    if kind not in KINDS or store is None:
        return None
    spec = get_kind(kind)
    fields = spec.params.model_fields
    try:
        defaults = spec.params().model_dump(mode="json")
    except ValidationError:
        defaults = {}
    entries: list[dict[str, Any]] | None = None

    def read(key: str, q: Params) -> Result | None:  # one level: what the found result itself missed is not chased
        env = envelope(lm, task, q)
        value = _read(store, key, spec, env, fresh=False, tensors=tensors)
        return None if value is None else spec.result.model_validate({**value, **env, "cache_hit": True})

    for want in tries:
        named = {k: v for k, v in want.items() if k in fields}
        try:
            p = validate_params(spec, named)
            r = read(cache_key(spec, lm, task, p), p)
        except (ValidationError, ValueError, TypeError):  # the kind's params changed shape: treat as absent
            continue
        if r is not None:
            return r
        if not spec.indexed:
            continue
        if entries is None:
            entries = list(reversed((store.get(index_key(spec.key, lm, task)) or {}).get("entries") or []))
        norm = p.model_dump(mode="json")
        same = set(named) | (CONVENTIONS & set(fields))  # a convention always matches (absent: its default)
        match = [e for e in entries if isinstance(e.get("params"), dict)
                 and all(e["params"].get(k, defaults.get(k)) == norm[k] if k in CONVENTIONS
                         else e["params"].get(k) == norm[k] for k in same)]
        match.sort(key=lambda e: sum(e["params"].get(k, v if k in CONVENTIONS else None) != v
                                     for k, v in defaults.items()))
        for e in match:
            try:
                r = read(e["key"], validate_params(spec, e["params"]))
            except (ValidationError, ValueError, TypeError):
                continue
            if r is not None:
                return r
    return None
