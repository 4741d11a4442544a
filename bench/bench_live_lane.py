"""A toggle behind a long job (issue 25, items 1 and 2), through the service API: how long a live toggle takes while
the Ablation page's curves run, and what the pages' auto-start rule decides (a benchmark, not a test).

    HEADLENS_MODELS_DIR=models/pulled .venv/bin/python bench/bench_live_lane.py --model smollm2-135m
    .venv/bin/python bench/bench_live_lane.py --model default --task syn-sentiment     # the embedded model
    .venv/bin/python bench/bench_live_lane.py --smoke     # the embedded model, k <= 4, one toggle (the CI test)

In one in-process service (an empty cache folder): load the model and measure its speed (`model_info`); the Head
map's pass (`scores`, 8 shots x 50 prompts: it keeps the prompts' clean prefix); the estimates of the Ablation
page's curves and of a last-token toggle of the top 3 TR heads (and whether `ui.jobs` would start each by itself);
the first toggle on an idle service (the first toggle after opening Ablation, now that the curves wait for Run);
then the curves submitted (as after pressing their Run) and, once they are in their ablation sweep, toggles of new
head sets, each timed from its POST to `done`, with the message it showed while queued. The curves are cancelled at
the end (`--finish` waits for them instead, to count how often they gave way and what that cost). Wall-clock on
whatever else the machine runs; the load average is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load_avg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def wait(c: Any, jid: str, until: tuple[str, ...] = ("done", "error", "cancelled"), timeout: float = 3600,
         cond: Any = None) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = c.get(f"/jobs/{jid}").json()
        if j["status"] in until or (cond is not None and cond(j)):
            return j
        time.sleep(0.01)
    raise TimeoutError(f"job {jid}: {j['status']} {j['message']}")


def timed_toggle(c: Any, body: dict[str, Any]) -> dict[str, Any]:
    """POST the toggle, keep the first message it showed while queued, and time it to done."""
    t0 = time.perf_counter()
    j = c.post("/jobs", json=body).json()
    first = c.get(f"/jobs/{j['id']}").json()
    done = wait(c, j["id"])
    took = time.perf_counter() - t0
    assert done["status"] == "done", done
    return {"seconds": round(took, 3), "lane": j["lane"], "computed_s": round(done["result"].get("seconds", 0), 3),
            "message_at_submit": first["message"] if first["status"] == "queued" else first["status"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default=None, help="default: the model's own default task")
    ap.add_argument("--kmax", type=int, default=32, help="the curves' largest k (the page's slider)")
    ap.add_argument("--toggles", type=int, default=3, help="toggles while the curves run")
    ap.add_argument("--gap", type=float, default=5.0, help="seconds the curves run between two toggles")
    ap.add_argument("--finish", action="store_true", help="let the curves finish instead of cancelling them")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="the embedded model, k <= 4, one toggle (the CI test)")
    a = ap.parse_args()
    if a.smoke:
        a.model, a.task, a.kmax, a.toggles, a.gap, a.finish = "default", "syn-sentiment", 4, 1, 0.2, False
    os.environ.setdefault("HEADLENS_CACHE_DIR", tempfile.mkdtemp(prefix="bench-live-lane-"))

    from starlette.testclient import TestClient

    from ui.model_defaults import defaults_for
    from backend.service import jobs as J
    from backend.service.app import create_app

    task = a.task or defaults_for(a.model).get("task") or "sentiment"
    common = {"model": a.model, "task": task, "shots": 8, "prompts": 50, "seed": 0}
    ks = sorted({0, a.kmax} | {k for k in (1, 2, 4, 8, 16, 32, 64) if k < a.kmax})
    curves = {"kind": "ablation_curves", **common, "ks": ks, "mode": "zero",
              "orders": ["tr", "tl", "induction", "random"], "random_seeds": [0, 1, 2]}
    res: dict[str, Any] = {"model": a.model, "task": task, "load_before": load_avg(),
                           "live_max_s": J.LIVE_MAX_S, "hold_over_s": J.HOLD_OVER_S}
    with TestClient(create_app()) as c:
        t0 = time.perf_counter()
        assert wait(c, c.post("/jobs", json={"kind": "model_info", "model": a.model}).json()["id"])["status"] == "done"
        res["model_info_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        sc = wait(c, c.post("/jobs", json={"kind": "scores", **common}).json()["id"])
        assert sc["status"] == "done", sc
        res["scores_s"] = round(time.perf_counter() - t0, 1)
        r = sc["result"]
        L, H = r["n_layers"], r["n_heads"]
        ranked = {k: sorted(((r[k][l][h], (l, h)) for l in range(L) for h in range(H)), reverse=True)
                  for k in ("tr", "tl", "induction")}
        head_sets = [[list(x[1]) for x in ranked[k][:3]] for k in ("tr", "tl", "induction")]
        head_sets += [[[l, (h + 1) % H] for l, h in s] for s in head_sets]  # more new sets for more toggles

        def toggle(i: int) -> dict[str, Any]:
            return {"kind": "ablate", **common, "heads": head_sets[i % len(head_sets)], "mode": "zero",
                    "positions": "last"}

        est = {name: c.post("/jobs/estimate", json=body).json() for name, body in
               (("curves", curves), ("toggle", toggle(0)), ("toggle_every_position", {**toggle(0), "positions": "all"}))}
        res["estimates"] = {name: {"seconds": round(e["seconds"], 2) if e.get("seconds") is not None else None,
                                   "basis": e["basis"], "held_tokens": e.get("held_tokens"),
                                   "lane": J.lane_for("interactive", e.get("seconds")),
                                   "page_starts_it_by_itself": (e.get("seconds") or 0) <= J.HOLD_OVER_S}
                            for name, e in est.items()}
        res["first_toggle_idle"] = timed_toggle(c, toggle(0))

        cj = c.post("/jobs", json=curves).json()
        wait(c, cj["id"], cond=lambda j: j["status"] == "running" and "ablating" in (j["message"] or ""))
        res["during_curves"] = []
        for i in range(1, a.toggles + 1):
            time.sleep(a.gap)
            res["during_curves"].append(timed_toggle(c, toggle(i)))
            print(f"  toggle {i} behind the curves: {res['during_curves'][-1]}", flush=True)
        t_curves = time.perf_counter()
        if a.finish:
            done = wait(c, cj["id"])
            res["curves"] = {"status": done["status"], "preempted": done["preempted"],
                             "seconds_after_toggles": round(time.perf_counter() - t_curves, 1)}
        else:
            c.delete(f"/jobs/{cj['id']}")
            done = wait(c, cj["id"])
            res["curves"] = {"status": done["status"], "preempted": done["preempted"]}
    res["load_after"] = load_avg()
    tog = [x["seconds"] for x in res["during_curves"]]
    res["summary"] = {"first_toggle_idle_s": res["first_toggle_idle"]["seconds"],
                      "toggle_behind_curves_max_s": max(tog) if tog else None,
                      "toggle_behind_curves_median_s": sorted(tog)[len(tog) // 2] if tog else None}
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
