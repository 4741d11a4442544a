"""Load and faults against a real `python -m backend serve` (GitHub issue 14's probe, as a benchmark).

    python bench/bench_faults.py                 # all three scenarios, ~5 minutes on 2 CPU cores
    python bench/bench_faults.py --kills 9 --distinct 100 --identical 200
    python bench/bench_faults.py --smoke         # (a) with 4 identical and 2 distinct jobs (the CI test)

Each server runs on 127.0.0.1 on a free port with its own HEADLENS_CACHE_DIR (a temporary folder).
(a) load: `--identical` concurrent identical POST /jobs -> one job, one computation; then `--distinct`
    distinct jobs (kind icl, model `default`, task syn-sentiment, a different seed each) all finish, and a
    sample of them recomputed by a fresh server on an empty cache gives the same numbers;
(b) kill -9: the server is killed mid-job `--kills` times (with short jobs finishing around the kill),
    restarted on the same cache; then the cache must read cleanly (SQLite integrity check, every entry
    decodes), (a)'s results must still be there (cache hits), and every killed job, resubmitted, completes;
(c) two servers on one cache folder, the same jobs sent to both: each key is computed once;
(d) bounds: a 100 MB POST /jobs body (declared, then chunked) is a short 413 and the server's RSS does not
    move; `--uploads` distinct 4.5 MB task uploads keep RSS and the upload folder bounded (memory LRU,
    HEADLENS_UPLOAD_QUOTA_MB), and the oldest upload is still usable or a clear 404.
The figures are printed, and with --json written as one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# --smoke is the CI test (tests/integration/test_bench_smoke.py), on machines as busy as they come: there every wait of this
# script is bounded only by the tests' hang guard (HEADLENS_TEST_HANG_S, tests/hang.py), not by its own limits
HANG_S: float | None = None


def waited(seconds: float) -> float:
    """How long a wait of `seconds` may last: as long as the hang guard under --smoke."""
    return max(seconds, HANG_S) if HANG_S else seconds


def smoke_waits() -> None:
    """--smoke: waits bounded by the tests' hang guard, here."""
    global HANG_S
    sys.path.insert(0, str(REPO / "tests"))
    from hang import HANG_S as hang_s

    HANG_S = hang_s


VOLATILE = ("seconds", "cache_hit", "timings", "elapsed")  # result fields that differ between identical runs


def job(seed: int, shots: list[int] | None = None, prompts: int = 4) -> dict[str, Any]:
    return {"kind": "icl", "model": "default", "task": "syn-sentiment", "shots": shots or [0, 1],
            "prompts": prompts, "seed": seed}


def stable(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in VOLATILE}


