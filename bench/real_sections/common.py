"""Helpers shared by the sections of bench/real_findings.py: verdicts and number formats."""
from __future__ import annotations


def verdict(n: int, total: int) -> str:
    """holds / partly / does not hold from the number of tasks (or cases) it holds on (holds: at least 60%)."""
    if total and n >= 0.6 * total:
        return "holds"
    return "partly" if n > 0 else "does not hold"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}"
