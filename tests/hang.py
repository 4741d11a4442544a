"""The only wall-clock bound a test may have: a hang guard.

CI runs on a busy machine (2 cores shared with other work), where a server, a subprocess or a job can take many
times what it takes on an idle one. So no test waits for a fixed number of seconds and fails: every wait is
"until it happens", bounded only by HANG_S (HEADLENS_TEST_HANG_S, default 30 minutes), which only a real hang
reaches. How fast something is gets measured by the scripts in bench/, never asserted in a test.
"""
from __future__ import annotations

import os
import time
from typing import Callable, TypeVar

HANG_S = float(os.environ.get("HEADLENS_TEST_HANG_S") or 1800)

T = TypeVar("T")


def wait_until(check: Callable[[], T], what: str, poll_s: float = 0.05, hang_s: float = HANG_S) -> T:
    """Call `check` every `poll_s` until it returns something truthy, and return that; AssertionError naming
    `what` only after `hang_s` (a hang)."""
    deadline = time.monotonic() + hang_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"hang guard: {what} did not happen within {hang_s:g} s (HEADLENS_TEST_HANG_S)")
        time.sleep(poll_s)
    return value


def returns(fn: Callable[[], T], what: str, hang_s: float = HANG_S) -> T:
    """fn()'s value, for a call that must return rather than hang (a probe that gives up, a refusal): it runs in a
    helper thread, and AssertionError names `what` if it is still running after `hang_s`."""
    import threading

    out: list = []

    def call() -> None:
        try:
            out.append((True, fn()))
        except BaseException as e:  # noqa: BLE001  (raised again in the caller)
            out.append((False, e))

    t = threading.Thread(target=call, name=f"hang-guard: {what}", daemon=True)
    t.start()
    t.join(hang_s)
    if not out:
        raise AssertionError(f"hang guard: {what} still running after {hang_s:g} s (HEADLENS_TEST_HANG_S)")
    ok, value = out[0]
    if not ok:
        raise value
    return value
