"""Folders that appear whole or not at all: written under a temporary name beside the target, then renamed.

`with staging(target) as tmp:` yields an empty folder `<parent>/.tmp-<target name>-<pid>-<random>`; when the
block ends normally, `tmp` is renamed to `target` (one rename on one file system: readers see either nothing or
the finished folder); when it raises (an error, Ctrl-C), `tmp` is deleted. A process killed with SIGKILL leaves
its temporary folder behind: `clean_stale(parent)` deletes those whose process is gone, and every `staging` call
runs it first.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

PREFIX = ".tmp-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _owner(name: str) -> tuple[str, int] | None:
    """(host, pid) encoded in a temporary folder's name, or None when it is not one of ours."""
    parts = name[len(PREFIX):].rsplit("-", 3) if name.startswith(PREFIX) else []
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


def _host() -> str:
    return socket.gethostname().replace("-", "_")[:40] or "host"


def clean_stale(parent: Path) -> list[Path]:
    """Delete the temporary folders under `parent` left by processes of this host that no longer run."""
    removed: list[Path] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    host = _host()
    for p in entries:
        owner = _owner(p.name)
        if owner is None or owner[0] != host or _alive(owner[1]):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


@contextmanager
def staging(target: Path, replace: bool = False) -> Iterator[Path]:
    """A temporary folder that becomes `target` when the block succeeds (see the module docstring).

    If `target` exists by then: with `replace`, it is replaced (`replace_dir`); without, the temporary folder is
    dropped and the existing `target` kept (another process finished the same work)."""
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    clean_stale(parent)
    tmp = parent / f"{PREFIX}{target.name}-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
        if replace:
            replace_dir(tmp, target)
        else:
            try:
                os.rename(tmp, target)
            except OSError:
                if not target.exists():
                    raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def replace_dir(src: Path, target: Path) -> None:
    """Put the finished folder `src` at `target`, replacing an older one there (moved aside first, then deleted)."""
    if target.exists():
        old = target.parent / f"{PREFIX}{target.name}-{_host()}-{os.getpid()}-old{secrets.token_hex(2)}"
        os.rename(target, old)
        os.rename(src, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(src, target)


def discard(path: Path) -> bool:
    """Delete a folder so that it vanishes at once: renamed aside (one rename), then deleted. Whether it existed."""
    if not path.exists():
        return False
    aside = path.parent / f"{PREFIX}{path.name}-{_host()}-{os.getpid()}-gone{secrets.token_hex(2)}"
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)
    return True
