"""`python -m backend sweep`: a sweep through the configured runner (HEADLENS_RUNNER), with one progress bar for
the sweep and one per model, on stderr; the sweep record, its summary and every result as JSON.

    python -m backend sweep --models default,/m/llama --tasks syn-sentiment,syn-antonym \\
        --kinds head_scores,icl_curve,ablation_curves --seeds 0,1,2 --set shots=4 --set prompts=20 --json sweep.json

Jobs whose results are cached end at once, so running the same command again after an interruption continues
where it stopped.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

from ..text import clip
from .errors import UsageError


def add_parser(sub: Any) -> None:
    s = sub.add_parser("sweep", help="run analyses over models x tasks x kinds x seeds (through HEADLENS_RUNNER)",
                       description="Fan models x tasks x kinds x seeds out as jobs of the configured runner "
                                   "(HEADLENS_RUNNER=local|ray); cached results are skipped.")
    s.add_argument("--models", required=True, help="comma-separated: `default`, model folders, Hugging Face ids")
    s.add_argument("--tasks", required=True, help="comma-separated built-in task names (see `tasks`)")
    s.add_argument("--kinds", default="head_scores", help="comma-separated analysis kinds (default: head_scores)")
    s.add_argument("--seeds", default="0", help="comma-separated seeds (default: 0)")
    s.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE",
                   help="a parameter for every kind that has it (repeatable; VALUE is JSON or text): --set shots=4")
    s.add_argument("--name", default=None, help="a name for the sweep")
    s.add_argument("--json", dest="out", default=None, help="write the sweep, summary and results here (default: "
                                                            "stdout)")
    s.add_argument("--no-bars", action="store_true", help="no progress bars")
    s.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")


def _list(text: str, flag: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise UsageError(f"{flag}: give at least one, comma-separated")
    return items


def request_from(a: argparse.Namespace) -> Any:
    from .errors import ServiceError
    from .sweeps import parse_request

    try:
        seeds = [int(s) for s in _list(a.seeds, "--seeds")]
    except ValueError:
        raise UsageError(f"--seeds: expected comma-separated integers, got {clip(a.seeds, 60)!r}") from None
    params: dict[str, Any] = {}
    for item in a.sets:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise UsageError(f"--set: expected FIELD=VALUE, got {clip(item, 60)!r}")
        try:
            params[name.strip()] = json.loads(value)
        except ValueError:
            params[name.strip()] = value
    try:
        return parse_request({"models": _list(a.models, "--models"), "tasks": _list(a.tasks, "--tasks"),
                              "kinds": [k.replace("-", "_") for k in _list(a.kinds, "--kinds")], "seeds": seeds, "params": params, "name": a.name})
    except ServiceError as e:
        raise UsageError(e.message) from None


class Bars:
    """One tqdm bar for the sweep and one per model, fed from the sweep's snapshots."""

    def __init__(self, snap: dict[str, Any], enabled: bool = True):
        from tqdm import tqdm

        self.enabled = enabled
        if not enabled:
            return
        fmt = "{desc:<28.28}: {percentage:3.0f}%|{bar}|{postfix}"
        self.total = tqdm(total=1000, desc="sweep", file=sys.stderr, position=0, bar_format=fmt, leave=True)
        self.models = {str(m["model"]): tqdm(total=1000, desc=str(m["model"])[-28:], file=sys.stderr, position=i + 1,
                                             bar_format=fmt, leave=True)
                       for i, m in enumerate(snap["models"])}

    def update(self, snap: dict[str, Any]) -> None:
        if not self.enabled:
            return
        c = snap["counts"]
        self.total.n = int(1000 * snap["progress"])
        self.total.set_postfix_str(f"{c['done'] + c['error'] + c['cancelled']}/{c['total']} jobs, {c['cached']} "
                                   f"cached, {c['error']} failed, {c['running']} running", refresh=False)
        self.total.refresh()
        for m in snap["models"]:
            bar = self.models.get(str(m["model"]))
            if bar is not None:
                bar.n = int(1000 * m["progress"])
                bar.set_postfix_str(f"{m['finished']}/{m['total']}, {m['cached']} cached"
                                    + (f", {m['errors']} failed" if m["errors"] else ""), refresh=False)
                bar.refresh()

    def close(self) -> None:
        if self.enabled:
            for b in [self.total, *self.models.values()]:
                b.close()


def table(summary: dict[str, Any]) -> str:
    """The per-model TR/TL summary as text."""
    cols = [("model", "model", "{}"), ("tasks", "tasks", "{}"), ("accuracy", "acc", "{:.3f}"),
            ("tr_depth", "TR depth", "{:.2f}"), ("tl_depth", "TL depth", "{:.2f}"),
            ("tr_induction", "TR∩ind", "{:.2f}"), ("tl_induction", "TL∩ind", "{:.2f}")]
    rows = summary.get("models") or []
    if not rows:
        return ""
    cells = [[h for _, h, _ in cols]] + [[f.format(r[k]) if r.get(k) is not None else "-" for k, _, f in cols]
                                         for r in rows]
    cells = [[c[-40:] for c in row] for row in cells]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells)


def run(a: argparse.Namespace, emit: Callable[[Any, str | None], None]) -> None:
    """The sweep command; `emit(obj, out)` writes the JSON (the CLI's strict-JSON writer)."""
    from .errors import ServiceError
    from .limits import Limits
    from .model_pool import ModelPool
    from .ray_runner import make_runner
    from .sweeps import SweepManager, sweep_cells
    from .task_store import TaskStore

    req = request_from(a)
    limits = Limits.from_env()
    pool = ModelPool(max_models=limits.max_models)
    tasks = TaskStore(memory_items=limits.upload_cache, quota_bytes=limits.upload_quota_bytes)  # as create_app
    try:
        cells = sweep_cells(req, pool, tasks, limits)
    except ServiceError as e:
        raise UsageError(e.message) from None
    runner = make_runner(pool, tasks, limits)
    manager = SweepManager(runner, limits, keep_results=True)
    try:
        sid = manager.start(req, cells)["id"]
        bars = Bars(manager.get(sid, detail=False) or {}, enabled=not a.no_bars)
        try:
            while True:
                snap = manager.get(sid, detail=False) or {}
                bars.update(snap)
                if snap.get("status") != "running":
                    break
                time.sleep(0.25)
        finally:
            bars.close()
        final = manager.get(sid) or {}
        out = {"sweep": {k: v for k, v in final.items() if k != "summary"}, "summary": final.get("summary"),
               "results": manager.results(sid)}
    except KeyboardInterrupt:
        manager.close()
        raise
    finally:
        runner.close()
    c = final["counts"]
    print(f"sweep {final['status']}: {c['done']} done ({c['cached']} cached), {c['error']} failed, "
          f"{c['cancelled']} cancelled of {c['total']}", file=sys.stderr)
    text = table(final.get("summary") or {})
    if text:
        print(text, file=sys.stderr)
    for j in final.get("jobs", []):
        if j["status"] == "error":
            print(f"failed: {j['kind']} {j['model']} {j['task']} seed {j['seed']}: {j['error']}", file=sys.stderr)
    emit(out, a.out)
    if c["error"] or final["status"] != "done":
        raise SystemExit(1)
