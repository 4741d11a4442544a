"""The Ray job runner: the same `JobRunner` interface, jobs run on model-pinned Ray actors.

    HEADLENS_RUNNER=ray python -m backend serve       # RAY_ADDRESS=host:6379 (unset: a local Ray instance)

What stays in the service (the routes' process), exactly as with `LocalJobRunner` (this runner *is* one, with
`workers` dispatch threads and an executor that ships each job to Ray): the job table, dedupe by key (eight
identical requests share one job), submitter counting for DELETE, per-key locks, and every write to the result
cache. What runs on the cluster: `analyze(...)` on an actor that holds the model.

Placement (`ModelActors`): one actor per (model, device) holds the loaded model. Its resources come from the
model's size (`placement`): no GPU in the cluster -> `num_cpus` only; a model that fits a GPU -> the smallest
of 1/8, 1/4, 1/2 or 1 GPU that holds it (small models share a GPU); a larger one -> `ceil(size / GPU)` GPUs of
one node and `device_map="auto"`. A job goes to an idle actor of its model; else a new actor is made while the
cluster has room and fewer than HEADLENS_RAY_MAX_ACTORS exist; else an idle actor of another model is released
to make room (at once for a model without an actor, after HEADLENS_RAY_EVICT_S idle for one more replica); else
the job waits for one. Actors idle for HEADLENS_RAY_IDLE_S are released. Ray does the rest:
it places actors on nodes with the resources, starts their processes and reports their deaths.

Results: the actor runs `analyze` with a `RecordingStore`: reads go to the service's cache (through a small
`CacheReader` actor pinned to the service's node, so workers need not share its disk), writes are recorded and
returned with the result. The service writes them, each under the kernel's per-key lock, after the job has
succeeded: diskcache stays on one disk with one writer, and a job that dies writes nothing. Cache keys and
the dedupe key are the kernel's and the admission's, unchanged. Once an actor has reported a model's
fingerprint (kept in the cache under the model files' signature, so a restarted service or a rerun of a sweep
knows it too), a job whose result is cached is answered by the service without touching the cluster.

Progress and cancel: the service polls the actor (`poll`) while the job runs and feeds the job's progress and
live data; a DELETE makes the job's progress callback raise `Cancelled` in the service, which then cancels the
Ray task (`ray.cancel`: dropped if still queued) and tells the actor (`cancel`), whose own progress callback
raises `Cancelled` inside the analysis. An actor that does not stop within HEADLENS_RAY_CANCEL_GRACE_S is
killed (and replaced when needed).

Faults: a worker that dies mid-job (its process killed, its node gone) is discarded and the job is retried on
another actor, up to HEADLENS_RAY_RETRIES times; then the job fails with an error naming the node(s). `ray` not
installed, or a cluster that does not answer within HEADLENS_RAY_CONNECT_TIMEOUT_S, is `RunnerUnavailable`
(one line, at start-up), never a hang.

| variable | default | meaning |
|---|---|---|
| HEADLENS_RUNNER | local | `local` (one worker thread) or `ray` |
| RAY_ADDRESS | unset | the cluster (`host:6379`, `auto`); unset: the `ray start` cluster of this machine, else a new local instance |
| HEADLENS_RAY_MAX_ACTORS | 4 | model actors at most (also the jobs running at once) |
| HEADLENS_RAY_IDLE_S | 300 | an actor idle this long is released |
| HEADLENS_RAY_EVICT_S | 10 | an idle actor of another model gives way to one more replica after this long |
| HEADLENS_RAY_RETRIES | 2 | retries of a job whose worker died |
| HEADLENS_RAY_GPU_GB | 80 | memory of one GPU, for placement |
| HEADLENS_RAY_ACTOR_CPUS | 1 | CPUs an actor reserves |
| HEADLENS_RAY_NUM_CPUS | unset | CPUs of a local Ray instance (unset: all) |
| HEADLENS_RAY_CONNECT_TIMEOUT_S | 30 | give up connecting after this long |
| HEADLENS_RAY_CANCEL_GRACE_S | 20 | a cancelled job's actor is killed when it has not stopped by then |
| HEADLENS_RAY_PYTHONPATH | unset | extra folders on the workers' Python path (the repository is always on it) |
"""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import ServiceError, clip
from .jobs import Cancelled, JobProgress, LocalJobRunner, Progress
from .limits import Limits, env_number
from ..paths import REPO_ROOT, cache_dir

log = logging.getLogger(__name__)

GPU_FRACTIONS = (0.125, 0.25, 0.5, 1.0)
MEMORY_OVERHEAD = 1.3  # weights x this = what a model needs on its device (activations, CUDA context)
PASS_ENV = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HF_TOKEN",
            "HEADLENS_DTYPE", "HEADLENS_MODEL_ROOT")


class RunnerUnavailable(ValueError):
    """The configured runner cannot start (Ray missing, cluster unreachable, a bad setting): one line."""


class WorkerLost(ServiceError):
    """A job whose worker died on every attempt."""

    status = 500


def _env_num(name: str, default: float, minimum: float = 0) -> float:
    try:
        return env_number(name, default, minimum)
    except ValueError as e:
        raise RunnerUnavailable(str(e)) from None


@dataclass(frozen=True)
class RayConfig:
    address: str | None = None
    max_actors: int = 4
    idle_s: float = 300.0
    evict_s: float = 10.0
    retries: int = 2
    gpu_gb: float = 80.0
    actor_cpus: float = 1.0
    num_cpus: int | None = None
    connect_timeout_s: float = 30.0
    cancel_grace_s: float = 20.0
    poll_s: float = 0.2
    pythonpath: tuple[str, ...] = ()

    @classmethod
    def from_env(cls) -> "RayConfig":
        d = cls()
        n = os.environ.get("HEADLENS_RAY_NUM_CPUS")
        extra = tuple(p for p in (os.environ.get("HEADLENS_RAY_PYTHONPATH") or "").split(os.pathsep) if p)
        return cls(address=(os.environ.get("RAY_ADDRESS") or "").strip() or None,
                   max_actors=int(_env_num("HEADLENS_RAY_MAX_ACTORS", d.max_actors, 1)),
                   idle_s=_env_num("HEADLENS_RAY_IDLE_S", d.idle_s, 0),
                   evict_s=_env_num("HEADLENS_RAY_EVICT_S", d.evict_s, 0),
                   retries=int(_env_num("HEADLENS_RAY_RETRIES", d.retries, 0)),
                   gpu_gb=_env_num("HEADLENS_RAY_GPU_GB", d.gpu_gb, 0.1),
                   actor_cpus=_env_num("HEADLENS_RAY_ACTOR_CPUS", d.actor_cpus, 0),
                   num_cpus=int(_env_num("HEADLENS_RAY_NUM_CPUS", 1, 1)) if n else None,
                   connect_timeout_s=_env_num("HEADLENS_RAY_CONNECT_TIMEOUT_S", d.connect_timeout_s, 1),
                   cancel_grace_s=_env_num("HEADLENS_RAY_CANCEL_GRACE_S", d.cancel_grace_s, 0),
                   pythonpath=extra)


# -- placement: resources from the model's size ---------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """What one model's actor asks Ray for, and how it loads the model."""

    num_gpus: float
    num_cpus: float
    device: str  # "cpu" or "cuda"
    device_map: str | None = None  # "auto" when the model spans several GPUs

    @property
    def key(self) -> str:
        return f"{self.device}x{self.num_gpus:g}"


def placement(model_bytes: int | None, gpu_bytes: float, gpus_per_node: float, cpus: float = 1.0) -> Placement:
    """Resources for an actor holding a model of `model_bytes` (as loaded; None: unknown, taken as fitting one
    GPU) on a cluster whose largest node has `gpus_per_node` GPUs of `gpu_bytes` each (0: CPU only)."""
    if gpus_per_node <= 0:
        return Placement(0.0, cpus, "cpu")
    need = (model_bytes or 0) * MEMORY_OVERHEAD / gpu_bytes if model_bytes else 1.0
    if need <= 1.0:
        frac = next(f for f in GPU_FRACTIONS if need <= f)
        return Placement(frac, cpus, "cuda")
    n = math.ceil(need)
    if n > gpus_per_node:
        raise ValueError(f"the model needs about {n} GPUs of {gpu_bytes / 2**30:.0f} GB "
                         f"({model_bytes / 2**30:.1f} GB of weights), but the largest node has "
                         f"{gpus_per_node:g}; device_map spreads a model over the GPUs of one node only")
    return Placement(float(n), cpus, "cuda", "auto")


_DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
                "half": 2, "float64": 8, "int8": 1}


def model_bytes(canonical: str | None, target_dtype: str | None = None, device: str = "cuda") -> int | None:
    """The size of a model's weights as it will be loaded (in `target_dtype`; default bf16 on GPU, fp32 on CPU),
    from its files: a local folder's weight files, or a hub id's cached index or weights. None when unknown."""
    if not canonical:
        return None
    from ..paths import DEFAULT_MODEL_DIR

    folder = DEFAULT_MODEL_DIR if canonical == "default" else Path(canonical)
    stored, size = None, None
    try:
        if folder.is_dir():
            size = sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt"))
            cfg = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
            stored = cfg.get("torch_dtype") or cfg.get("dtype")
        else:
            from huggingface_hub import try_to_load_from_cache

            index = try_to_load_from_cache(canonical, "model.safetensors.index.json")
            if isinstance(index, str):
                size = int(json.loads(Path(index).read_text()).get("metadata", {}).get("total_size") or 0) or None
            else:
                single = try_to_load_from_cache(canonical, "model.safetensors")
                size = Path(single).stat().st_size if isinstance(single, str) else None
            cfg_path = try_to_load_from_cache(canonical, "config.json")
            if isinstance(cfg_path, str):
                cfg = json.loads(Path(cfg_path).read_text())
                stored = cfg.get("torch_dtype") or cfg.get("dtype")
    except Exception:  # unreadable files: size unknown
        return None
    if not size:
        return None
    target = target_dtype or ("bf16" if device.startswith("cuda") else "fp32")
    per_stored = _DTYPE_BYTES.get(str(stored or "float32").lower(), 4)
    return int(size * _DTYPE_BYTES.get(str(target).lower(), 2) / per_stored)


def model_signature(canonical: str) -> str | None:
    """What identifies a model's files without reading them: a folder's config and weight files (name, size,
    mtime), or a hub id's cached snapshot (its revision). None when unknown. A restarted service finds the
    fingerprint an actor reported under it, so its cached results need no actor (and no model load)."""
    from ..cache import make_key
    from ..paths import DEFAULT_MODEL_DIR

    folder = DEFAULT_MODEL_DIR if canonical == "default" else Path(canonical)
    try:
        if folder.is_dir():
            files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".json"))
            parts = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
        else:
            from huggingface_hub import try_to_load_from_cache

            cfg = try_to_load_from_cache(canonical, "config.json")
            if not isinstance(cfg, str):
                return None
            parts = [str(Path(cfg).parent)]  # .../snapshots/<revision>
    except Exception:
        return None
    return make_key("fingerprint", model=canonical, files=parts) if parts else None


# -- what runs on the cluster ---------------------------------------------------------------------------------
class CacheReader:
    """A Ray actor on the service's node that reads the result cache for the workers (they never write it)."""

    def __init__(self, directory: str):
        from ..cache import ResultCache

        self._cache = ResultCache(directory)

    def get(self, key: str) -> dict[str, Any] | None:
        return self._cache.get(key)


class RecordingStore:
    """The store an actor's `analyze` uses: reads through `read` (the service's cache), records every put.
    Its recorded puts go back with the result; the service writes them."""

    def __init__(self, read: Callable[[str], dict[str, Any] | None]):
        self._read = read
        self.puts: dict[str, dict[str, Any]] = {}

    def get(self, key: str) -> dict[str, Any] | None:
        if key in self.puts:
            return self.puts[key]
        try:
            return self._read(key)
        except Exception as e:  # the reader is gone: a miss, never a failure
            log.warning("cache read of %s failed (%s); computing", key, type(e).__name__)
            return None

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.puts[key] = value


