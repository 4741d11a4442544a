"""Folders and files that appear whole or not at all: written under a temporary name beside the target, then
renamed.

`with staging(target) as tmp:` yields an empty folder `<parent>/.tmp-<target name>-<pid>-<random>`; when the
block ends normally, `tmp` is renamed to `target` (one rename on one file system: readers see either nothing or
the finished folder); when it raises (an error, Ctrl-C), `tmp` is deleted. A process killed with SIGKILL leaves
its temporary folder behind: `clean_stale(parent)` deletes those whose process is gone, and every `staging` call
runs it first.

Files: `write_file(path, data)` writes `<parent>/.tmp-<name>-<host>-<pid>-<random>`, flushes it to disk and
renames it over `path`; on any failure (a full disk: ENOSPC) the temporary file is removed, `path` is left as it
was, and a `WriteError` says why in words, without a path. `check_file_target(path)` tries the same in the folder
(create, write one block, remove) so a command can refuse a place before its work, not after.
"""
from __future__ import annotations

import errno
import os
import secrets
import shutil
import socket
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import UserError

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
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:  # a temporary file of write_file
            try:
                p.unlink()
            except OSError:
                continue
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


# -- files ------------------------------------------------------------------------------------------------------
PROBE_BYTES = 4096  # what check_file_target writes: a disk that cannot take one block is full


class WriteError(UserError, OSError):
    """A file that could not be written: `reason` in words (no space, read-only, ...), without a path."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


_REASONS = {  # where the system's own words mislead (ENOENT when /proc refuses a new file) or say nothing
    errno.ENOENT: "no file can be created there",
    errno.ENOTDIR: "a part of the path is not a folder",
    errno.EISDIR: "it is a folder",
}


def write_reason(e: OSError) -> str:
    """An OSError of a write in words (`No space left on device`, `Read-only file system`, ...), without its file
    name (which would be an absolute path)."""
    if isinstance(e, WriteError):
        return e.reason
    return _REASONS.get(e.errno or 0) or e.strerror or type(e).__name__


def _temp_name(target: Path) -> Path:
    return target.parent / f"{PREFIX}{target.name[:100]}-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def write_file(path: str | os.PathLike, data: bytes | str, mode: int | None = None) -> None:
    """Write `data` (str: UTF-8) to `path` whole or not at all (see the module docstring); WriteError otherwise.

    `mode`: the new file's permission bits (less the umask); default: an existing file's own, else 0o666 less the
    umask, as `open` would. A symlink at `path` is replaced by the file, not followed."""
    target = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    keep = None
    if mode is None:
        try:
            st = os.stat(target, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                keep = st.st_mode & 0o7777
        except OSError:
            pass
    tmp = _temp_name(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o666 if mode is None else mode)
        try:
            if keep is not None:
                os.fchmod(fd, keep)
            _write_fd(fd, raw)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as e:  # a full disk, Ctrl-C: no partial file, under either name
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise WriteError(write_reason(e)) from None
        raise


def check_file_target(path: str | os.PathLike) -> None:
    """Whether `write_file(path, ...)` can put a file there, tried without leaving anything: WriteError saying why
    not: `path` is a folder ("it is a folder, not a file"), or why its folder cannot take a file (it does not
    exist, is not a folder, is read-only or full, refuses new files)."""
    target = Path(path)
    if target.is_dir():
        raise WriteError("it is a folder, not a file")
    parent = target.parent
    if not parent.exists():  # the reasons from here on are the folder's
        raise WriteError("it does not exist")
    if not parent.is_dir():
        raise WriteError("it is not a folder")
    tmp = _temp_name(target)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            _write_fd(fd, b"\0" * PROBE_BYTES)
        finally:
            os.close(fd)
    except OSError as e:
        raise WriteError(write_reason(e)) from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
