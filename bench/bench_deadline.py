"""How soon a job past HEADLENS_JOB_TIMEOUT_S stops (issue 24, item 6), over loopback on the service.

    .venv/bin/python bench/bench_deadline.py [--limit 20] [--json bench/deadline.json]
    .venv/bin/python bench/bench_deadline.py --smoke     # a 2 s limit, one job: it ends with the time-limit error

Starts `python -m backend serve` on a free loopback port with HEADLENS_JOB_TIMEOUT_S=limit (and HEADLENS_MAX_WORK
high, so the work limit admits these bodies: the time limit is what is measured) and `--preload default`, waits
until the embedded default model is resident (a model load inside a job cannot be interrupted), then submits the issue's three `site` bodies on `syn-sentiment`, one after another:
m=5000; budget=[5000]; max_new_tokens=256 with 300 prompts. Per job: the server's started -> finished seconds (when
the job stopped, measured from its start), the client's seconds from POST to the job's end, the status, the error
and the progress it had reached. Target: every job stopped within 1.2x the limit. Wall-clock times, on whatever
else the machine runs.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
BODIES = {
    "m=5000": {"m": 5000},
    "budget=[5000]": {"budget": [5000]},
    "max_new_tokens=256, 300 prompts": {"max_new_tokens": 256, "prompts": 300},
}
BASE = {"kind": "site", "model": "default", "task": "syn-sentiment"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(limit: float, cache: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, HEADLENS_JOB_TIMEOUT_S=str(limit), HEADLENS_MAX_WORK=str(10**9), HEADLENS_CACHE_DIR=cache,
               HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    for var in ("HEADLENS_TOKEN", "HEADLENS_RUNNER", "HEADLENS_BACKEND_URL"):
        env.pop(var, None)
    proc = subprocess.Popen([sys.executable, "-m", "backend", "serve", "--port", str(port), "--log-level", "warning",
                             "--preload", "default"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):  # up to 5 minutes to start and load the model on a busy machine
        if proc.poll() is not None:
            raise SystemExit(f"the service exited: {proc.stderr.read()[-2000:]}")
        try:
            caps = httpx.get(f"{url}/capabilities", timeout=5)
            if caps.status_code == 200 and caps.json().get("loaded_models"):
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("the service did not start with the default model loaded within 5 minutes")


def run_job(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = c.post("/jobs", json=body)
    if r.status_code != 202:
        return {"status": f"refused {r.status_code}", "error": r.text[:300]}
    jid = r.json()["id"]
    while (j := c.get(f"/jobs/{jid}").json())["status"] in ("queued", "running"):
        time.sleep(0.1)
    client_s = time.perf_counter() - t0
    ran = (j["finished"] - j["started"]) if j.get("started") and j.get("finished") else None
    return {"status": j["status"], "error_type": j.get("error_type"), "error": j.get("error"),
            "progress": round(j.get("progress") or 0.0, 3), "stopped_after_s": None if ran is None else round(ran, 1),
            "client_s": round(client_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=20.0, help="HEADLENS_JOB_TIMEOUT_S of the service")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    limit = 2.0 if a.smoke else a.limit
    bodies = dict(list(BODIES.items())[:1]) if a.smoke else BODIES
    cache = os.environ.get("HEADLENS_CACHE_DIR") or tempfile.mkdtemp(prefix="bench-deadline-")
    proc, url = serve(limit, cache)
    rows: list[dict[str, Any]] = []
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            for name, extra in bodies.items():
                r = {"body": name, "limit_s": limit, **run_job(c, {**BASE, **extra})}
                rows.append(r)
                print(json.dumps(r), flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    if a.smoke:
        r = rows[0]
        assert r["status"] == "error" and r["error_type"] == "JobTimeLimit", r
        print(f"smoke: a site job with m=5000 under a {limit:g} s limit ended with the time-limit error after "
              f"{r['stopped_after_s']} s")
        return
    print(f"\n| site body | HEADLENS_JOB_TIMEOUT_S | stopped after (server) | POST to end (client) | progress | status |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['body']} | {limit:g} s | {r['stopped_after_s']} s | {r['client_s']} s | {r['progress']} | "
              f"{r['status']}{' (' + r['error_type'] + ')' if r.get('error_type') else ''} |")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
