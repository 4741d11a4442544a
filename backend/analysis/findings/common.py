"""Helpers shared by the sections of the findings report: verdicts, number formats, and how a section runs a kind."""
from __future__ import annotations

from typing import Any, Callable


def verdict(n: int, total: int) -> str:
    """holds / partly / does not hold from the number of tasks (or cases) it holds on (holds: at least 60%)."""
    if total and n >= 0.6 * total:
        return "holds"
    return "partly" if n > 0 else "does not hold"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}"


def section_analyze(a: Any) -> Callable[..., Any]:
    """How a section runs a kind: `a.analyze(kind, lm, task, **params)` when the caller set one (kind `findings`:
    through its own cache, progress and cancel), else the kernel's `analyze` with the default cache."""
    run = getattr(a, "analyze", None)
    if run is not None:
        return run
    from ..kernel import analyze

    return analyze
