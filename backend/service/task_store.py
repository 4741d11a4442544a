"""Tasks the service can run: the built-ins by name, and uploaded files by `upload:<hash>`.

Uploads are validated with the task loaders and kept on disk under `<cache dir>/uploads/`, so an id
(and a link that holds it) survives a restart and is visible to every worker sharing the cache folder.
Server-side file paths are never accepted as tasks.
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import BadRequest, NotFound
from .schemas import TaskInfo

if TYPE_CHECKING:
    from ..tasks.base import Task

UPLOAD_PREFIX = "upload:"


def _uploads_dir() -> Path:
    from ..paths import cache_dir

    return cache_dir() / "uploads"


def task_info(task: "Task", task_id: str, source: str) -> TaskInfo:
    from ..tasks.registry import task_summary

    return TaskInfo(id=task_id, source=source, **task_summary(task))


class TaskStore:
    """Built-in and uploaded tasks, by id."""

    def __init__(self, directory: str | Path | None = None):
        self._directory = Path(directory) if directory else None
        self._uploads: dict[str, "Task"] = {}
        self._lock = threading.Lock()

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
        raise NotFound(f"unknown task {task_id!r}; built-in tasks: {', '.join(names)}. To run your own task, "
                       f"upload it with POST /tasks/upload and use the `upload:<hash>` id it returns.")

    def _get_upload(self, task_id: str) -> "Task":
        with self._lock:
            if task_id in self._uploads:
                return self._uploads[task_id]
        digest = task_id[len(UPLOAD_PREFIX):]
        meta = self.directory / f"{digest}.json"
        if not digest.isalnum() or not meta.is_file():
            raise NotFound(f"no uploaded task {task_id!r} on this server; upload the file again")
        record = json.loads(meta.read_text("utf-8"))
        task = self._parse(record["filename"], record["content"], record.get("kind"))
        with self._lock:
            self._uploads[task_id] = task
        return task

    def list(self) -> list[TaskInfo]:
        """Built-ins first, then the uploads this process has seen."""
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
            raise BadRequest(str(e)) from None

    def add(self, filename: str, data: bytes, kind: str | None = None) -> tuple[str, "Task"]:
        """Validate an uploaded task file and store it; returns (`upload:<hash>`, task). Malformed -> 422."""
        name = Path(filename or "").name
        if not name:
            raise BadRequest("the upload needs a filename (its extension picks the format: "
                             ".json, .jsonl, .ndjson, .csv or .tsv)")
        try:
            content = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise BadRequest(f"{name}: not UTF-8 text (bad byte at offset {e.start})") from None
        task = self._parse(name, content, kind)
        digest = hashlib.sha256(json.dumps([name, content, kind]).encode()).hexdigest()[:16]
        task_id = UPLOAD_PREFIX + digest
        record = {"filename": name, "content": content, "kind": kind}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.directory / f"{digest}.json.tmp{threading.get_ident()}"
            tmp.write_text(json.dumps(record), "utf-8")
            tmp.replace(self.directory / f"{digest}.json")
        except OSError:
            pass  # kept in memory for this process; a restart forgets it
        with self._lock:
            self._uploads[task_id] = task
        return task_id, task