class ModelWorker:
    """The actor: holds one model (loaded on first use) and runs analyses on it, one job at a time.

    Methods besides `run` (poll, cancel, info) answer while a job runs (the actor has a few threads)."""

    def __init__(self, model: str | None, device: str, dtype: str | None, device_map: str | None, reader: Any):
        import tempfile

        # per-key locks and any file an analysis writes stay private to this worker: the service owns the cache
        os.environ["HEADLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="headlens-worker-")
        self._model, self._device, self._dtype, self._device_map = model, device, dtype, device_map
        self._reader = reader
        self._lm: Any = None
        self._lock = threading.Lock()
        self._state: dict[str, list[Any]] = {}  # call id -> [fraction, message, live, cancelled]

    def info(self) -> dict[str, Any]:
        try:
            import ray

            ctx = ray.get_runtime_context()
            node_id, ip = ctx.get_node_id(), ray.util.get_node_ip_address()
        except Exception:
            node_id, ip = None, None
        return {"pid": os.getpid(), "node_id": node_id, "node_ip": ip, "host": socket.gethostname(),
                "model": self._model, "device": self._device}

    def _model_obj(self) -> Any:
        if self._lm is None and self._model is not None:
            from ..models import load_model

            self._lm = load_model(self._model, device=self._device, dtype=self._dtype, device_map=self._device_map)
        return self._lm

    def poll(self, call: str) -> tuple[float | None, str, Any]:
        st = self._state.get(call)
        return (st[0], st[1], st[2]) if st else (None, "", None)

    def cancel(self, call: str) -> None:
        st = self._state.get(call)
        if st is not None:
            st[3] = True

    def run(self, call: str, spec: Any, fields: dict[str, Any], task: Any) -> dict[str, Any]:
        from ..analysis.kernel import analyze
        from ..analysis.kinds import KINDS, register

        if KINDS.get(spec.name) != spec:  # a kind registered at run time in the service (plugins, tests)
            register(spec, replace=True)
        st = self._state[call] = [0.0, "loading the model", None, False]

        def progress(fraction: float, message: str = "") -> None:
            if st[3]:
                raise Cancelled()
            st[0], st[1] = fraction, message or st[1]

        def live(data: dict[str, Any]) -> None:
            if st[3]:
                raise Cancelled()
            st[2] = data

        import ray

        reader = self._reader
        store = RecordingStore(lambda key: ray.get(reader.get.remote(key), timeout=60))
        try:
            with self._lock:
                lm = self._model_obj() if spec.uses_model else None
                progress(0.0, "running")
                r = analyze(spec.name, lm, task, fields, cache=store if spec.cached else False,
                            progress=progress, live=live)
            return {"result": r.to_json(), "puts": list(store.puts.items()),
                    "model": None if lm is None else {"name": lm.name, "fingerprint": lm.fingerprint}}
        finally:
            self._state.pop(call, None)


# -- the service side -----------------------------------------------------------------------------------------
@dataclass
class _Actor:
    handle: Any
    model: str | None
    place: Placement
    info_ref: Any
    busy: bool = True
    last_used: float = field(default_factory=time.monotonic)
    info: dict[str, Any] | None = None

    def where(self, ray: Any, wait: float = 1.0) -> dict[str, Any]:
        if self.info is None:
            try:
                self.info = ray.get(self.info_ref, timeout=wait)
            except Exception:
                return {}
        return self.info


class ModelActors:
    """Model-pinned actors: acquire one for a model (making, reusing or releasing actors), release it after."""

    def __init__(self, ray: Any, cfg: RayConfig, reader: Any, dtype: str | None = None,
                 env: dict[str, str] | None = None):
        self.ray, self.cfg, self.reader, self.dtype = ray, cfg, reader, dtype
        self.env = env or {}
        self._actors: list[_Actor] = []
        self._cond = threading.Condition()
        self._places: dict[str | None, Placement] = {}
        self._closed = False
        self._reaper = threading.Thread(target=self._reap, name="headlens-ray-reaper", daemon=True)
        self._reaper.start()

    # -- capacity ---------------------------------------------------------------------------------------------
    def _cluster(self) -> tuple[float, float, float]:
        """(total CPUs, total GPUs, GPUs of the largest node) of the cluster now (nodes may join or leave)."""
        total = self.ray.cluster_resources()
        per_node = [n.get("Resources", {}).get("GPU", 0.0) for n in self.ray.nodes() if n.get("Alive")]
        return float(total.get("CPU", 0.0)), float(total.get("GPU", 0.0)), float(max(per_node, default=0.0))

    def placement_for(self, model: str | None) -> Placement:
        if model not in self._places:
            _, _, per_node = self._cluster()
            device = "cuda" if per_node > 0 else "cpu"
            size = model_bytes(model, self.dtype, device) if model else None
            self._places[model] = placement(size, self.cfg.gpu_gb * 2**30, per_node if model else 0,
                                            self.cfg.actor_cpus)
        return self._places[model]

    def _fits(self, place: Placement) -> bool:
        cpus, gpus, _ = self._cluster()
        used_c = sum(a.place.num_cpus for a in self._actors)
        used_g = sum(a.place.num_gpus for a in self._actors)
        return used_c + place.num_cpus <= cpus + 1e-9 and used_g + place.num_gpus <= gpus + 1e-9

    # -- acquire / release ------------------------------------------------------------------------------------
    def acquire(self, model: str | None, cancelled: Callable[[], bool]) -> _Actor:
        place = self.placement_for(model)
        with self._cond:
            while True:
                if self._closed:
                    raise ServiceError("the job runner is shut down", status=503)
                idle = [a for a in self._actors if a.model == model and not a.busy]
                if idle:
                    a = max(idle, key=lambda a: a.last_used)
                    a.busy = True
                    return a
                room = len(self._actors) < self.cfg.max_actors
                if room and self._fits(place):
                    return self._make(model, place)
                # release the least recently used idle actor of another model to make room: at once for a model
                # with no actor yet, after HEADLENS_RAY_EVICT_S idle for one more replica (no thrashing)
                first = not any(a.model == model for a in self._actors)
                now = time.monotonic()
                others = sorted((a for a in self._actors if not a.busy
                                 and (first or now - a.last_used >= self.cfg.evict_s)), key=lambda a: a.last_used)
                if others:
                    self._kill(others[0])
                    continue
                if not self._actors:  # nothing to wait for: let Ray queue it (an autoscaler may add a node)
                    return self._make(model, place)
                self._cond.wait(0.25)
                if cancelled():
                    raise Cancelled()

    def _make(self, model: str | None, place: Placement) -> _Actor:
        opts: dict[str, Any] = {"num_cpus": place.num_cpus, "num_gpus": place.num_gpus, "max_concurrency": 4,
                                "max_restarts": 0}
        if self.env:
            opts["runtime_env"] = {"env_vars": self.env}
        handle = self.ray.remote(ModelWorker).options(**opts).remote(model, place.device, self.dtype,
                                                                      place.device_map, self.reader)
        a = _Actor(handle, model, place, handle.info.remote())
        self._actors.append(a)
        log.info("ray: new actor for %s (%s)", model, place)
        return a

    def __contains__(self, a: _Actor) -> bool:
        with self._cond:
            return a in self._actors

    def release(self, a: _Actor) -> None:
        with self._cond:
            a.busy, a.last_used = False, time.monotonic()
            self._cond.notify_all()

    def discard(self, a: _Actor) -> None:
        """Forget (and kill) an actor that died or would not stop."""
        with self._cond:
            self._kill(a)
            self._cond.notify_all()

    def _kill(self, a: _Actor) -> None:
        if a in self._actors:
            self._actors.remove(a)
        try:
            self.ray.kill(a.handle, no_restart=True)
        except Exception:
            pass

    def _reap(self) -> None:
        while True:
            time.sleep(min(5.0, max(0.5, self.cfg.idle_s / 4)))
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                for a in [a for a in self._actors if not a.busy and now - a.last_used > self.cfg.idle_s]:
                    log.info("ray: releasing idle actor for %s", a.model)
                    self._kill(a)
                self._cond.notify_all()

    def describe(self) -> list[dict[str, Any]]:
        """The actors now: model, resources, busy, and (once started) pid and node."""
        with self._cond:
            actors = list(self._actors)
        return [{"model": a.model, "num_gpus": a.place.num_gpus, "num_cpus": a.place.num_cpus,
                 "device_map": a.place.device_map, "busy": a.busy, **a.where(self.ray, 0.5)} for a in actors]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for a in list(self._actors):
                self._kill(a)
            self._cond.notify_all()


@dataclass(frozen=True)
class _ModelRef:
    """What the kernel needs of a model to look a result up: its name and fingerprint (no weights)."""

    name: str
    fingerprint: str


def connect(cfg: RayConfig) -> tuple[Any, bool]:
    """(the ray module, whether this call started Ray). RAY_ADDRESS set: that cluster (RunnerUnavailable at once
    when nothing answers there); unset: the cluster `ray start` runs on this machine, else a new local instance
    (HEADLENS_RAY_NUM_CPUS set: always a new one, of that many CPUs). RunnerUnavailable when Ray is not installed."""
    address = cfg.address or ("local" if cfg.num_cpus else None)
    # a cluster started by `ray start --head` wants its token (token authentication, Ray's default): use the one
    # this machine has (Ray reads the mode when it is imported, so set it before)
    if address != "local" and "RAY_AUTH_MODE" not in os.environ and (
            os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
            or (Path.home() / ".ray" / "auth_token").is_file()):
        os.environ["RAY_AUTH_MODE"] = "token"
    try:
        import ray
    except ImportError:
        raise RunnerUnavailable("HEADLENS_RUNNER=ray needs Ray: pip install -r requirements-ray.txt") from None
    if ray.is_initialized():
        return ray, False
    if address and address not in ("auto", "local") and not address.startswith("ray://"):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or address, int(port or 6379)), timeout=min(5.0, cfg.connect_timeout_s)
                                     ).close()
        except (OSError, ValueError) as e:
            raise RunnerUnavailable(f"the Ray cluster at RAY_ADDRESS={address} is unreachable "
                                    f"({type(e).__name__}: {e}); start it with `ray start --head`") from None
        _probe_gcs(address, cfg.connect_timeout_s)
    kw: dict[str, Any] = {"include_dashboard": False, "logging_level": "warning", "log_to_driver": False,
                          "ignore_reinit_error": True, "address": address}
    if address == "local" and cfg.num_cpus:
        kw["num_cpus"] = cfg.num_cpus
    where = (f"the Ray cluster at RAY_ADDRESS={address}" if cfg.address else
             "a new local Ray instance" if address == "local" else "Ray (this machine's cluster, or a new instance)")
    t0 = time.monotonic()
    try:  # in the calling thread: Ray's driver must be initialised from the thread that later uses it
        ray.init(**kw)
    except Exception as e:
        hint = ("; with token authentication, the head's token must be here too (~/.ray/auth_token, or "
                "RAY_AUTH_TOKEN)" if address != "local" else "")
        raise RunnerUnavailable(f"could not connect to {where}: {type(e).__name__}: "
                                f"{(str(e).splitlines() or [''])[0][:300]}{hint}") from None
    if time.monotonic() - t0 > cfg.connect_timeout_s:
        log.warning("connecting to %s took %.0f s", where, time.monotonic() - t0)
    # shut it down on close only when this process started it (not when it joined a running cluster)
    started = address == "local" or (address is None and ray.get_runtime_context().gcs_address is not None
                                     and _started_here(ray))
    return ray, started


