"""Whether a computation reused work done before it: a cached result or a memoised induction pass that it did not
compute itself. What `service/calibration.py` needs to know: a job that reused earlier work ran faster than its
plan says, and is no measure of what the plan costs. (A sub-result the job computed and then read again counts as
its own work; prefix states held from an earlier pass are left out of the plan by the estimate itself.)

    with counting() as reused:
        analyze(...)
    reused.count    # how many times earlier work was reused inside the block (this thread / context only)
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Hashable, Iterator


@dataclass
class Tally:
    """count: reuses of work from before the block; made: what the block computed itself (by key)."""

    count: int = 0
    made: set = field(default_factory=set)


_TALLY: ContextVar[Tally | None] = ContextVar("headlens_reuse", default=None)


def made(key: Hashable) -> None:
    """The work under `key` was computed inside the current block (a later read of it is not a reuse)."""
    tally = _TALLY.get()
    if tally is not None:
        tally.made.add(key)


def note(key: Hashable) -> None:
    """The work under `key` was read, not computed: counted as a reuse unless the current block made it."""
    tally = _TALLY.get()
    if tally is not None and key not in tally.made:
        tally.count += 1


@contextmanager
def counting() -> Iterator[Tally]:
    """A Tally of the block's reuses (a nested block counts into its own tally only)."""
    tally = Tally()
    token = _TALLY.set(tally)
    try:
        yield tally
    finally:
        _TALLY.reset(token)
