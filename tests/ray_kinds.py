"""A test analysis kind for the Ray runner's tests: importable by Ray workers (tests/ is on their path).

`rcount` computes `n`, taking `steps` steps of `delay` s with progress after each, appending one line per
computation to the file `log` (so a test in another process can count computations), and can fail (`fail`)
or kill its own worker process (`die`: os._exit, as a crashed worker)."""
from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel, ConfigDict

from backend.analysis.kinds import Kind
from backend.analysis.results import Result


class RCountParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = 0
    steps: int = 4
    delay: float = 0.05
    log: str = ""
    fail: bool = False
    die: bool = False


class RCountResult(Result):
    n: int
    pid: int


def run_rcount(ctx: Any, p: RCountParams) -> dict[str, Any]:
    if p.log:
        with open(p.log, "a") as f:
            f.write(f"start {p.n} {os.getpid()}\n")
    if p.die:
        os._exit(3)
    for i in range(p.steps):
        ctx.progress(i / p.steps, f"step {i}")
        time.sleep(p.delay)
    if p.fail:
        raise ValueError(f"rcount {p.n} failed as asked")
    if p.log:
        with open(p.log, "a") as f:
            f.write(f"end {p.n} {os.getpid()}\n")
    return {"n": p.n, "pid": os.getpid()}


RCOUNT = Kind("rcount", RCountParams, RCountResult, "ray_kinds:run_rcount", "test kind for the Ray runner",
              api="rcount", uses_task=False, uses_model=False)