class RayJobRunner(LocalJobRunner):
    """`LocalJobRunner`'s bookkeeping (dedupe, submitters, locks, cancel) with jobs executed on Ray actors."""

    def __init__(self, pool: Any, tasks: Any, limits: Limits | None = None, config: RayConfig | None = None,
                 cache_directory: str | Path | None = None):
        self.cfg = config or RayConfig.from_env()
        self.ray, self._owns_ray = connect(self.cfg)
        self.pool, self.tasks = pool, tasks
        from ..cache import ResultCache

        self.cache_directory = Path(cache_directory) if cache_directory else cache_dir()
        self.store = ResultCache(self.cache_directory)
        self._fingerprints: dict[str, _ModelRef] = {}
        self.retried = 0  # jobs run again because their worker died
        paths = [str(REPO_ROOT), *self.cfg.pythonpath]
        env = {k: os.environ[k] for k in PASS_ENV if os.environ.get(k)}
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths + [p for p in os.environ.get("PYTHONPATH", "")
                                                                 .split(os.pathsep) if p]))
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = self.ray.get_runtime_context().get_node_id()
        self.reader = self.ray.remote(CacheReader).options(
            num_cpus=0, max_concurrency=16, max_restarts=-1, runtime_env={"env_vars": env},
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote(str(self.cache_directory))
        self.actors = ModelActors(self.ray, self.cfg, self.reader, dtype=getattr(pool, "dtype", None), env=env)
        super().__init__(self._execute_on_ray, limits=limits, workers=self.cfg.max_actors)

    # -- executing one job ------------------------------------------------------------------------------------
    def _execute_on_ray(self, kind: str, params: dict[str, Any], progress: Progress) -> dict[str, Any]:
        from ..analysis.kernel import lookup
        from ..analysis.kinds import get_kind

        spec = get_kind(kind)
        fields = dict(params)
        model, task_id = fields.pop("model", None), fields.pop("task", None)
        task = self.tasks.get(task_id) if spec.uses_task else None
        canon = self.pool.check(model) if spec.uses_model else None
        ref = self._fingerprint(canon) if canon else None
        if spec.cached and (ref is not None or not spec.uses_model):
            hit = lookup(kind, ref, task, fields, cache=self.store)
            if hit is not None:
                return hit.to_json()
        lost: list[str] = []
        for attempt in range(self.cfg.retries + 1):
            progress(0.0, f"waiting for a Ray worker for {model or kind}" + (f" (retry {attempt})" if attempt else ""))
            a = self.actors.acquire(canon, cancelled=lambda: _cancelled(progress, 0.0))
            try:
                out = self._run_on(a, spec, fields, task, progress)
            except _Died as e:
                log.warning("ray: worker for %s died on %s (attempt %d): %s", model, e.node, attempt + 1, e.cause)
                lost.append(e.node)
                if attempt < self.cfg.retries:
                    self.retried += 1
                continue
            finally:
                if a.busy and a in self.actors:
                    self.actors.release(a)
            if out.get("model") and canon:
                self._remember(canon, _ModelRef(**out["model"]))
            self._write(out["puts"])
            return out["result"]
        raise WorkerLost(f"the worker running this job died {len(lost)} time{'s' if len(lost) != 1 else ''} "
                         f"(on {', '.join(dict.fromkeys(lost))}); gave up after {self.cfg.retries} "
                         f"retr{'ies' if self.cfg.retries != 1 else 'y'} (HEADLENS_RAY_RETRIES)")

    def _run_on(self, a: _Actor, spec: Any, fields: dict[str, Any], task: Any, progress: Progress) -> dict[str, Any]:
        """Run the job on actor `a`, feeding `progress`; raises _Died when the actor dies (it is discarded),
        Cancelled when the job is cancelled, whatever `progress` raises (a time limit), or the analysis' error; the
        actor's task is then stopped (released, or killed if it hangs on)."""
        ray = self.ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        call = uuid.uuid4().hex
        ref = a.handle.run.remote(call, spec, fields, task)
        last = 0.0
        try:
            try:
                while True:
                    ready, _ = ray.wait([ref], timeout=self.cfg.poll_s)
                    if ready:
                        break
                    try:
                        frac, msg, live = ray.get(a.handle.poll.remote(call), timeout=10)
                    except GetTimeoutError:
                        frac, msg, live = None, "", None
                    except RayActorError:
                        continue  # the run ref reports the death
                    last = last if frac is None else frac
                    progress(last, msg)  # raises Cancelled once the job is cancelled
                    if live is not None and isinstance(progress, JobProgress):
                        progress.live(live)
                return ray.get(ref)
            except RayTaskError as e:  # the analysis raised: its own exception, as the local runner would see it
                cause = getattr(e, "cause", None)
                if isinstance(cause, BaseException) and not isinstance(cause, RayActorError):
                    raise cause from None
                lines = [ln for ln in str(e).splitlines() if ln.strip()]
                raise RuntimeError(lines[-1][:500] if lines else type(e).__name__) from None
        except RayActorError as e:
            self.actors.discard(a)
            raise _Died(_node_name(a.where(ray, 0.5)), e) from None
        except BaseException:  # Cancelled or the time limit from `progress`, or the analysis' own error:
            self._stop(a, ref, call)  # a finished task just releases the actor; a running one is stopped
            raise

    def _stop(self, a: _Actor, ref: Any, call: str) -> None:
        """Cancel a job running on `a`: the Ray task, and the analysis (cooperatively); kill `a` if it hangs on."""
        ray = self.ray
        try:
            a.handle.cancel.remote(call)
            ray.cancel(ref)
        except Exception:
            pass
        ready, _ = ray.wait([ref], timeout=self.cfg.cancel_grace_s)
        if ready:
            self.actors.release(a)
        else:
            log.warning("ray: a cancelled job did not stop within %.0f s; killing its actor", self.cfg.cancel_grace_s)
            self.actors.discard(a)

    def _fingerprint(self, canon: str) -> _ModelRef | None:
        """The model's name and fingerprint as an actor reported them (this run, or an earlier one on the same
        files, from the cache), or None."""
        ref = self._fingerprints.get(canon)
        if ref is None:
            sig = model_signature(canon)
            got = self.store.get(sig) if sig else None
            if got and isinstance(got.get("name"), str) and isinstance(got.get("fingerprint"), str):
                ref = self._fingerprints[canon] = _ModelRef(got["name"], got["fingerprint"])
        return ref

    def _remember(self, canon: str, ref: _ModelRef) -> None:
        if self._fingerprints.get(canon) != ref:
            self._fingerprints[canon] = ref
            sig = model_signature(canon)
            if sig:
                self.store.put(sig, {"name": ref.name, "fingerprint": ref.fingerprint})

    def _write(self, puts: list[tuple[str, dict[str, Any]]]) -> None:
        """Write an actor's results to the cache, each under the kernel's per-key lock (as the kernel does)."""
        from ..analysis.kernel import _LOCKS

        for key, value in puts:
            with _LOCKS.hold(key):
                if self.store.get(key) is None:
                    self.store.put(key, value)

    # -- shutdown (the actors: self.actors.describe()) ----------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        super().close(timeout)
        self.actors.close()
        try:
            self.ray.kill(self.reader)
        except Exception:
            pass
        if self._owns_ray:
            self.ray.shutdown()


def _probe_gcs(address: str, timeout: float) -> None:
    """RunnerUnavailable unless a Ray GCS answers at `address` within `timeout` s: something else listening there
    (or a GCS that never answers) would otherwise hold `ray.init` for minutes. The probe runs in a helper thread
    (ray.init itself must run in the caller's), which is left behind if it hangs."""
    done: list[BaseException | None] = []

    def probe() -> None:
        try:
            from ray._raylet import GcsClient

            GcsClient(address=address)  # fetches the cluster id: a GCS answers at once
            done.append(None)
        except BaseException as e:  # noqa: BLE001  (reported below)
            done.append(e)

    t = threading.Thread(target=probe, name="headlens-ray-probe", daemon=True)
    t.start()
    t.join(timeout)
    if not done:
        raise RunnerUnavailable(f"no Ray cluster answered at RAY_ADDRESS={address} within {timeout:g} s "
                                f"(HEADLENS_RAY_CONNECT_TIMEOUT_S); is it the head's GCS port (ray start --head "
                                f"--port)?")
    if done[0] is not None:
        e = done[0]
        raise RunnerUnavailable(f"no Ray cluster at RAY_ADDRESS={address}: {type(e).__name__}: "
                                f"{(str(e).splitlines() or [''])[0][:300]}; with token authentication, the head's "
                                f"token must be here too (~/.ray/auth_token, or RAY_AUTH_TOKEN)")


def _started_here(ray: Any) -> bool:
    """Whether this process started the Ray instance it is connected to (rather than joining one)."""
    try:
        return bool(ray._private.worker.global_worker.node.is_head())  # a driver that started Ray owns its head
    except Exception:
        return False


class _Died(Exception):
    def __init__(self, node: str, cause: BaseException):
        super().__init__(node)
        self.node, self.cause = node, cause


def _node_name(info: dict[str, Any]) -> str:
    if not info:
        return "node unknown (the worker died before it started)"
    return f"node {info.get('node_ip') or '?'} ({info.get('host') or '?'}, pid {info.get('pid')})"


def _cancelled(progress: Progress, fraction: float) -> bool:
    try:
        progress(fraction, "")
    except Cancelled:
        return True
    return False


# -- choosing the runner --------------------------------------------------------------------------------------
def make_runner(pool: Any, tasks: Any, limits: Limits | None = None) -> LocalJobRunner:
    """The runner HEADLENS_RUNNER names: `local` (default) or `ray`. RunnerUnavailable for anything else, or
    when Ray cannot be used."""
    from .jobs import make_executor

    name = (os.environ.get("HEADLENS_RUNNER") or "local").strip().lower()
    if name == "local":
        return LocalJobRunner(make_executor(pool, tasks), limits=limits)
    if name == "ray":
        return RayJobRunner(pool, tasks, limits=limits)
    raise RunnerUnavailable(f"HEADLENS_RUNNER must be `local` or `ray`, not {clip(name, 60)!r}")
