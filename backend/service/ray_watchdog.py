"""A local Ray instance goes when the service that started it goes, even after kill -9.

`ray.init()` in the service starts Ray's processes as its children; when the service dies without
`ray.shutdown()` (kill -9, an OOM kill), most of them follow, but the raylet's agents (DashboardAgent,
RuntimeEnvAgent: about 170 MB) are left behind, adopted by init. `start(parent)` starts this module as a small
child process that every POLL_S seconds records the service's descendants (pid and start time, from /proc) and,
once the service is gone, for GRACE_S sends SIGTERM to them, their children and any process init has adopted that is
in the service's process group and younger than the service (the agents, once the raylet is gone), then SIGKILL to
any still alive with the same start time (a pid reused meanwhile is left alone). Linux only (/proc); elsewhere it
does nothing.

    python -m backend.service.ray_watchdog <service pid> <its process group> <its start time>
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

POLL_S = 0.5
GRACE_S = 3.0
log = logging.getLogger(__name__)


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, process group, start time in clock ticks) of a process, from /proc/<pid>/stat; None when it is
    gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
    return int(fields[1]), int(fields[2]), int(fields[19])


def _table() -> dict[int, tuple[int, int, int]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                out[int(entry)] = st
    return out


def descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every live descendant of `root`."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for pid, (ppid, _, start) in _table().items():
        parents.setdefault(ppid, []).append(pid)
        starts[pid] = start
    out, todo = {}, list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in out and pid in starts:
            out[pid] = starts[pid]
            todo.extend(parents.get(pid, []))
    return out


def _alive(pid: int, start: int) -> bool:
    st = _stat(pid)
    return st is not None and st[2] == start


def _signal(pids: Any, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def watch(parent: int, group: int, parent_start: int, me: int | None = None) -> int:
    """Follow `parent`'s descendants until it is gone, then end them; the number of processes ended. `group` and
    `parent_start` are the parent's process group and start time (passed by the parent: this process may start
    only after it died)."""
    me = os.getpid() if me is None else me
    known: dict[int, int] = {}
    while _alive(parent, parent_start):
        known.update(descendants(parent))
        time.sleep(POLL_S)
    ended: dict[int, int] = {}
    deadline = time.monotonic() + GRACE_S
    while True:  # for GRACE_S: what the dead service's tree still holds (and what it spawns meanwhile) gets SIGTERM
        for pid, (ppid, pgrp, start) in _table().items():
            adopted = ppid == 1 and pgrp == group and start >= parent_start
            if pid != me and (ppid in known or adopted):
                known.setdefault(pid, start)
        fresh = {p: s for p, s in known.items() if p != me and p not in ended and _alive(p, s)}
        _signal(fresh, signal.SIGTERM)
        ended.update(fresh)
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    _signal([p for p, s in ended.items() if _alive(p, s)], signal.SIGKILL)
    return len(ended)


def start(parent: int | None = None) -> subprocess.Popen | None:
    """Start the watchdog for `parent` (default: this process); None where /proc is absent."""
    if not Path("/proc/self/stat").is_file():
        return None
    parent = os.getpid() if parent is None else parent
    st = _stat(parent)
    if st is None:
        return None
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.Popen([sys.executable, "-m", "backend.service.ray_watchdog", str(parent), str(st[1]), str(st[2])],
                            cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own session: a Ctrl-C to the service does not reach it


if __name__ == "__main__":
    watch(*(int(x) for x in sys.argv[1:4]))
