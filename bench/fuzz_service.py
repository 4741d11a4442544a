"""Fuzz the service's POST /jobs, POST /tasks/upload and the saved-tensor routes with many generated inputs (the CI
test runs a few hundred).

    python bench/fuzz_service.py [--jobs 5000] [--uploads 2000] [--tensors 3000] [--pairs 5000] [--seed 0]
    python bench/fuzz_service.py --smoke    # 30 bodies, 10 files, 20 tensor cases, 30 pairs (the CI test)
    python bench/fuzz_service.py --jobs 0 --uploads 0 --tensors 0 --pairs 5000    # one phase only (0 skips one)

Prints the counts by status code, the largest answer, whether any answer was a 5xx or over 64 KB, and the files
the service opened outside its cache folder and its code (an audit hook on every `open`; expected: none).
The runner does not compute (the target is admission and validation); for a job whose `load` names a stored
tensor it reads and checks that file, as a job would. The tensor phase: the kinds that read or train tensors
(site, ltv, ltv_train, site_transfer, methods, ltv_tasks) with `load` paths, traversals, ids and garbage;
POST /tensors with sound and mutated files (raw and multipart); GET /tensors/{id} with odd ids.
The pairs phase (issue 24): each body (half the generic ones, half plausible ones near the model's heads and layers,
the limits and the task names: `fuzz_bodies.admission_bodies`) goes to POST /jobs/estimate and then POST /jobs; their
verdicts must be the same: accepted (202; an estimate of 200 with `admitted`) or the same 4xx status (an estimate's
`admitted: false` counts as its `refusal_status`). Accepted jobs are withdrawn at once (DELETE). The hub is off
(HF_HUB_OFFLINE=1 unless set): nothing here reaches the network.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SMOKE = "--smoke" in sys.argv[1:]
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before huggingface_hub is imported: a hub id never goes online
try:
    from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
except ImportError:  # a dev dependency (requirements-dev.txt)
    if not SMOKE:
        raise
    print("smoke: skipped (hypothesis is not installed: pip install -r requirements-dev.txt)")
    sys.exit(0)
from starlette.testclient import TestClient  # noqa: E402

from backend.service.app import create_app  # noqa: E402
from backend.service.jobs import LocalJobRunner  # noqa: E402
from fuzz_bodies import (LOADS, admission_bodies, job_bodies, tensor_bodies, tensor_files, uploads,  # noqa: E402
                         valid_tensor_file)
from hypothesis import strategies as st  # noqa: E402

MAX_ANSWER = 64 * 1024
_OPENED: list[str] = []
_WATCH = [False]


def _hook(event: str, args: tuple) -> None:
    if _WATCH[0] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


SYSTEM_READS = ("/proc/meminfo", "/proc/stat", "/sys/fs/cgroup/")  # the memory check at admission (memory_fit.py)


def outside(cache: str) -> list[str]:
    """Opened paths (`..` resolved, links not followed) outside the cache folder, the repository and Python, less
    the memory readings of admission's memory check (`SYSTEM_READS`)."""
    roots = {f(p) for p in (cache, str(Path(__file__).resolve().parents[1]), sys.prefix, sys.base_prefix, *sys.path)
             if p for f in (os.path.realpath, os.path.abspath)}
    return sorted({p for p in _OPENED if not any(os.path.abspath(p) == r or os.path.abspath(p).startswith(r + os.sep)
                                                 for r in roots)
                   and not any(os.path.abspath(p) == s or (s.endswith("/") and os.path.abspath(p).startswith(s))
                               for s in SYSTEM_READS)})


