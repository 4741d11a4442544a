"""A job as a runner takes it (`admit.Admission`'s kind, params, key and estimated seconds), for tests of the job
runners with executors of their own."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


@dataclass
class PlainJob:
    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    key: str = ""
    seconds: float | None = None

    @property
    def estimate(self) -> Any:
        return SimpleNamespace(seconds=self.seconds)


def submit(runner: Any, kind: str, params: dict[str, Any], key: str, lane: str = "interactive",
           seconds: float | None = None) -> Any:
    return runner.submit(PlainJob(kind, params, key or kind, seconds), lane=lane)
