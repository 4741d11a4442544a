"""JSON files the service reads back, treated as untrusted: a regular file only (a FIFO or a device is never
opened for a blocking read), at most `max_bytes`, nested at most `max_depth` deep (checked before parsing, so a
`[` x 100,000 file is refused, not a RecursionError). The caller range-checks every value it takes.

    data = read_json(path, max_bytes=1 << 20, max_depth=6)    # None: absent, not a regular file, too big or bad
"""
from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def depth(text: str) -> int:
    """The deepest nesting of `[` and `{` in a JSON text, outside strings."""
    deepest = level = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            deepest = max(deepest, level)
        elif ch in "]}":
            level -= 1
    return deepest


def loads(text: str, max_depth: int) -> Any:
    """json.loads of a text nested at most `max_depth` deep (ValueError otherwise)."""
    if depth(text) > max_depth:
        raise ValueError(f"nested deeper than {max_depth}")
    return json.loads(text)


def read_json(path: str | os.PathLike, max_bytes: int = 1 << 20, max_depth: int = 8) -> Any | None:
    """The JSON value of the file at `path`, or None (and a log line) when it is absent, not a regular file, over
    `max_bytes`, nested over `max_depth`, or not JSON."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("not reading %s: %s", p.name, e.strerror or e)
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            log.warning("not reading %s: not a regular file", p.name)
            return None
        if st.st_size > max_bytes:
            log.warning("not reading %s: %d bytes, over %d", p.name, st.st_size, max_bytes)
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(max_bytes + 1)
        if len(raw) > max_bytes:
            return None
        return loads(raw.decode("utf-8"), max_depth)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        log.warning("not reading %s: %s", p.name, str(e)[:200])
        return None
    finally:
        os.close(fd)
