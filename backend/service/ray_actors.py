"""Where the Ray runner's actors go and how many there are: an actor's resources from the size of its model
(`placement`, `model_bytes`), what identifies a model's files (`model_signature`), and the pool of model-pinned
actors the runner acquires and releases (`ModelActors`). The actor itself: `ray_worker.py`."""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import BadInput
from .errors import ServiceError
from .execute import Cancelled
from .ray_cluster import ClusterLost, RayConfig
from .ray_worker import ModelWorker

log = logging.getLogger(__name__)

GPU_FRACTIONS = (0.125, 0.25, 0.5, 1.0)
MEMORY_OVERHEAD = 1.3  # weights x this = what a model needs on its device (activations, CUDA context)


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
        raise BadInput(f"the model needs about {n} GPUs of {gpu_bytes / 2**30:.0f} GB "
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
    from ..weights.model_sources import weights_folder

    folder = weights_folder(canonical) or Path(canonical)  # a preset or GGUF file: its converted folder
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
    from ..store.cache import make_key
    from ..weights.model_sources import weights_folder

    folder = weights_folder(canonical) or Path(canonical)  # a preset or GGUF file: its converted folder
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


# -- the pool of model actors ---------------------------------------------------------------------------------
@dataclass
class Actor:
    """One model actor of the pool: its Ray handle, the model it holds, where it was placed."""

    handle: Any
    model: str | None
    place: Placement
    info_ref: Any
    busy: bool = True
    last_used: float = field(default_factory=time.monotonic)
    info: dict[str, Any] | None = None
    reused: bool = False  # handed out idle (it may have died since its last job: the runner pings it first)

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
                 env: dict[str, str] | None = None, lost: Callable[[], str | None] = lambda: None):
        self.ray, self.cfg, self.reader, self.dtype, self.lost = ray, cfg, reader, dtype, lost
        self.env = env or {}
        self._actors: list[Actor] = []
        self._cond = threading.Condition()
        self._places: dict[str | None, Placement] = {}
        self._closed = False
        self._reaper = threading.Thread(target=self._reap, name="headlens-ray-reaper", daemon=True)
        self._reaper.start()

    # -- capacity ---------------------------------------------------------------------------------------------
    def _cluster(self) -> tuple[float, float, float]:
        """(total CPUs, total GPUs, GPUs of the largest node) of the cluster now (nodes may join or leave).
        ClusterLost when the head is lost meanwhile (these calls would wait for it)."""
        got: list[Any] = []

        def ask() -> None:
            total = self.ray.cluster_resources()
            per_node = [n.get("Resources", {}).get("GPU", 0.0) for n in self.ray.nodes() if n.get("Alive")]
            got.append((float(total.get("CPU", 0.0)), float(total.get("GPU", 0.0)),
                        float(max(per_node, default=0.0))))

        t = threading.Thread(target=ask, name="headlens-ray-resources", daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.5)
            if self.lost():
                raise ClusterLost(self.lost() or "")
        if not got:
            raise ServiceError("could not read the Ray cluster's resources", status=503)
        return got[0]

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
    def acquire(self, model: str | None, cancelled: Callable[[], bool]) -> Actor:
        place = self.placement_for(model)
        with self._cond:
            while True:
                if self._closed:
                    raise ServiceError("the job runner is shut down", status=503)
                if self.lost():
                    raise ClusterLost(self.lost() or "")
                idle = [a for a in self._actors if a.model == model and not a.busy]
                if idle:
                    a = max(idle, key=lambda a: a.last_used)
                    a.busy, a.reused = True, True
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

    def _make(self, model: str | None, place: Placement) -> Actor:
        opts: dict[str, Any] = {"num_cpus": place.num_cpus, "num_gpus": place.num_gpus, "max_concurrency": 4,
                                "max_restarts": 0}
        if self.env:
            opts["runtime_env"] = {"env_vars": self.env}
        handle = self.ray.remote(ModelWorker).options(**opts).remote(model, place.device, self.dtype,
                                                                      place.device_map, self.reader)
        a = Actor(handle, model, place, handle.info.remote())
        self._actors.append(a)
        log.info("ray: new actor for %s (%s)", model, place)
        return a

    def __contains__(self, a: Actor) -> bool:
        with self._cond:
            return a in self._actors

    def release(self, a: Actor) -> None:
        with self._cond:
            a.busy, a.last_used = False, time.monotonic()
            self._cond.notify_all()

    def forget(self, a: Actor) -> None:
        """Drop `a` from the pool without a Ray call (the cluster is lost)."""
        with self._cond:
            if a in self._actors:
                self._actors.remove(a)
            self._cond.notify_all()

    def make_room(self, pending: Actor) -> bool:
        """Release the least recently used idle actor (not `pending`), so that `pending`, an actor Ray has not
        started for want of CPUs (its node was lost after it was counted), can be placed; False when none is idle."""
        with self._cond:
            idle = sorted((a for a in self._actors if not a.busy and a is not pending), key=lambda a: a.last_used)
            if not idle:
                return False
            log.warning("ray: an actor for %s has not started; releasing the idle actor for %s to make room",
                        pending.model, idle[0].model)
            self._kill(idle[0])
            self._cond.notify_all()
            return True

    def wake(self) -> None:
        """Wake the jobs waiting for an actor (they check the cluster again)."""
        with self._cond:
            self._cond.notify_all()

    def discard(self, a: Actor) -> None:
        """Forget (and kill) an actor that died or would not stop."""
        with self._cond:
            self._kill(a)
            self._cond.notify_all()

    def _kill(self, a: Actor) -> None:
        if a in self._actors:
            self._actors.remove(a)
        try:
            self.ray.kill(a.handle, no_restart=True)
        except Exception:
            pass

    def alive(self, a: Actor, timeout: float = 10.0) -> bool:
        """Whether actor `a` answers (a ping to its `poll`); False once Ray reports it dead. Never under the lock."""
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            self.ray.get(a.handle.poll.remote(""), timeout=timeout)
            return True
        except GetTimeoutError:  # slow, not dead
            return True
        except RayActorError:
            return False

    def _replace_dead(self) -> None:
        """Ping the idle actors; one that died while idle (its process killed, its node gone) is discarded and a
        new one started for its model, so the next job finds a live one and no job is charged for that death."""
        with self._cond:
            idle = [a for a in self._actors if not a.busy]
        for a in idle:
            if self.alive(a, timeout=5.0):
                continue
            with self._cond:
                if self._closed or a not in self._actors or a.busy:
                    continue
                log.warning("ray: the idle actor for %s died; starting a new one", a.model)
                self._kill(a)
                if len(self._actors) < self.cfg.max_actors and self._fits(a.place):
                    self.release(self._make(a.model, a.place))
                self._cond.notify_all()

    def _reap(self) -> None:
        while True:
            time.sleep(min(5.0, max(0.5, self.cfg.idle_s / 4)))
            with self._cond:
                if self._closed or self.lost():  # no Ray calls once the head is lost: they would wait for it
                    return
                now = time.monotonic()
                for a in [a for a in self._actors if not a.busy and now - a.last_used > self.cfg.idle_s]:
                    log.info("ray: releasing idle actor for %s", a.model)
                    self._kill(a)
                self._cond.notify_all()
            try:
                self._replace_dead()
            except Exception as e:  # a ping that fails oddly: try again next round
                log.warning("ray: checking idle actors failed (%s)", e)

    def describe(self) -> list[dict[str, Any]]:
        """The actors now: model, resources, busy, and (once started) pid and node."""
        with self._cond:
            actors = list(self._actors)
        return [{"model": a.model, "num_gpus": a.place.num_gpus, "num_cpus": a.place.num_cpus,
                 "device_map": a.place.device_map, "busy": a.busy, **a.where(self.ray, 0.5)} for a in actors]

    def close(self, kill: bool = True) -> None:
        with self._cond:
            self._closed = True
            for a in list(self._actors):
                if kill:
                    self._kill(a)
                else:
                    self._actors.remove(a)
            self._cond.notify_all()
