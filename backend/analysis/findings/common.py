"""Helpers shared by the sections of the findings report: number formats, and how a section runs a kind (the
verdicts: `verdicts.py`)."""
from __future__ import annotations

from typing import Any, Callable


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}"


def section_analyze(a: Any) -> Callable[..., Any]:
    """How a section runs a kind: `a.analyze(kind, lm, task, **params)` when the caller set one (kind `findings_report`:
    through its own cache, progress and cancel), else the kernel's `analyze` with the default cache."""
    run = getattr(a, "analyze", None)
    if run is not None:
        return run
    from ..kernel import analyze

    return analyze
