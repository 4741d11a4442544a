"""Built-in tasks (the data files under `data/` plus the embedded model's synthetic tasks) and lookup by name or path."""
from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from pathlib import Path
from typing import Any

from ..store.paths import DEFAULT_MODEL_NAMES
from .base import Kind, Task, TaskError
from .files import load_task_file

DATA_DIR = Path(__file__).resolve().parent / "data"
_SYNTHETIC_MODULE = "backend.tasks.synthetic"


@functools.lru_cache(maxsize=1)
def _file_tasks() -> tuple[Task, ...]:
    return tuple(load_task_file(p) for p in sorted(DATA_DIR.glob("*.json")))


@functools.lru_cache(maxsize=1)
def _synthetic_tasks() -> tuple[Task, ...]:
    try:
        synthetic = importlib.import_module(_SYNTHETIC_MODULE)
    except ModuleNotFoundError as e:
        if e.name == _SYNTHETIC_MODULE:  # not written yet; any other missing module is a real error
            return ()
        raise
    found = synthetic.synthetic_tasks()
    return tuple(found.values() if isinstance(found, dict) else found)


@functools.lru_cache(maxsize=1)
def _builtin() -> dict[str, Task]:
    out: dict[str, Task] = {}
    for t in (*_file_tasks(), *_synthetic_tasks()):
        if t.name in out:
            raise TaskError(f"two built-in tasks are named {t.name!r}")
        out[t.name] = t
    return out


def _copy(task: Task) -> Task:
    # Task is mutable: hand out copies so no caller can alter the cached built-ins.
    return dataclasses.replace(task, examples=list(task.examples))


def builtin_tasks() -> dict[str, Task]:
    """All built-in tasks by name (parsed once per process; each call returns fresh copies)."""
    return {name: _copy(t) for name, t in _builtin().items()}


def builtin_names() -> list[str]:
    """Names of the built-in tasks, in listing order."""
    return list(_builtin())


def clear_cache() -> None:
    """Forget the parsed built-ins (after the data files or the synthetic module change)."""
    for f in (_file_tasks, _synthetic_tasks, _builtin):
        f.cache_clear()


def model_tasks(model_name: str) -> list[Task]:
    """The built-in tasks meant for model `model_name` that are made of examples (no prompt builders, no fixed
    prompt sets): the tasks a vector or a head selection can be learned for, one per task."""
    want = "default" if model_name in DEFAULT_MODEL_NAMES else "any"
    return [t for t in builtin_tasks().values() if t.models == want and t.builder is None and t.fixed is None]


def builtin_by_names(names: list[str], what: str) -> list[Task]:
    """The built-in tasks `names` (in order, once each; `_` may stand for `-`), or a TaskError naming the unknown
    ones and listing the known, for analysis `what`."""
    known = builtin_tasks()
    missing = [n for n in names if n not in known and n.replace("_", "-") not in known]
    if missing:
        raise TaskError(f"unknown built-in task(s) {missing[:5]}; {what} takes built-in task names: "
                        f"{', '.join(known)}")
    return [known.get(n) or known[n.replace("_", "-")] for n in dict.fromkeys(names)]


def load_task(name_or_path: str | os.PathLike, kind: Kind | None = None) -> Task:
    """A built-in task by name (`-`/`_` interchangeable), or a task file by path; `kind` overrides the kind."""
    tasks = _builtin()
    key = os.fspath(name_or_path)
    found = next((tasks[k] for k in (key, key.replace("_", "-"), key.replace("-", "_"))
                  if not isinstance(name_or_path, Path) and k in tasks), None)
    if found is not None:
        task = _copy(found)
        if kind is not None and kind != task.kind:
            if task.builder is not None:
                raise TaskError(f"task {task.name!r} builds its own prompts; its kind ({task.kind}) cannot be changed")
            task = dataclasses.replace(task, kind=kind, labels=None)
        return task
    if Path(key).is_file():
        return load_task_file(key, kind=kind)
    raise TaskError(f"no built-in task named {key!r} and no file at that path; built-in tasks: "
                    f"{', '.join(tasks)}. A task file path must point to an existing file.")


def task_summary(task: Task) -> dict[str, Any]:
    """What `python -m backend tasks --json` lists for a task: name, kind, n_examples, n_queries (the held-out
    queries a seed scores; the split is about 1:1 whatever the seed), labels, models, description."""
    try:
        n_queries: int | None = task.n_queries(0)
    except TaskError:  # too few examples to split: every analysis says so
        n_queries = None
    return {"name": task.name, "kind": task.kind, "n_examples": len(task.examples), "n_queries": n_queries,
            "labels": list(task.labels) if task.labels is not None else None,
            "models": task.models, "description": task.description}
