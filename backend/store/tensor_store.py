"""Trained tensors by id: the content-addressed folder `<cache dir>/tensors/` (standard library only, no torch).

A saved vector or alpha file (`ltv_vector`, `site_alphas`; the format: `analysis/primitives/saved.py`) is named by an id the
service issues: `<kind>-<the first 32 hex digits of the sha256 of the file's bytes>`, stored as `<id>.safetensors`.
Nothing else names a file here: over HTTP a path is never accepted, and an id's pattern leaves no room for a folder
or `..`. The CLI and the Python API take a local file by copying it in (`saved.register_file`), so there is one way
to read a tensor.

Reading (`get`, `has`): the file is opened inside the folder's real path, without following a symlink
(O_NOFOLLOW), only when it is a regular file, and its bytes are checked against the id. Every refusal (no such id, a
symlink, a folder or a FIFO, bytes that no longer match the id) is the same sentence, whatever the reason (the
reason goes to the log), so an answer never tells which files exist. A file whose bytes no longer match its id is
removed (it can never be right again).

Writing (`put`): to a temporary name in the same folder, flushed, then renamed, so a reader sees the whole file or
none; `check_writable` tries exactly that before a training starts. A failure is a `TensorWriteError` naming the
reason (no space, read-only, not a folder), never an absolute path.

Uploads (`POST /tensors`) count against `quota_bytes` (HEADLENS_TENSOR_QUOTA_MB): the least recently used upload is
removed first, never one that is pinned (`pin`: a queued or running job, or a sweep, refers to it) and never the
newest. Trained tensors are bounded by the work that made them and are not evicted.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .atomic_dirs import WriteError, write_file
from ..errors import BadInput
from .paths import cache_dir
from ..text import clip

KINDS = ("ltv", "site")
ID = re.compile(r"(ltv|site)-[0-9a-f]{32}")
SUFFIX = ".safetensors"
UPLOAD_MARK = ".upload"  # an empty file `<id>.upload` beside an uploaded tensor: it counts against the quota
MAX_READ_BYTES = 1 << 30  # a stored file larger than this is not read (a guard; uploads are far smaller)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted under an id's name must not block the open
log = logging.getLogger(__name__)


class TensorMissing(BadInput):
    """No usable tensor under this id (the message is the same whatever the reason)."""


class TensorWriteError(WriteError):
    """A tensor that could not be written: `reason` in words (no space, read-only, not a folder), without a path."""


def tensor_id(kind: str, data: bytes) -> str:
    """The id of a tensor file: `<kind>-<first 32 hex digits of sha256(data)>`."""
    if kind not in KINDS:
        raise BadInput(f"tensor kind must be one of {', '.join(KINDS)}, not {clip(kind, 40)!r}")
    return f"{kind}-{hashlib.sha256(data).hexdigest()[:32]}"


def is_id(value: object) -> bool:
    return isinstance(value, str) and ID.fullmatch(value) is not None


def tensor_refs(value: Any) -> list[str]:
    """The tensor ids a result refers to: the values of its `tensor` and `tensors` fields, at any depth (not those
    of `unsaved_tensors`, which come inline)."""
    out: list[str] = []
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "tensor" and is_id(x):
                    out.append(x)
                elif k == "tensors" and isinstance(x, (dict, list)):
                    out.extend(t for t in (x.values() if isinstance(x, dict) else x) if is_id(t))
                elif isinstance(x, (dict, list)) and k != "unsaved_tensors":
                    todo.append(x)
        elif isinstance(v, list):
            todo.extend(x for x in v if isinstance(x, (dict, list)))
    return list(dict.fromkeys(out))


def missing(tid: object) -> TensorMissing:
    """The one refusal for an id that names no usable file."""
    shown = tid if is_id(tid) else clip(str(tid), 60)
    return TensorMissing(f"no tensor {shown!r} on this server: train it (ltv_vector, site_alphas) or upload its file with "
                         f"POST /tensors, and use the id that returns")


def _reason(e: OSError) -> str:
    """An OSError in words, without its file name (which would be an absolute server path)."""
    if isinstance(e, WriteError):
        return e.reason
    if isinstance(e, (FileExistsError, NotADirectoryError)):
        return "the cache folder's `tensors` is not a folder"
    return e.strerror or type(e).__name__


class TensorStore:
    """The tensors folder (default: `<cache dir>/tensors`, read when used, so it follows HEADLENS_CACHE_DIR)."""

    def __init__(self, directory: str | Path | None = None, quota_bytes: int | None = None):
        self._directory = Path(directory) if directory else None
        self.quota_bytes = quota_bytes  # uploads kept on disk at most; None: no quota
        self._pins: dict[str, list[Callable[[], bool]]] = {}
        self._until: dict[str, float] = {}  # time-limited pins (admission), by id
        self._writable_at = -1e9  # when check_writable last succeeded (time.monotonic)
        self._lock = threading.Lock()

    @property
    def directory(self) -> Path:
        return self._directory or cache_dir() / "tensors"

    def _file(self, tid: str) -> str:
        return os.path.join(os.path.realpath(self.directory), tid + SUFFIX)

    def path(self, tid: str) -> Path:
        """The file of a stored, intact tensor (for local use: the CLI, notebooks); TensorMissing otherwise."""
        self.get(tid)
        return Path(self._file(tid))

    # -- reading ---------------------------------------------------------------------------------------------
    def get(self, tid: str) -> bytes:
        """The bytes of tensor `tid`, checked against the id; TensorMissing (one sentence) otherwise."""
        if not is_id(tid):
            raise missing(tid)
        full = self._file(tid)
        try:
            fd = os.open(full, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            if not isinstance(e, FileNotFoundError):
                log.warning("tensor %s: not opened (%s)", tid, _reason(e))
            raise missing(tid) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_READ_BYTES:
                log.warning("tensor %s: not a regular file of a readable size; refused", tid)
                raise missing(tid)
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(MAX_READ_BYTES + 1)
        except OSError as e:
            log.warning("tensor %s: unreadable (%s)", tid, _reason(e))
            raise missing(tid) from None
        finally:
            os.close(fd)
        if tensor_id(tid.partition("-")[0], data) != tid:
            log.warning("tensor %s: its bytes no longer match its id (changed or truncated); removing it", tid)
            self._remove(tid)
            raise missing(tid)
        _touch(full)
        return data

    def has(self, tid: str) -> bool:
        """Whether tensor `tid` is stored and intact."""
        try:
            self.get(tid)
            return True
        except TensorMissing:
            return False

    # -- writing ---------------------------------------------------------------------------------------------
    def check_writable(self, max_age: float = 0.0) -> None:
        """Create, flush and remove a small file in the folder, as `put` will; TensorWriteError if that fails.
        `max_age`: a success less than this many seconds ago stands (a sweep admits many jobs at once)."""
        if time.monotonic() - self._writable_at < max_age:
            return
        try:
            base = self._folder()
            tmp = os.path.join(base, f".probe-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
            try:
                os.write(fd, b"\0" * 4096)
                os.fsync(fd)
            finally:
                os.close(fd)
                _unlink(tmp)
        except OSError as e:
            raise TensorWriteError(_reason(e)) from None
        self._writable_at = time.monotonic()

    def put(self, tid: str, data: bytes, *, upload: bool = False) -> None:
        """Store `data` as tensor `tid` (which must be its id): temporary name, flush, rename. `upload`: it counts
        against the quota (a trained write of the same bytes takes it off)."""
        if not is_id(tid) or tensor_id(tid.partition("-")[0], data) != tid:
            raise BadInput(f"tensor id {clip(tid, 60)!r} does not match its bytes")
        try:
            base = self._folder()
            final = os.path.join(base, tid + SUFFIX)
            mark = os.path.join(base, tid + UPLOAD_MARK)
            present = self.has(tid)
            trained = present and not os.path.exists(mark)  # already here, and not as an upload
            if not present:
                write_file(final, data, mode=0o644)  # temporary name, flush, rename; nothing left on a failure
            _touch(final)
            if upload and not trained:
                Path(mark).touch()
            elif not upload:
                _unlink(mark)
        except OSError as e:
            raise TensorWriteError(_reason(e)) from None
        if upload:
            self._enforce_quota(keep=tid)

    def _folder(self) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        base = os.path.realpath(self.directory)
        if not os.path.isdir(base):
            raise NotADirectoryError(base)
        return base

    def _remove(self, tid: str) -> None:
        base = os.path.realpath(self.directory)
        for suffix in (SUFFIX, UPLOAD_MARK):
            _unlink(os.path.join(base, tid + suffix))

    # -- the uploads' quota ---------------------------------------------------------------------------------
    def pin(self, tid: str, alive: Callable[[], bool]) -> None:
        """Keep upload `tid` while `alive()` is true (a job or sweep that refers to it)."""
        with self._lock:
            self._pins.setdefault(tid, []).append(alive)

    def pin_for(self, tid: str, seconds: float) -> None:
        """Keep upload `tid` for `seconds` from now (at least)."""
        with self._lock:
            self._until[tid] = max(self._until.get(tid, 0.0), time.monotonic() + seconds)

    def pinned(self, tid: str) -> bool:
        with self._lock:
            if self._until.get(tid, 0.0) > time.monotonic():
                return True
            self._until.pop(tid, None)
            alive = [f for f in self._pins.get(tid, []) if _alive(f)]
            if alive:
                self._pins[tid] = alive
            else:
                self._pins.pop(tid, None)
            return bool(alive)

    def _enforce_quota(self, keep: str) -> None:
        if self.quota_bytes is None:
            return
        base = os.path.realpath(self.directory)
        entries = []
        try:
            names = os.listdir(base)
        except OSError:
            return
        for name in names:
            if not name.endswith(UPLOAD_MARK) or not is_id(name[: -len(UPLOAD_MARK)]):
                continue
            tid = name[: -len(UPLOAD_MARK)]
            try:
                st = os.stat(os.path.join(base, tid + SUFFIX), follow_symlinks=False)
            except OSError:
                _unlink(os.path.join(base, name))
                continue
            entries.append((st.st_mtime, st.st_size, tid))
        total = sum(size for _, size, _ in entries)
        for _, size, tid in sorted(entries):
            if total <= self.quota_bytes:
                break
            if tid == keep or self.pinned(tid):
                continue
            self._remove(tid)
            total -= size
            log.info("tensor uploads over their quota: removed %s", tid)


def _alive(f: Callable[[], bool]) -> bool:
    try:
        return bool(f())
    except Exception:
        return False


def _touch(path: str) -> None:
    """Mark a file used now, to the nanosecond (the uploads' quota removes the least recently used first; the
    clock the filesystem stamps by itself is coarser than a few reads in a row)."""
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now), follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def tensor_path(tid: str) -> Path:
    """The local file of stored tensor `tid` (the Python API: open it in a notebook); TensorMissing otherwise."""
    return default_store().path(tid)


_stores: dict[str, TensorStore] = {}
_stores_lock = threading.Lock()


def default_store() -> TensorStore:
    """The store of the current cache folder (one per folder, so the service's pins and the kernel's reads share
    it)."""
    key = str(cache_dir())
    with _stores_lock:
        if key not in _stores:
            _stores[key] = TensorStore(Path(key) / "tensors")
        return _stores[key]


class TensorSession:
    """One analysis call tree's view of a store (the kernel makes one per `analyze` and hands it down through
    `ctx.call`). A write that fails is kept here (`unsaved`: id -> (bytes, reason)), so the kernel returns those
    tensors inline with a warning and does not cache the result: a finished training is never lost."""

    def __init__(self, store: "TensorStore | None" = None):
        self.store = store if store is not None else default_store()
        self.unsaved: dict[str, tuple[bytes, str]] = {}
        self.failures: list[str] = []  # the id of every failed write, in order (a repeat too)

    def get(self, tid: str) -> bytes:
        if tid in self.unsaved:
            return self.unsaved[tid][0]
        return self.store.get(tid)

    def has(self, tid: str) -> bool:
        return tid in self.unsaved or self.store.has(tid)

    def put(self, tid: str, data: bytes) -> None:
        try:
            self.store.put(tid, data)
        except TensorWriteError as e:
            log.warning("could not save tensor %s (%s)", tid, e.reason)
            self.unsaved[tid] = (data, e.reason)
            self.failures.append(tid)

    def check_writable(self) -> None:
        self.store.check_writable()
