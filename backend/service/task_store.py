"""Tasks the service can run: the built-ins by name, and uploaded files by `upload:<hash>`.

Uploads are validated with the task loaders and kept on disk under `<cache dir>/uploads/`, so an id
(and a link that holds it) survives a restart and is visible to every worker sharing the cache folder.
Server-side file paths are never accepted as tasks.

Bounds: at most `memory_items` parsed uploads stay in memory (least recently used go first; an evicted
one is parsed again from its record on disk when asked for), and the records on disk are kept under
`quota_bytes` (HEADLENS_UPLOAD_QUOTA_MB) by deleting the least recently used ones (a read touches the
record's mtime); a task whose record is gone is a 404 "upload the file again". Uploads that admitted jobs still
need (queued or running, or a running sweep's jobs not queued yet: `in_use`, wired by the app) are pinned: never
evicted from memory, never deleted for the quota. A record that cannot
be read back (truncated, wrong fields, content not matching its hash) is logged, deleted and answered
with a 422 "upload upload:<hash> is damaged; upload it again".
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NoReturn

from ..store.atomic_dirs import write_file
from ..store.safe_json import read_json
from .errors import BadRequest, NotFound, clip
from .schemas import TaskInfo

if TYPE_CHECKING:
    from ..tasks.base import Task

UPLOAD_PREFIX = "upload:"
MAX_FILENAME_BYTES = 255
MEMORY_BYTES = 64 << 20  # text of the parsed uploads kept in memory, at most (the newest one always stays)
_DIGEST = re.compile(r"[0-9a-f]{16}")
log = logging.getLogger(__name__)


def _uploads_dir() -> Path:
    from ..store.paths import cache_dir

    return cache_dir() / "uploads"


def task_info(task: "Task", task_id: str, source: str) -> TaskInfo:
    from ..tasks.registry import task_summary

    return TaskInfo(id=task_id, source=source, **task_summary(task))


def _digest(name: str, content: str, kind: str | None) -> str:
    return hashlib.sha256(json.dumps([name, content, kind]).encode()).hexdigest()[:16]


class TaskStore:
    """Built-in and uploaded tasks, by id."""

    def __init__(self, directory: str | Path | None = None, *, memory_items: int | None = None,
                 quota_bytes: int | None = None, memory_bytes: int = MEMORY_BYTES):
        if memory_items is None or quota_bytes is None:
            from .limits import Limits

            lim = Limits.from_env()
            memory_items = lim.upload_cache if memory_items is None else memory_items
            quota_bytes = lim.upload_quota_bytes if quota_bytes is None else quota_bytes
        self._directory = Path(directory) if directory else None
        self.memory_items = max(1, int(memory_items))
        self.quota_bytes = max(0, int(quota_bytes))
        self.memory_bytes = int(memory_bytes)
        self._uploads: OrderedDict[str, "Task"] = OrderedDict()
        self._sizes: dict[str, int] = {}
        self._lock = threading.Lock()
        self.in_use: Callable[[], set[str]] = set
        """Task ids admitted jobs still need (the app wires the runner's and the sweeps'): pinned."""

    @property
    def directory(self) -> Path:
        return self._directory or _uploads_dir()

    # -- lookup -----------------------------------------------------------------------------------
    def get(self, task_id: str) -> "Task":
        """The task `task_id` names; NotFound (404) with the known names otherwise."""
        if task_id.startswith(UPLOAD_PREFIX):
            return self._get_upload(task_id)
        from ..tasks.registry import builtin_names, load_task

        names = builtin_names()
        if task_id in names or task_id.replace("-", "_") in names or task_id.replace("_", "-") in names:
            return load_task(task_id)
        raise NotFound(f"unknown task {clip(task_id)!r}; built-in tasks: {', '.join(names)}. To run your own "
                       f"task, upload it with POST /tasks/upload and use the `upload:<hash>` id it returns.")

    def _pinned(self) -> set[str]:
        try:
            return set(self.in_use())
        except Exception:  # the runner shutting down: nothing pinned
            return set()

    def _remember(self, task_id: str, task: "Task", size: int) -> None:
        with self._lock:
            self._uploads[task_id] = task
            self._uploads.move_to_end(task_id)
            self._sizes[task_id] = size
            def over() -> bool:
                return len(self._uploads) > self.memory_items or sum(self._sizes.values()) > self.memory_bytes

            if len(self._uploads) <= 1 or not over():
                return
            pinned = self._pinned() | {task_id}
            for old in [t for t in self._uploads if t not in pinned]:  # least recently used first
                if not over():
                    break
                del self._uploads[old]
                self._sizes.pop(old, None)

    def _get_upload(self, task_id: str) -> "Task":
        with self._lock:
            if task_id in self._uploads:
                self._uploads.move_to_end(task_id)
                task = self._uploads[task_id]
            else:
                task = None
        digest = task_id[len(UPLOAD_PREFIX):]
        if not _DIGEST.fullmatch(digest):
            raise NotFound(f"no uploaded task {clip(task_id)!r} on this server (upload ids look like "
                           f"upload:<16 hex digits>); upload the file again")
        meta = self.directory / f"{digest}.json"
        if task is not None:
            _touch(meta)
            return task
        if not meta.is_symlink() and not meta.exists():
            raise NotFound(f"no uploaded task {task_id!r} on this server (uploads are removed when the upload "
                           f"folder is over its quota, HEADLENS_UPLOAD_QUOTA_MB); upload the file again")
        record = read_json(meta, max_bytes=4 * (self.quota_bytes or 1 << 26) + (1 << 16), max_depth=3)
        try:  # read as untrusted (a regular file, bounded size and depth), then every field checked
            if not isinstance(record, dict):
                raise ValueError("not a readable JSON object")
            name, content, kind = record["filename"], record["content"], record.get("kind")
            if not isinstance(name, str) or not isinstance(content, str) or not isinstance(kind, (str, type(None))):
                raise ValueError("fields of the wrong type")
            if _digest(name, content, kind) != digest:
                raise ValueError("its content does not match its hash")
        except (ValueError, KeyError, TypeError) as e:
            self._damaged(task_id, meta, f"{type(e).__name__}: {str(e)[:200]}")
        task = self._parse(name, content, kind)
        _touch(meta)
        self._remember(task_id, task, len(content))
        return task

    @staticmethod
    def _damaged(task_id: str, meta: Path, why: str) -> NoReturn:
        log.warning("uploaded task record %s is damaged (%s); deleting it", meta, why)
        try:
            meta.unlink()
        except OSError:
            pass
        raise BadRequest(f"upload {task_id} is damaged; upload it again")

    def list(self) -> list[TaskInfo]:
        """Built-ins first, then the uploads this process holds in memory."""
        from ..tasks.registry import builtin_tasks

        out = [task_info(t, name, "builtin") for name, t in builtin_tasks().items()]
        with self._lock:
            uploads = list(self._uploads.items())
        return out + [task_info(t, tid, "upload") for tid, t in uploads]

    # -- uploads ------------------------------------------------------------------------------------
    @staticmethod
    def _parse(filename: str, content: str, kind: str | None) -> "Task":
        from ..tasks.base import TaskError
        from ..tasks.files import parse_task_text

        try:
            return parse_task_text(content, Path(filename).name, kind=kind)  # type: ignore[arg-type]
        except TaskError as e:
            raise BadRequest(clip(str(e), 1000)) from None
        except RecursionError:  # parse_task_text checks nesting first; a last guard
            raise BadRequest(f"{clip(Path(filename).name)}: nested too deeply") from None

    def add(self, filename: str, data: bytes, kind: str | None = None) -> tuple[str, "Task"]:
        """Validate an uploaded task file and store it; returns (`upload:<hash>`, task). Malformed -> 422."""
        if not isinstance(filename, str):
            raise BadRequest("the upload's filename must be text")
        if kind is not None and not isinstance(kind, str):
            raise BadRequest("the upload's kind must be 'classification' or 'generation'")
        name = Path(filename or "").name
        if not name:
            raise BadRequest("the upload needs a filename (its extension picks the format: "
                             ".json, .jsonl, .ndjson, .csv or .tsv)")
        if len(name.encode("utf-8", "surrogatepass")) > MAX_FILENAME_BYTES:
            raise BadRequest(f"the upload's filename is too long ({len(name)} characters; at most "
                             f"{MAX_FILENAME_BYTES} bytes): {clip(name)!r}")
        try:
            content = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise BadRequest(f"{name}: not UTF-8 text (bad byte at offset {e.start})") from None
        task = self._parse(name, content, kind)
        digest = _digest(name, content, kind)
        task_id = UPLOAD_PREFIX + digest
        record = {"filename": name, "content": content, "kind": kind}
        path = self.directory / f"{digest}.json"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_file(path, json.dumps(record))  # whole or not at all: a failed write leaves no temporary file
        except OSError as e:  # WriteError included
            log.warning("could not keep upload %s on disk (%s); it lives in memory only", task_id, e)
        self._remember(task_id, task, len(content))
        self._enforce_quota(keep=path)
        return task_id, task

    def _enforce_quota(self, keep: Path | None = None) -> None:
        """Delete the least recently used records (by mtime) until the folder is under `quota_bytes`."""
        try:
            entries = []
            for p in self.directory.iterdir():
                if p.suffix != ".json" and ".json.tmp" not in p.name:
                    continue
                try:
                    st = p.stat()
                except OSError:
                    continue
                entries.append((st.st_mtime, st.st_size, p))
        except OSError:
            return
        total = sum(size for _, size, _ in entries)
        if total <= self.quota_bytes:
            return
        pinned = {t[len(UPLOAD_PREFIX):] for t in self._pinned() if t and t.startswith(UPLOAD_PREFIX)}
        for _, size, p in sorted(entries, key=lambda e: e[0]):
            if total <= self.quota_bytes:
                break
            if p == keep or ".json.tmp" in p.name or p.stem in pinned:  # the newest, writes in flight, in use
                continue
            try:
                p.unlink()
                total -= size
                log.info("upload folder over its quota: removed %s", p.name)
            except FileNotFoundError:
                total -= size
            except OSError:
                pass


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass
