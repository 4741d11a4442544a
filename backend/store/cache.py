"""Result cache on disk (diskcache), values stored as JSON bytes only, never pickles.

Keys hash the model fingerprint, the task content hash, every parameter and a code-version salt.
An entry that cannot be read or decoded is dropped and recomputed.

No code from the cache: diskcache's stock `Disk` unpickles rows (and value files) stored in its pickle
mode, so anyone able to write `cache.db` could run code in the service. `ResultCache` reads and writes
through `SafeDisk`, which stores every value as a raw row (MODE_RAW: bytes, str or a number in the
database, never a file), and refuses to turn any other row into a value: a pickle row or file, a
text/binary value file, a pickled key. Such a row is a corrupt entry: logged, deleted, recomputed.
`SafeDisk.remove` only deletes files inside the cache folder (a tampered `filename` column cannot make
the cache delete files elsewhere), and unknown rows of diskcache's Settings table (which it turns into
`PRAGMA` statements and `Disk` arguments) are dropped before the cache opens.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

import diskcache
from diskcache.core import DEFAULT_SETTINGS, METADATA, MODE_RAW, UNKNOWN

from .paths import cache_dir

CODE_VERSION = "kernel-3"  # bump when a change alters cached numbers (kernel-2: vectors from the demonstration pool;
# kernel-3: notes apart from warnings, one multi-token-label warning on every kind, what a result looked up and missed)
SIZE_LIMIT = 4 << 30
log = logging.getLogger(__name__)


class UnsafeEntry(ValueError):
    """A cache row SafeDisk refuses to read (not a raw value): treated as a corrupt entry."""


_KEY_TYPES = (str, bytes, int, float)


class SafeDisk(diskcache.Disk):
    """A diskcache `Disk` that never pickles or unpickles: raw rows in, raw rows out.

    Values: bytes, str, int and float are stored in the database row (MODE_RAW, whatever their size);
    any other value is refused (TypeError) rather than pickled. Reading a row in any other mode
    (MODE_PICKLE, MODE_BINARY, MODE_TEXT: rows that live in files or need unpickling) raises UnsafeEntry
    without opening the file. Keys: str, bytes and numbers only; a pickled key (raw=0) raises UnsafeEntry.
    """

    def __init__(self, directory: str, **_settings: Any):  # disk_* settings ignored: nothing goes to files
        super().__init__(directory, min_file_size=1 << 62, pickle_protocol=0)

    def put(self, key: Any) -> tuple[Any, bool]:
        if type(key) not in _KEY_TYPES:
            raise TypeError(f"cache keys must be str, bytes or numbers, not {type(key).__name__}")
        return super().put(key)

    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            raise UnsafeEntry("a pickled key (refused)")
        return super().get(key, raw)

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple[int, int, str | None, Any]:
        if read or type(value) not in _KEY_TYPES:
            raise TypeError(f"the result cache stores bytes (JSON), not {type(value).__name__}")
        if type(value) is int and not -(1 << 63) <= value < (1 << 63):
            raise TypeError("integer out of SQLite's range")
        return 0, MODE_RAW, None, sqlite3.Binary(value) if type(value) is bytes else value

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode != MODE_RAW or filename is not None:
            raise UnsafeEntry(f"a row in storage mode {mode!r}{' with a value file' if filename else ''} "
                              f"(only raw rows are read; never unpickled)")
        if read:
            raise UnsafeEntry("file-handle reads are not supported")
        return bytes(value) if type(value) is sqlite3.Binary else value

    def remove(self, file_path: str) -> None:
        """Delete a value file, but only one inside the cache folder."""
        root = os.path.realpath(self._directory)
        full = os.path.realpath(os.path.join(root, file_path))
        if os.path.commonpath([root, full]) != root or full == root:
            log.warning("cache row names a file outside the cache folder (%r); not deleting it", file_path[:200])
            return
        super().remove(os.path.relpath(full, root))


def _clean_settings(directory: Path) -> None:
    """Drop Settings rows diskcache does not define (it would run them as PRAGMAs / Disk arguments)."""
    db = directory / "cache.db"
    if not db.is_file():
        return
    known = set(DEFAULT_SETTINGS) | set(METADATA)
    try:
        con = sqlite3.connect(str(db), timeout=60, isolation_level=None)
        try:
            rows = con.execute("SELECT key FROM Settings").fetchall()
            bad = [k for (k,) in rows if k not in known]
            if bad:
                log.warning("cache %s: dropping unknown settings %s", db, [str(k)[:60] for k in bad[:5]])
                con.executemany("DELETE FROM Settings WHERE key = ?", [(k,) for k in bad])
        finally:
            con.close()
    except sqlite3.Error:
        pass  # no Settings table yet, or a locked / damaged file: diskcache reports that itself


def make_key(namespace: str, **parts: Any) -> str:
    """Stable key: sha256 of the canonical JSON of (kind, parts, code version)."""
    blob = json.dumps({"namespace": namespace, "v": CODE_VERSION, **parts}, sort_keys=True, default=str)
    return f"{namespace}:{hashlib.sha256(blob.encode()).hexdigest()}"


class ResultCache:
    """A JSON-valued cache: `get` returns a dict or None, `put` stores a JSON-able dict."""

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory) if directory else cache_dir()
        self._dc: diskcache.Cache | None = None

    @property
    def dc(self) -> diskcache.Cache:
        if self._dc is None:
            _clean_settings(self.directory)
            # every setting given explicitly, so values stored in the Settings table are not used
            settings = {k: v for k, v in DEFAULT_SETTINGS.items() if not k.startswith("disk_")}
            self._dc = diskcache.Cache(str(self.directory), disk=SafeDisk, **{**settings, "size_limit": SIZE_LIMIT})
        return self._dc

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            raw = self.dc.get(key)
            if raw is None:
                return None
            if not isinstance(raw, bytes):
                raise TypeError(f"entry holds {type(raw).__name__}, not JSON bytes")
            value = json.loads(raw.decode("utf-8"))
            if not isinstance(value, dict):
                raise TypeError("entry is not a JSON object")
            return value
        except Exception as e:  # corrupt entry or unreadable store: recompute, never fail
            log.warning("cache entry %s unreadable (%s: %s); recomputing", key, type(e).__name__, str(e)[:200])
            try:
                self.dc.delete(key)
            except Exception:
                pass
            return None

    def put(self, key: str, value: dict[str, Any]) -> None:
        try:
            self.dc.set(key, json.dumps(value, allow_nan=True).encode("utf-8"))
        except Exception as e:
            log.warning("could not write cache entry %s: %s", key, e)

    def close(self) -> None:
        if self._dc is not None:
            self._dc.close()
            self._dc = None


_default: ResultCache | None = None


def default_cache() -> ResultCache:
    global _default
    if _default is None or _default.directory != cache_dir():
        _default = ResultCache()
    return _default
