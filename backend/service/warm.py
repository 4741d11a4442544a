"""Warming the result cache with a model's default demo, in the background at low priority.

The demo is what the dashboard computes first for a model: the Home page's head scores and ICL curve (the Head map
and the Ablation page show the same scores) on the model's first task, at the pages' default settings. Its requests
(`demo_requests`) are the pages' own, so the dashboard's first view of a freshly pulled model is a cache hit.

    python -m backend warm --model smollm2-135m        # in the foreground, a line per result
    start_warm("smollm2-135m")                          # detached, at nice 19 on one thread: what a pull calls

A warm-up shares the cache folder (HEADLENS_CACHE_DIR) with the service; the per-key locks keep the two from
computing one result twice, so a page that asks while the warm-up computes waits for it and reads its result.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..analysis.primitives import options as o
from ..errors import BadInput
from ..store.paths import DEFAULT_MODEL_NAMES, cache_dir

NICE = 19
# the pages' defaults (ui/state.py: shots 8, prompts 50, seed 0, top 3% of heads; Home's ICL curve over
# k = 0, 1, 2, 4, ... <= shots with 3 example rows); tests/integration/test_warm.py checks they are the pages' requests
DEMO = {"shots": o.SHOTS, "prompts": o.PROMPTS, "seed": o.SEED}
ICL_EXAMPLES = 3


def first_task(model: str, tasks: list[dict[str, Any]]) -> str | None:
    """The task the dashboard opens on for `model` (ui/layout.task_options): the default model's own tasks first
    on it, the general built-ins first on any other model. `tasks`: the service's task list ({id, models})."""
    own = [t["id"] for t in tasks if t.get("models", "any") == "default"]
    general = [t["id"] for t in tasks if t.get("models", "any") != "default" and t.get("source") != "upload"]
    ids = own + general if model in DEFAULT_MODEL_NAMES else general + own
    return ids[0] if ids else None


def demo_requests(model: str, task: str) -> list[tuple[str, dict[str, Any]]]:
    """(kind, params) of the Home page's first view of `model` on `task` at the default settings."""
    shots = DEMO["shots"]
    ks = sorted({k for k in (0, 1, 2, 4, 8, 16, 32) if k <= shots} | {0, shots})
    base = {**DEMO, "model": model, "task": task}
    return [("head_scores", {**base, "top_pct": o.TOP_PCT}),
            ("icl_curve", {**base, "shots": ks, "examples": ICL_EXAMPLES})]


def warm(model: str, task: str | None = None, *, say: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """Compute (or find cached) the demo of `model` on `task` (default: its first task); one summary row per
    result: {kind, task, cache_hit, seconds}."""
    from ..analysis.kernel import analyze
    from ..model.loading import load_model
    from ..tasks.registry import builtin_tasks, load_task

    if task is None:
        task = first_task(model, [{"id": n, "models": t.models} for n, t in builtin_tasks().items()])
        if task is None:
            raise BadInput("no built-in task to warm the cache with")
    t0 = time.perf_counter()
    lm = load_model(model)
    say(f"loaded {model} in {time.perf_counter() - t0:.1f} s")
    t = load_task(task)
    rows = []
    for kind, params in demo_requests(model, task):
        fields = {k: v for k, v in params.items() if k not in ("model", "task")}
        r = analyze(kind, lm, t, fields)
        rows.append({"kind": kind, "task": task, "cache_hit": r.cache_hit, "seconds": round(r.seconds, 3)})
        say(f"{kind} on {task}: {'cached already' if r.cache_hit else f'computed in {r.seconds:.1f} s'}")
    return rows


def start_warm(model: str, task: str | None = None, log: str | os.PathLike | None = None) -> subprocess.Popen:
    """`python -m backend warm --model MODEL` in a detached process at nice NICE on one torch thread (it yields the
    CPU to anything else), its output appended to `log` (default: warm.log in the cache folder)."""
    path = Path(log) if log is not None else cache_dir() / "warm.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "backend", "warm", "--model", model] + (["--task", task] if task else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = path.open("ab")
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=str(Path(__file__).resolve().parents[2]), start_new_session=True,
                                preexec_fn=lambda: os.nice(NICE))
    finally:
        out.close()
