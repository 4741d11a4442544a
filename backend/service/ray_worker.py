"""What runs on the Ray cluster: the actor that holds one model and runs analyses on it (`ModelWorker`), the stores
its analyses read and record through (`RecordingStore` for results, `RecordingTensors` for trained tensors), and
the actor that reads the service's cache and tensor folder for them (`CacheReader`). Nothing an analysis makes is
written on the worker: results and tensors go back with the job's result, and the service writes them. The
service side: `ray_actors.py` and `ray_runner.py`."""
from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

from ..analysis.primitives.stopping import checking
from ..store.tensor_store import TensorStore, TensorWriteError, is_id, missing
from .execute import Cancelled

log = logging.getLogger(__name__)


class CacheReader:
    """A Ray actor on the service's node that reads the result cache for the workers (they never write it)."""

    def __init__(self, directory: str):
        from ..store.cache import ResultCache

        self._cache = ResultCache(directory)
        self._tensors = TensorStore(Path(directory) / "tensors")

    def get(self, key: str) -> dict[str, Any] | None:
        return self._cache.get(key)

    def tensor(self, tid: str) -> bytes | None:
        """A stored tensor's bytes (checked against its id), or None."""
        try:
            return self._tensors.get(tid)
        except ValueError:
            return None

    def has_tensor(self, tid: str) -> bool:
        return self._tensors.has(tid)

    def tensors_writable(self) -> str | None:
        """None when the service's tensor folder takes a file, else why not."""
        try:
            self._tensors.check_writable()
            return None
        except TensorWriteError as e:
            return e.reason


class RecordingTensors:
    """The tensor store an actor's analyses use: reads through `ask` (the service's CacheReader), writes kept in
    `written` (id -> bytes) and returned with the result; the service checks and writes them."""

    def __init__(self, ask: Callable[..., Any]):
        self._ask = ask
        self.written: dict[str, bytes] = {}

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return self._ask(method, *args)
        except Exception as e:  # the reader is gone: nothing to read
            log.warning("tensor store call %s failed (%s)", method, type(e).__name__)
            return None

    def get(self, tid: str) -> bytes:
        if tid in self.written:
            return self.written[tid]
        data = self._call("tensor", tid) if is_id(tid) else None
        if not isinstance(data, bytes):
            raise missing(tid)
        return data

    def has(self, tid: str) -> bool:
        return tid in self.written or bool(self._call("has_tensor", tid))

    def put(self, tid: str, data: bytes) -> None:
        self.written[tid] = data

    def check_writable(self) -> None:
        try:
            why = self._ask("tensors_writable")
        except Exception as e:
            why = f"the service could not be asked ({type(e).__name__})"
        if why:
            raise TensorWriteError(why)


_PRIVATE = re.compile(r"headlens-worker-(\d+)-")


def private_folder() -> str:
    """A worker's own cache folder (its per-key lock files) in the temporary folder, removed when the process ends;
    the folders of this host's workers that died without cleaning up are removed first."""
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        names = []
    for name in names:
        m = _PRIVATE.match(name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    folder = tempfile.mkdtemp(prefix=f"headlens-worker-{os.getpid()}-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


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


def not_on_this_host(info: dict[str, Any], why: str) -> str:
    """The sentence of a worker host that cannot load a model the service's host has: headlens never pulls a model
    on a worker host; the models folder must be one every host shares (or a copy at the same path)."""
    where = f"{info.get('node_ip') or '?'} ({info.get('host') or '?'})"
    return (f"Ray host {where} cannot load the model: {why}. headlens does not pull or copy models onto worker "
            f"hosts: put HEADLENS_MODELS_DIR ({os.environ.get('HEADLENS_MODELS_DIR') or 'models/pulled/'}) and any "
            f"model folder on a folder every host shares, at the same path, or copy them there")


class ModelWorker:
    """The actor: holds one model (loaded on first use) and runs analyses on it, one job at a time.

    Methods besides `run` (poll, cancel, info) answer while a job runs (the actor has a few threads)."""

    def __init__(self, model: str | None, device: str, dtype: str | None, device_map: str | None, reader: Any):
        # per-key locks stay private to this worker: the service owns the cache, results and tensors
        os.environ["HEADLENS_CACHE_DIR"] = private_folder()
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
            from ..model.loading import ModelLoadError, load_model

            try:
                self._lm = load_model(self._model, device=self._device, dtype=self._dtype,
                                      device_map=self._device_map)
            except ModelLoadError as e:  # the service's host has the model (admission checked): this one has not
                raise ModelLoadError(not_on_this_host(self.info(), str(e))) from None
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

        def check() -> None:  # the service cancels the call (a DELETE, a preemption, its time limit): stop here
            if st[3]:
                raise Cancelled()

        def progress(fraction: float, message: str = "") -> None:
            check()
            st[0], st[1] = fraction, message or st[1]

        def live(data: dict[str, Any]) -> None:
            check()
            st[2] = data

        import ray

        reader = self._reader
        store = RecordingStore(lambda key: ray.get(reader.get.remote(key), timeout=60))
        tensors = RecordingTensors(lambda method, *args: ray.get(getattr(reader, method).remote(*args), timeout=60))
        try:
            with self._lock, checking(check):  # every loop of the analysis checks once per batch, step, token
                lm = self._model_obj() if spec.uses_model else None
                progress(0.0, "running")
                r = analyze(spec.name, lm, task, fields, cache=store if spec.cached else False,
                            progress=progress, live=live, tensors=tensors)
            return {"result": r.to_json(), "puts": list(store.puts.items()), "tensors": dict(tensors.written),
                    "model": None if lm is None else {"name": lm.name, "fingerprint": lm.fingerprint}}
        finally:
            self._state.pop(call, None)
