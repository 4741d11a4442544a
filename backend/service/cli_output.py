"""What the command line writes: results as strict JSON and report files, whole or not at all and checked before any
work (`check_output`, `write_output`: atomic_dirs.write_file), and progress on stderr (`Bar`)."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from ..store.atomic_dirs import WriteError, check_file_target, write_file, write_reason
from .errors import UsageError
from ..text import clip


def emit(obj: Any, out: str | None) -> None:
    """Write strict JSON (NaN and infinities as null) to `out` (a file path, written whole or not at all) or stdout."""
    from ..store.jsonable import to_jsonable

    text = json.dumps(to_jsonable(obj), indent=1, allow_nan=False)
    if out and out != "-":
        write_output(text, out, "--json")
        print(f"wrote {out}", file=sys.stderr)
    else:
        print(text)


# -- files the commands write -------------------------------------------------------------------------------
def _is_stream(path: str) -> bool:
    """Whether `path` is an existing device or pipe (/dev/stdout, /dev/null, a FIFO): written as it is."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _through_link(path: str) -> str:
    """The file a symlink points to (it is written there, the link kept), else `path`."""
    return os.path.realpath(path) if os.path.islink(path) else path


def check_output(path: str | None, flag: str) -> None:
    """Before any work: refuse an output file that cannot be written, in one sentence naming the folder as the user
    gave it (UsageError, exit 2): the path is a folder, or its folder is missing, not a folder, read-only, full or
    refuses new files (/proc). A probe file is created and removed there."""
    if not path or path == "-" or _is_stream(path):
        return
    if Path(path).is_dir():
        raise UsageError(f"{flag} {clip(path, 200)}: is a directory; give a file path")
    try:
        check_file_target(_through_link(path))
    except WriteError as e:
        folder = os.path.dirname(path) or "."
        raise UsageError(f"{flag} {clip(path, 200)}: cannot write in the folder {clip(folder, 200)} ({e.reason})") \
            from None


def write_output(data: str | bytes, path: str, flag: str) -> int:
    """Write `data` to the output file `path` whole or not at all (temporary name, flush, rename:
    atomic_dirs.write_file); a failure (a full disk) leaves no partial file and is one sentence (UsageError). The
    number of bytes written."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        if _is_stream(path):
            with open(path, "wb") as f:
                f.write(raw)
        else:
            write_file(_through_link(path), raw)
    except OSError as e:
        raise UsageError(f"{flag} {clip(path, 200)}: cannot write it ({write_reason(e)}); nothing was written") \
            from None
    return len(raw)


class Bar:
    """Progress on stderr fed by progress(fraction, message) callbacks: a tqdm bar on a terminal; written to a file
    or a pipe, a plain line at most every PLAIN_EVERY_S seconds ("findings: 42% · training: step 80/400 · 31 s"),
    not a carriage-return redraw per step (a one-minute `report` once wrote 70 kB of them)."""

    PLAIN_EVERY_S = 5.0

    def __init__(self, desc: str, stream: Any = None):
        import time

        self.stream = stream or sys.stderr
        self.desc, self.t0, self.last = desc, time.monotonic(), None
        isatty = getattr(self.stream, "isatty", None)
        self.bar = None
        if callable(isatty) and isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=1000, desc=desc, file=self.stream, leave=False,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining} {postfix}")

    def __call__(self, frac: float, msg: str = "") -> None:
        frac = min(max(frac, 0.0), 1.0)
        if self.bar is None:
            import time

            now = time.monotonic()
            if self.last is None or now - self.last >= self.PLAIN_EVERY_S:
                self.last = now
                print(f"{self.desc}: {frac:.0%}" + (f" · {msg}" if msg else "") + f" · {now - self.t0:.0f} s",
                      file=self.stream, flush=True)
            return
        self.bar.n = int(1000 * frac)
        self.bar.set_postfix_str(msg, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
