"""Result cache on disk (diskcache), values stored as JSON bytes only, never pickles.

Keys hash the model fingerprint, the task content hash, every parameter and a code-version salt.
An entry that cannot be read or decoded is dropped and recomputed.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Callable

import diskcache

from .locks import KeyLocks
from .paths import cache_dir

CODE_VERSION = "tsla-1"  # bump when a change alters cached numbers
log = logging.getLogger(__name__)


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
            self._dc = diskcache.Cache(str(self.directory), size_limit=4 << 30)
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
            log.warning("cache entry %s unreadable (%s); recomputing", key, e)
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

    def get_or_compute(self, key: str, compute: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
        """(value, hit). On a miss, computes under the key's lock (threads and processes), so a key is
        never computed twice at once: a second caller waits, then reads the first one's result."""
        v = self.get(key)
        if v is not None:
            return v, True
        with _LOCKS.hold(key):
            v = self.get(key)
            if v is not None:
                return v, True
            v = compute()
            self.put(key, v)
        return v, False

    def close(self) -> None:
        if self._dc is not None:
            self._dc.close()
            self._dc = None


_LOCKS = KeyLocks()  # its folder follows HEADLENS_CACHE_DIR
_default: ResultCache | None = None


def default_cache() -> ResultCache:
    global _default
    if _default is None or _default.directory != cache_dir():
        _default = ResultCache()
    return _default
