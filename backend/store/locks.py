"""Per-key locks in front of the result cache, across threads and processes.

A job holds the lock of its key while it computes. Another thread, runner or server process with the
same key waits, then finds the analysis' result in the disk cache instead of computing it again.
The process-wide layer is a `threading.Lock` per key; the cross-process layer is an `fcntl.flock` on
`<cache dir>/locks/<key hash>.lock` (released by the OS if the holder dies; skipped where fcntl is absent).

Lock files do not pile up: the holder unlinks its file before it unlocks. The usual flock/unlink race
(a waiter that opened the old file gets the lock on an inode no longer at the path, while a newcomer
creates a fresh file and locks that) is closed by the acquire loop: after `flock` succeeds it checks
that the path still names the inode it locked (`fstat` vs `stat`) and starts over when it does not. So
the only lock that counts is the one on the file currently at the path, and only its holder unlinks
it. Files left by processes that died holding a lock (kill -9) are pruned with the same protocol the
first time a process uses the folder (`prune()`: lock without blocking, check the inode, unlink).
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

_pruned: set[str] = set()  # folders this process has pruned once
_pruned_lock = threading.Lock()


def _same_file(fd: int, path: Path) -> bool:
    """True when `path` still names the file open as `fd`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (fst.st_ino, fst.st_dev)


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

    def path(self, key: str) -> Path:
        return self.directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.lock"

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
        path = self.path(key)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._prune_once()
        except OSError:  # an unwritable cache folder must not stop the job; threads are still serialized
            yield
            return
        fd, held = -1, False
        try:
            while True:  # until we hold the flock of the file that is at `path`
                try:
                    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                except OSError:
                    fd = -1
                    break  # unwritable: threads are still serialized
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if cancelled():
                            raise cancel_exc()
                        time.sleep(self._poll)
                if _same_file(fd, path):
                    held = True
                    break
                os.close(fd)  # the holder before us unlinked it: lock the current file instead
                fd = -1
            yield
        finally:
            if fd >= 0:
                if held:
                    try:
                        os.unlink(path)  # still ours: nobody else can hold the file at `path` now
                    except OSError:
                        pass
                os.close(fd)  # releases the flock

    def _prune_once(self) -> None:
        d = str(self.directory)
        with _pruned_lock:
            if d in _pruned:
                return
            _pruned.add(d)
        self.prune()

    def prune(self) -> int:
        """Delete lock files nobody holds (left by processes that died holding them); returns how many."""
        if fcntl is None:
            return 0
        removed = 0
        try:
            names = [p for p in self.directory.iterdir() if p.suffix == ".lock"]
        except OSError:
            return 0
        for p in names:
            try:
                fd = os.open(p, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held: its holder will unlink it
                os.close(fd)
                continue
            try:
                if _same_file(fd, p):
                    os.unlink(p)
                    removed += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        return removed