def read_load(job, progress) -> dict:
    """The fuzz executor: no computation, but a `load` that names a stored tensor (of the admitted `job`'s params)
    is read and checked."""
    from backend.analysis.primitives.saved import inspect
    from backend.store.tensor_store import default_store

    if isinstance(job.params.get("load"), str):
        inspect(default_store().get(job.params["load"]), "tensor")
    return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--uploads", type=int, default=2000)
    ap.add_argument("--tensors", type=int, default=3000, help="cases of each tensor route")
    ap.add_argument("--pairs", type=int, default=5000, help="bodies sent to both POST /jobs/estimate and POST /jobs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="30 bodies, 10 files, 20 tensor cases, 30 pairs (seconds)")
    a = ap.parse_args()
    if a.smoke:
        a.jobs, a.uploads, a.tensors, a.pairs = 30, 10, 20, 30
    cache = os.environ["HEADLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="headlens-fuzz-")
    routes = ("jobs", "uploads", "tensor jobs", "tensor uploads", "tensor downloads", "estimates",
              "paired jobs")
    codes: dict[str, collections.Counter] = {r: collections.Counter() for r in routes}
    worst = {r: 0 for r in routes}
    bad: list[str] = []
    verdicts: collections.Counter = collections.Counter()  # (estimate's verdict, POST /jobs's), over the pairs
    differ: list[str] = []
    t0 = time.time()
    sys.addaudithook(_hook)

    def seen(route: str, r, what: str) -> None:
        codes[route][r.status_code] += 1
        worst[route] = max(worst[route], len(r.content) if r.status_code != 200 or route != "tensor downloads" else 0)
        if r.status_code >= 500 or (len(r.content) > MAX_ANSWER and route != "tensor downloads"):
            bad.append(f"{what} {r.status_code} ({len(r.content)} bytes): {r.text[:300]}")

    with TestClient(create_app(runner=LocalJobRunner(read_load)), raise_server_exceptions=False) as c:
        ids = tuple(c.post("/tensors", content=valid_tensor_file(k)).json()["id"] for k in ("ltv", "site"))
        import mimetypes

        mimetypes.init()  # the standard library reads /etc/mime.types once, whatever the input: before watching
        try:  # filelock (under huggingface_hub) reads the boot id from /proc once, on import: before watching
            import filelock._identity  # noqa: F401
        except ImportError:
            pass
        _WATCH[0] = True  # from here on, every file the service opens is recorded
        common = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))

        @seed(a.seed)
        @settings(max_examples=max(a.jobs, 1), **common)
        @given(body=job_bodies())
        def jobs(body):
            r = c.post("/jobs", content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"})
            codes["jobs"][r.status_code] += 1
            worst["jobs"] = max(worst["jobs"], len(r.content))
            if r.status_code >= 500 or len(r.content) > MAX_ANSWER:
                bad.append(f"POST /jobs {r.status_code} ({len(r.content)} bytes): {r.text[:300]}")

        @seed(a.seed)
        @settings(max_examples=max(a.uploads, 1), **common)
        @given(upload=uploads())
        def ups(upload):
            name, data = upload
            for r in (c.post("/tasks/upload", files={"file": (name, data)}),
                      c.post("/tasks/upload", json={"filename": name, "content": data.decode("utf-8", "replace")})):
                codes["uploads"][r.status_code] += 1
                worst["uploads"] = max(worst["uploads"], len(r.content))
                if r.status_code >= 500 or len(r.content) > MAX_ANSWER:
                    bad.append(f"POST /tasks/upload {r.status_code} ({len(r.content)} bytes): {r.text[:300]}")

        @seed(a.seed)
        @settings(max_examples=max(a.tensors, 1), **common)
        @given(body=tensor_bodies(ids))
        def tensor_jobs(body):
            seen("tensor jobs", c.post("/jobs", content=json.dumps(body, allow_nan=True, default=str),
                                       headers={"content-type": "application/json"}), "POST /jobs (load)")

        @seed(a.seed)
        @settings(max_examples=max(a.tensors, 1), **common)
        @given(data=tensor_files(), multipart=st.booleans())
        def tensor_ups(data, multipart):
            r = (c.post("/tensors", files={"file": ("v.safetensors", data)}) if multipart
                 else c.post("/tensors", content=data, headers={"content-type": "application/octet-stream"}))
            seen("tensor uploads", r, "POST /tensors")

        @seed(a.seed)
        @settings(max_examples=max(a.tensors, 1), **common)
        @given(name=st.one_of(st.sampled_from(LOADS + list(ids)), st.text(max_size=80)))
        def tensor_gets(name):
            from urllib.parse import quote

            seen("tensor downloads", c.get("/tensors/" + quote(name, safe="")), "GET /tensors/{id}")

        @seed(a.seed)
        @settings(max_examples=max(a.pairs, 1), **common)
        @given(body=st.one_of(job_bodies(), admission_bodies()))
        def pairs(body):
            text = json.dumps(body, allow_nan=True, default=str)
            e = c.post("/jobs/estimate", content=text, headers={"content-type": "application/json"})
            seen("estimates", e, "POST /jobs/estimate")
            r = c.post("/jobs", content=text, headers={"content-type": "application/json"})
            seen("paired jobs", r, "POST /jobs")
            if r.status_code == 202:
                c.delete(f"/jobs/{r.json()['id']}")  # withdrawn: the queue stays empty, nothing waits on it
            verdict = verdict_of_estimate(e)
            got = "accepted" if r.status_code == 202 else r.status_code
            verdicts[(verdict, got)] += 1
            if verdict != got:
                differ.append(f"estimate {verdict} vs POST /jobs {got} for {text[:200]}: {e.text[:150]} | "
                              f"{r.text[:150]}")

        for phase, n in ((jobs, a.jobs), (ups, a.uploads), (tensor_jobs, a.tensors), (tensor_ups, a.tensors),
                         (tensor_gets, a.tensors), (pairs, a.pairs)):
            if n > 0:
                phase()
        for _ in range(200):  # the jobs admitted: let the runner read their tensors
            if not [j for j in c.get("/jobs").json() if j["status"] in ("queued", "running")]:
                break
            time.sleep(0.05)
        _WATCH[0] = False
        alive = c.get("/health").json().get("status") == "ok"
        jobs_5xx = [j for j in c.get("/jobs").json() if (j.get("error") or "").startswith("internal error")]
    names = {"jobs": "POST /jobs", "uploads": "POST /tasks/upload", "tensor jobs": "POST /jobs with load (tensor kinds)",
             "tensor uploads": "POST /tensors", "tensor downloads": "GET /tensors/{id}",
             "estimates": "POST /jobs/estimate", "paired jobs": "POST /jobs of the same bodies"}
    for r in routes:
        print(f"{sum(codes[r].values())} {names[r]}: {dict(sorted(codes[r].items()))}; largest error answer "
              f"{worst[r]} bytes")
    if a.pairs > 0:
        same = sum(n for (x, y), n in verdicts.items() if x == y)
        by = collections.Counter()
        for (x, _), n in verdicts.items():
            by[str(x)] += n
        print(f"{sum(verdicts.values())} bodies to POST /jobs/estimate and POST /jobs: the same verdict for {same}, "
              f"different for {len(differ)}; verdicts: {dict(sorted(by.items()))}")
    read = outside(cache)
    print(f"5xx or answers over 64 KB: {len(bad)}; jobs failing with an internal error: {len(jobs_5xx)}; files opened "
          f"outside the cache and the code: {len(read)}; service alive at the end: {alive}; {time.time() - t0:.0f} s")
    for line in bad[:20] + [f"internal error: {j['error'][:300]}" for j in jobs_5xx[:10]] + read[:20] + differ[:20]:
        print("  ", line)
    sys.exit(1 if bad or jobs_5xx or read or differ or not alive else 0)


def verdict_of_estimate(r) -> str | int:
    """`accepted`, or the 4xx status POST /jobs would answer: the estimate's own status, or for an estimate over the
    work limit (200, `admitted: false`) its `refusal_status`."""
    if r.status_code != 200:
        return r.status_code
    body = r.json()
    return "accepted" if body.get("admitted", True) else body.get("refusal_status") or "refused (no status)"


if __name__ == "__main__":
    main()
