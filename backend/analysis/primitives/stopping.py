"""Cooperative stops: one cheap check that every loop able to run long calls, so a job stops soon after it is
cancelled, preempted or past its time limit, whatever its size.

    with checking(stop):          # a runner: `stop()` raises (Cancelled, Preempted, JobTimeLimit) or returns
        analyze(...)              # ... in this thread, every check() below calls it
    for batch in batches:         # an analysis loop: once per batch, training step or generated token
        check()

A runner installs what stops its job for the thread that runs it (a context variable: a job's check never fires
in another thread's work, and outside a job `check()` does nothing). Checks nest: an inner `checking` adds to the
outer one, and the same function is installed once. The check is a few attribute reads and a clock read; it sends
no progress message. What it raises derives from `Stop`, so a loop that must not swallow a stop can tell it apart.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

Check = Callable[[], None]

_CHECKS: ContextVar[tuple[Check, ...]] = ContextVar("headlens_checks", default=())


class Stop(Exception):
    """Base of what a check raises: the job was cancelled, must give way, or ran past its time limit."""


def check() -> None:
    """Run the checks installed for this thread (`checking`); each may raise a `Stop`. Nothing outside a job."""
    for fn in _CHECKS.get():
        fn()


@contextmanager
def checking(fn: Check | None) -> Iterator[None]:
    """Install `fn` as a check (besides those installed already) while the block runs in this thread; None or an
    installed function: nothing changes."""
    have = _CHECKS.get()
    if fn is None or fn in have:
        yield
        return
    token = _CHECKS.set((*have, fn))
    try:
        yield
    finally:
        _CHECKS.reset(token)