class Server:
    """`python -m backend serve` on a free port of 127.0.0.1, on `cache` as its cache folder."""

    def __init__(self, cache: Path, log: Path, env: dict[str, str] | None = None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log.open("ab")
        full_env = {**os.environ, "HEADLENS_CACHE_DIR": str(cache), "HEADLENS_MAX_QUEUE": "512", **(env or {})}
        full_env.pop("HEADLENS_TOKEN", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "backend", "serve", "--port", str(self.port),
                                      "--log-level", "warning"], cwd=REPO, env=full_env,
                                     stdout=self.log, stderr=self.log)
        self.http = httpx.Client(base_url=self.url, timeout=waited(60),
                                 limits=httpx.Limits(max_connections=256, max_keepalive_connections=256))
        t0 = time.perf_counter()
        while True:
            try:
                if self.http.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see {log}")
            if time.perf_counter() - t0 > waited(120):
                raise RuntimeError(f"the server did not come up in {waited(120):g} s")
            time.sleep(0.05)
        self.startup = time.perf_counter() - t0

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        for _ in range(600):
            r = self.send("POST", "/jobs", json=body)  # sent again, the same body is the same job
            if r.status_code != 429:  # a full queue: try again shortly
                break
            time.sleep(0.1)
        if r.status_code != 202:
            raise RuntimeError(f"POST /jobs {body}: {r.status_code} {r.text[:300]}")
        return r.json()

    def send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """The request, sent again on a connection the server dropped as it went out (uvicorn closes a keep-alive
        connection idle for 5 s, and on a busy machine this client can sit idle that long); for requests that may
        be repeated: a GET, or a POST /jobs (an identical body is the same job)."""
        for attempt in range(3):
            try:
                return self.http.request(method, path, **kw)
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError):
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def get(self, path: str) -> httpx.Response:
        return self.send("GET", path)

    def wait(self, job_id: str, timeout: float = 900) -> dict[str, Any]:
        deadline = time.monotonic() + waited(timeout)
        while time.monotonic() < deadline:
            j = self.get(f"/jobs/{job_id}").json()
            if j["status"] not in ("queued", "running"):
                return j
            time.sleep(0.05)
        raise RuntimeError(f"job {job_id} did not finish in {timeout} s")

    def run(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.wait(self.submit(body)["id"])

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.http.close()
        self.log.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.http.close()
        self.log.close()


def check_result(j: dict[str, Any], body: dict[str, Any]) -> bool:
    """A finished icl job whose result matches its request: one accuracy per shot count, within [0, 1]."""
    r = j.get("result") or {}
    acc = r.get("accuracy") or []
    return (j["status"] == "done" and r.get("shots") == body["shots"] and len(acc) == len(body["shots"])
            and all(a is not None and 0 <= a <= 1 for a in acc)
            and (r.get("params") or {}).get("seed", body["seed"]) == body["seed"])


def cache_health(cache: Path) -> dict[str, Any]:
    """SQLite integrity check of cache.db, and every entry read through ResultCache (refused rows counted)."""
    from backend.store.cache import ResultCache

    with sqlite3.connect(cache / "cache.db") as con:
        integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
        modes = dict(con.execute("SELECT mode, COUNT(*) FROM Cache GROUP BY mode").fetchall())
    rc = ResultCache(cache)
    keys = [k for k in rc.dc.iterkeys()]
    readable = sum(rc.get(k) is not None for k in keys)
    rc.close()
    locks = cache / "locks"
    return {"integrity": integrity, "entries": len(keys), "readable": readable, "row_modes": modes,
            "lock_files": len(list(locks.iterdir())) if locks.is_dir() else 0}


# -- (a) load ------------------------------------------------------------------------------------------------
def scenario_load(cache: Path, logs: Path, identical: int, distinct: int, sample: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    srv = Server(cache, logs / "a.log")
    out["startup_s"] = round(srv.startup, 2)
    try:
        body = job(seed=10_000, shots=[0, 1, 2], prompts=8)
        barrier = threading.Barrier(identical)

        def post_identical(_: int) -> tuple[str, float]:
            barrier.wait()
            t = time.perf_counter()
            j = srv.submit(body)
            return j["id"], time.perf_counter() - t

        t0 = time.perf_counter()
        with ThreadPoolExecutor(identical) as ex:
            answers = list(ex.map(post_identical, range(identical)))
        submit_s = time.perf_counter() - t0
        ids = {a for a, _ in answers}
        first = srv.wait(next(iter(ids)))
        again = srv.submit(body)  # the same request once it is done: the same job
        out["identical"] = {"posts": identical, "jobs": len(ids), "computed": int(first["result"]["cache_hit"] is False),
                            "submit_all_s": round(submit_s, 2),
                            "slowest_post_s": round(max(s for _, s in answers), 3),
                            "total_s": round(time.perf_counter() - t0, 2), "correct": check_result(first, body),
                            "same_job_after_done": again["id"] in ids}

        bodies = [job(seed=s) for s in range(distinct)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as ex:
            submitted = list(ex.map(srv.submit, bodies))
        submit_s = time.perf_counter() - t0
        done = [srv.wait(j["id"]) for j in submitted]
        total = time.perf_counter() - t0
        out["distinct"] = {"jobs": distinct, "unique_ids": len({j["id"] for j in submitted}),
                           "done": sum(j["status"] == "done" for j in done),
                           "correct": sum(check_result(j, b) for j, b in zip(done, bodies)),
                           "computed": sum(j["result"]["cache_hit"] is False for j in done if j["result"]),
                           "submit_all_s": round(submit_s, 2), "total_s": round(total, 2),
                           "jobs_per_s": round(distinct / total, 2)}
        results = {b["seed"]: j["result"] for j, b in zip(done, bodies)}
        results[body["seed"]] = first["result"]
    finally:
        srv.stop()

    # recompute a sample on a fresh server with an empty cache: the same numbers
    picks = random.Random(0).sample(range(distinct), min(sample, distinct))
    with tempfile.TemporaryDirectory() as fresh:
        ref = Server(Path(fresh), logs / "a-ref.log")
        try:
            same = sum(stable(ref.run(job(seed=s))["result"]) == stable(results[s]) for s in picks)
            same += stable(ref.run(body)["result"]) == stable(results[body["seed"]])
        finally:
            ref.stop()
    out["recomputed_identically"] = f"{same}/{len(picks) + 1}"
    return out


# -- (b) kill -9 ---------------------------------------------------------------------------------------------
def scenario_kills(cache: Path, logs: Path, kills: int, distinct: int) -> dict[str, Any]:
    rng = random.Random(1)
    before = cache_health(cache)
    killed: list[dict[str, Any]] = []
    events = []
    for i in range(kills):
        srv = Server(cache, logs / "b.log")
        long = job(seed=50_000 + i, shots=[0, 1, 2, 4], prompts=24)
        short = [job(seed=60_000 + 10 * i + k) for k in range(3)]
        jl = srv.submit(long)
        for b in short:  # queued behind it: their cache writes happen around the kill
            srv.submit(b)
        while True:  # mid-job: running, with some progress
            j = srv.get(f"/jobs/{jl['id']}").json()
            if j["status"] == "running" and j["progress"] > 0 or j["status"] not in ("queued", "running"):
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 1.5))
        state = srv.get(f"/jobs/{jl['id']}").json()
        srv.kill9()
        events.append({"status": state["status"], "progress": round(state["progress"], 2),
                       "startup_s": round(srv.startup, 2)})
        killed += [long, *short]

    srv = Server(cache, logs / "b.log")
    try:
        after = cache_health(cache)
        t0 = time.perf_counter()
        redo = [srv.run(b) for b in killed]
        hits = [srv.run(job(seed=s)) for s in range(0, distinct, max(1, distinct // 10))]
        out = {"kills": kills, "killed_at": events, "cache_before": before, "cache_after_kills": after,
               "resubmitted": len(killed), "resubmitted_done": sum(check_result(j, b) for j, b in zip(redo, killed)),
               "resubmit_s": round(time.perf_counter() - t0, 2),
               "earlier_results_still_cached": f"{sum(j['result']['cache_hit'] is True for j in hits)}/{len(hits)}",
               "cache_after_resubmit": cache_health(cache)}
    finally:
        srv.stop()
    return out


# -- (c) two servers, one cache ------------------------------------------------------------------------------
def scenario_two_servers(cache: Path, logs: Path, n: int) -> dict[str, Any]:
    a, b = Server(cache, logs / "c1.log"), Server(cache, logs / "c2.log")
    try:
        bodies = [job(seed=90_000 + s, shots=[0, 1, 2], prompts=8) for s in range(n)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(2) as ex:
            ja, jb = ex.map(lambda srv: [srv.submit(x)["id"] for x in bodies], (a, b))
        ra, rb = [a.wait(i) for i in ja], [b.wait(i) for i in jb]
        total = time.perf_counter() - t0
        computed = [int(x["result"]["cache_hit"] is False) + int(y["result"]["cache_hit"] is False)
                    for x, y in zip(ra, rb)]
        return {"keys": n, "servers": 2, "jobs_done": sum(j["status"] == "done" for j in ra + rb),
                "computations": sum(computed), "keys_computed_twice": sum(c > 1 for c in computed),
                "same_numbers_on_both": sum(stable(x["result"]) == stable(y["result"]) for x, y in zip(ra, rb)),
                "total_s": round(total, 2), "cache": cache_health(cache)}
    finally:
        a.stop()
        b.stop()


# -- (d) bounded memory and disk ------------------------------------------------------------------------------
def rss_mb(pid: int) -> int:
    return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) // 1024


def scenario_bounds(cache: Path, logs: Path, uploads: int) -> dict[str, Any]:
    srv = Server(cache, logs / "d.log")
    out: dict[str, Any] = {}
    try:
        out["rss_start_mb"] = rss_mb(srv.proc.pid)
        body = b'{"kind": "scores", "task": "' + b"x" * (100 << 20) + b'"}'
        for how, content in (("declared", body),
                             ("chunked", (body[i:i + (1 << 20)] for i in range(0, len(body), 1 << 20)))):
            t0 = time.perf_counter()
            try:
                r = srv.http.post("/jobs", content=content, headers={"content-type": "application/json"})
                out[f"100MB_body_{how}"] = {"status": r.status_code, "answer_bytes": len(r.content),
                                            "s": round(time.perf_counter() - t0, 2)}
            except httpx.HTTPError as e:  # the server may close before the client has sent it all
                out[f"100MB_body_{how}"] = {"client_error": type(e).__name__}
        out["rss_after_bodies_mb"] = rss_mb(srv.proc.pid)
        first = None
        t0 = time.perf_counter()
        for i in range(uploads):
            lines = "".join(f'{{"input": "u{i} word {j} some more text here", "output": "{j % 3}"}}\n'
                            for j in range(75_000))
            r = srv.http.post("/tasks/upload", files={"file": (f"t{i}.jsonl", lines.encode())})
            if r.status_code != 200:
                raise RuntimeError(f"upload {i}: {r.status_code} {r.text[:200]}")
            first = first or r.json()["id"]
        up = cache / "uploads"
        out["uploads"] = {"n": uploads, "mb_each": round(len(lines) / 2**20, 2),
                          "s": round(time.perf_counter() - t0, 1), "rss_after_mb": rss_mb(srv.proc.pid),
                          "disk_mb": round(sum(f.stat().st_size for f in up.iterdir()) / 2**20, 1),
                          "records_on_disk": len(list(up.iterdir()))}
        r = srv.http.post("/jobs", json={"kind": "scores", "task": first, "prompts": 2, "shots": 1})
        out["oldest_upload"] = {"status": r.status_code, "detail": (r.json().get("detail") or "")[:120]}
    finally:
        srv.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--identical", type=int, default=200)
    ap.add_argument("--distinct", type=int, default=100)
    ap.add_argument("--sample", type=int, default=5, help="distinct jobs recomputed on an empty cache")
    ap.add_argument("--kills", type=int, default=7)
    ap.add_argument("--shared", type=int, default=8, help="keys sent to both servers in (c)")
    ap.add_argument("--uploads", type=int, default=40, help="4.5 MB task uploads in (d)")
    ap.add_argument("--only", default="abcd", help="scenarios to run, e.g. `ab` or `d`")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--keep", action="store_true", help="keep the cache folders and logs")
    ap.add_argument("--smoke", action="store_true", help="scenario (a) only, with a handful of jobs (seconds)")
    a = ap.parse_args()
    if a.smoke:
        a.only, a.identical, a.distinct, a.sample = "a", 4, 2, 1
        smoke_waits()

    root = Path(tempfile.mkdtemp(prefix="headlens-faults-"))
    logs = root / "logs"
    logs.mkdir()
    figures: dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        runs = {"a": ("load", lambda: scenario_load(root / "cache-ab", logs, a.identical, a.distinct, a.sample)),
                "b": ("kill9", lambda: scenario_kills(root / "cache-ab", logs, a.kills, a.distinct)),
                "c": ("two_servers", lambda: scenario_two_servers(root / "cache-c", logs, a.shared)),
                "d": ("bounds", lambda: scenario_bounds(root / "cache-d", logs, a.uploads))}
        for letter in "abcd":
            if letter in a.only:
                name, run = runs[letter]
                figures[name] = run()
                print(json.dumps({name: figures[name]}, indent=1), flush=True)
    finally:
        figures["wall_s"] = round(time.perf_counter() - t0, 1)
        if a.json:
            Path(a.json).write_text(json.dumps(figures, indent=1))
        if a.keep:
            print(f"kept {root}")
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    print(f"wall time {figures['wall_s']} s")
    if a.smoke:  # the figures must say it worked
        load, n = figures["load"], a.sample + 1
        if not (load["identical"]["correct"] and load["distinct"]["correct"] == a.distinct
                and load["recomputed_identically"] == f"{n}/{n}"):
            raise SystemExit(f"smoke: scenario (a) did not come out right: {json.dumps(load)}")


if __name__ == "__main__":
    main()
