"""Per-key locks in front of the result cache, across threads and processes.

A job holds the lock of its key while it computes. Another thread, runner or server process with the
same key waits, then finds the analysis' result in the disk cache instead of computing it again.
The process-wide layer is a `threading.Lock` per key; the cross-process layer is an `fcntl.flock` on
`<cache dir>/locks/<key hash>.lock` (released by the OS if the holder dies; skipped where fcntl is absent).
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from .paths import cache_dir

try:
    import fcntl
except ImportError:  # Windows: the threading layer alone
    fcntl = None  # type: ignore[assignment]


class KeyLocks:
    """`with locks.hold(key, cancelled):` — exclusive per key; waiting stops early when `cancelled()`."""

    def __init__(self, directory: str | Path | None = None, poll: float = 0.05):
        self._directory = Path(directory) if directory else None
        self._poll = poll
        self._mutex = threading.Lock()
        self._locks: dict[str, list] = {}  # key -> [Lock, users]

    @property
    def directory(self) -> Path:
        if self._directory is not None:
            return self._directory
        return cache_dir() / "locks"

    @contextmanager
    def hold(self, key: str, cancelled: Callable[[], bool] = lambda: False,
             cancel_exc: type[Exception] = TimeoutError) -> Iterator[None]:
        """Hold `key`'s lock; raises `cancel_exc` when `cancelled()` turns true while waiting."""

        with self._mutex:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        lock: threading.Lock = entry[0]
        try:
            while not lock.acquire(timeout=self._poll):
                if cancelled():
                    raise cancel_exc()
            try:
                with self._file_lock(key, cancelled, cancel_exc):
                    yield
            finally:
                lock.release()
        finally:
            with self._mutex:
                entry[1] -= 1
                if entry[1] == 0:
                    self._locks.pop(key, None)

    @contextmanager
    def _file_lock(self, key: str, cancelled: Callable[[], bool], cancel_exc: type[Exception]) -> Iterator[None]:
        if fcntl is None:
            yield
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.lock",
                         os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # an unwritable cache folder must not stop the job; threads are still serialized
            yield
            return
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if cancelled():
                        raise cancel_exc()
                    time.sleep(self._poll)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
