"""What runs on the Ray cluster: the actor that holds one model and runs analyses on it (`ModelWorker`), the store
its analyses read and record through (`RecordingStore`), and the actor that reads the service's cache for them
(`CacheReader`). The service side: `ray_actors.py` and `ray_runner.py`."""
from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any, Callable

from .jobs import Cancelled

log = logging.getLogger(__name__)


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
