"""Estimates against real runs (issue 32, item 4): every page's main job, through the service, on the real models.

    python bench/bench_estimates.py                                  # SmolLM2 and Gemma-3-270M, quiet
    python bench/bench_estimates.py --load busy                      # two busy loops at nice 0 meanwhile
    python bench/bench_estimates.py --load swing                     # a busy loop that starts and stops (20-60 s)
    python bench/bench_estimates.py --models default --smoke         # three small jobs on the embedded model (CI)

The service runs in this process (`create_app`, its local runner) on a fresh cache folder with HEADLENS_TIMINGS on,
as a user's would: each page's main job is asked with POST /jobs/estimate, then run (POST /jobs), and its real time
is the job's own wall time (started to finished); then the same job with the next seed (the same work, not cached)
is estimated again, from the first run, and run. Target: estimate / real within 0.33-3x at the first run and
0.5-2x from the second run on. Page defaults (`ui/model_defaults.py`) except the long trainings, shortened and
said so: LTV (epochs 2) and SITE (100 steps). Real models need HEADLENS_MODELS_DIR (where `pull` put them).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ.setdefault("HEADLENS_CACHE_DIR", tempfile.mkdtemp(prefix="bench-estimates-"))
os.environ["HEADLENS_TIMINGS"] = "on"


def page_jobs(model: str) -> dict[str, dict]:
    """Each page's main job on `model` at its page defaults: {page: POST /jobs body}."""
    from ui.model_defaults import defaults_for

    d = defaults_for(model)
    base = {"model": model, "task": d["task"], "shots": d["shots"], "prompts": d["prompts"]}
    top = {"top_k": d["top_k"]} if d.get("top_k") else {}
    layer = d.get("ltv_layer") if isinstance(d.get("ltv_layer"), int) else None
    return {
        "Head map": {"kind": "head_scores", **base, **top},
        "Home (ICL curve)": {"kind": "icl_curve", **{**base, "shots": [0, 1, 2, 4, 8]}},
        "Ablation": {"kind": "ablation_curves", **base, "ks": sorted({0, 1, 2, 4, 8, d["kmax"] // 2, d["kmax"]})},
        "Steering": {"kind": "steer", **base, **({"layer": d["sg_layer"]} if d.get("sg_layer") is not None else {})},
        "Geometry": {"kind": "geometry", **base},
        "Head": {"kind": "head_view", **base, "head": [0, 0]},
        "Learned task vectors": {"kind": "ltv_layers", **base, **({"layer": layer} if layer is not None else {}),
                                 "epochs": 2},
        "Soft head selection": {"kind": "site_alphas", "model": model, "task": d["task"], "m": d["site_m"],
                                "shots": d["site_shots"], "steps": 100},
    }


SMOKE = {"Head map": {"kind": "head_scores", "model": "default", "task": "syn-sentiment", "shots": 2, "prompts": 4},
         "Ablation": {"kind": "ablate", "model": "default", "task": "syn-sentiment", "shots": 2, "prompts": 4,
                      "heads": [[0, 1]]},
         "Head": {"kind": "head_view", "model": "default", "task": "syn-sentiment", "shots": 2, "prompts": 4,
                  "head": [0, 0]}}


class Load:
    """Other work on the CPU: `busy` two busy loops at nice 0; `swing` one that starts and stops every 20-60 s."""

    def __init__(self, how: str):
        self.how, self.procs, self.stop = how, [], threading.Event()
        loop = [sys.executable, "-c", "while True: pass"]
        if how == "busy":
            self.procs = [subprocess.Popen(loop) for _ in range(2)]
        elif how == "swing":
            def swing() -> None:
                rng = random.Random(0)
                while not self.stop.is_set():
                    p = subprocess.Popen(loop)
                    self.stop.wait(rng.uniform(20, 60))
                    p.kill()
                    self.stop.wait(rng.uniform(20, 60))
            threading.Thread(target=swing, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        for p in self.procs:
            p.kill()


def run(c, body: dict) -> tuple[float, dict]:
    """(the job's own wall seconds, its final status) of one POST /jobs."""
    from hang import wait_until

    j = c.post("/jobs", json=body).json()
    if "id" not in j:
        raise RuntimeError(str(j)[:300])
    done = wait_until(lambda: (s := c.get(f"/jobs/{j['id']}").json())["status"] not in ("queued", "running") and s,
                      body["kind"], poll_s=0.1)
    if done["status"] != "done":
        raise RuntimeError(f"{done['status']}: {(done.get('error') or '')[:200]}")
    return done["finished"] - done["started"], done


def bench_model(model: str, smoke: bool) -> list[dict]:
    from starlette.testclient import TestClient

    from backend.service.app import create_app

    rows = []
    with TestClient(create_app()) as c:
        for page, body in (SMOKE if smoke else page_jobs(model)).items():
            for attempt, seed in ((1, 0), (2, 1)):
                b = {**body, "seed": seed} if body["kind"] != "head_view" else {**body, "prompt": seed}
                e = c.post("/jobs/estimate", json=b).json()
                load = os.getloadavg()[0]
                try:
                    real, _ = run(c, b)
                    error = None
                except Exception as ex:  # noqa: BLE001 - a row, not a crash
                    real, error = float("nan"), str(ex)[:200]
                ratio = e["seconds"] / real if e.get("seconds") and real == real and real > 0 else None
                rows.append({"model": model, "page": page, "kind": body["kind"], "run": attempt, "estimate_s": e.get("seconds"),
                             "low": e.get("low"), "high": e.get("high"), "real_s": real, "ratio": ratio,
                             "basis": e.get("basis"), "load": load, "error": error})
                print(f"{model:13s} {page:22s} run {attempt}  est {e.get('seconds') or 0:8.2f} s  real {real:8.2f} s  "
                      f"ratio {ratio if ratio is None else round(ratio, 2)!s:>5}  load {load:4.1f}  ({e.get('basis')})"
                      + (f"  ERROR {error}" if error else ""), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m")
    ap.add_argument("--load", choices=("quiet", "busy", "swing"), default="quiet")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    load = Load(a.load)
    try:
        rows = [r for m in a.models.split(",") for r in bench_model(m.strip(), a.smoke)]
    finally:
        load.close()
    for run_no, lo, hi in ((1, 1 / 3, 3.0), (2, 0.5, 2.0)):
        got = [r for r in rows if r["run"] == run_no and r["ratio"] is not None]
        within = sum(lo <= r["ratio"] <= hi for r in got)
        print(f"run {run_no}: {within} of {len(got)} within {lo:.2f}-{hi:g}x ({a.load})", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"load": a.load, "rows": rows}, indent=1))
    return 0 if all(r["error"] is None for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
