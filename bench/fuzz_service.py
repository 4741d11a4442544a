"""Fuzz the service's POST /jobs, POST /tasks/upload and the saved-tensor routes with many generated inputs (the CI
test runs a few hundred).

    python bench/fuzz_service.py [--jobs 5000] [--uploads 2000] [--tensors 3000] [--seed 0]
    python bench/fuzz_service.py --smoke    # 30 bodies, 10 files, 20 tensor cases (the CI test)

Prints the counts by status code, the largest answer, whether any answer was a 5xx or over 64 KB, and the files
the service opened outside its cache folder and its code (an audit hook on every `open`; expected: none).
The runner does not compute (the target is admission and validation); for a job whose `load` names a stored
tensor it reads and checks that file, as a job would. The tensor phase: the kinds that read or train tensors
(site, ltv, ltv_train, site_transfer, methods, ltv_tasks) with `load` paths, traversals, ids and garbage;
POST /tensors with sound and mutated files (raw and multipart); GET /tensors/{id} with odd ids.
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
from fuzz_bodies import LOADS, job_bodies, tensor_bodies, tensor_files, uploads, valid_tensor_file  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MAX_ANSWER = 64 * 1024
_OPENED: list[str] = []
_WATCH = [False]


def _hook(event: str, args: tuple) -> None:
    if _WATCH[0] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


def outside(cache: str) -> list[str]:
    """Opened paths (`..` resolved, links not followed) outside the cache folder, the repository and Python."""
    roots = {f(p) for p in (cache, str(Path(__file__).resolve().parents[1]), sys.prefix, sys.base_prefix, *sys.path)
             if p for f in (os.path.realpath, os.path.abspath)}
    return sorted({p for p in _OPENED if not any(os.path.abspath(p) == r or os.path.abspath(p).startswith(r + os.sep)
                                                 for r in roots)})


def read_load(kind: str, params: dict, progress) -> dict:
    """The fuzz runner: no computation, but a `load` that names a stored tensor is read and checked."""
    from backend.analysis.primitives.saved import inspect
    from backend.tensor_store import default_store

    if isinstance(params.get("load"), str):
        inspect(default_store().get(params["load"]), "tensor")
    return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--uploads", type=int, default=2000)
    ap.add_argument("--tensors", type=int, default=3000, help="cases of each tensor route")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="30 bodies and 10 files (seconds)")
    a = ap.parse_args()
    if a.smoke:
        a.jobs, a.uploads, a.tensors = 30, 10, 20
    cache = os.environ["HEADLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="headlens-fuzz-")
    routes = ("jobs", "uploads", "tensor jobs", "tensor uploads", "tensor downloads")
    codes: dict[str, collections.Counter] = {r: collections.Counter() for r in routes}
    worst = {r: 0 for r in routes}
    bad: list[str] = []
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
        _WATCH[0] = True  # from here on, every file the service opens is recorded
        common = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))

        @seed(a.seed)
        @settings(max_examples=a.jobs, **common)
        @given(body=job_bodies())
        def jobs(body):
            r = c.post("/jobs", content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"})
            codes["jobs"][r.status_code] += 1
            worst["jobs"] = max(worst["jobs"], len(r.content))
            if r.status_code >= 500 or len(r.content) > MAX_ANSWER:
                bad.append(f"POST /jobs {r.status_code} ({len(r.content)} bytes): {r.text[:300]}")

        @seed(a.seed)
        @settings(max_examples=a.uploads, **common)
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
        @settings(max_examples=a.tensors, **common)
        @given(body=tensor_bodies(ids))
        def tensor_jobs(body):
            seen("tensor jobs", c.post("/jobs", content=json.dumps(body, allow_nan=True, default=str),
                                       headers={"content-type": "application/json"}), "POST /jobs (load)")

        @seed(a.seed)
        @settings(max_examples=a.tensors, **common)
        @given(data=tensor_files(), multipart=st.booleans())
        def tensor_ups(data, multipart):
            r = (c.post("/tensors", files={"file": ("v.safetensors", data)}) if multipart
                 else c.post("/tensors", content=data, headers={"content-type": "application/octet-stream"}))
            seen("tensor uploads", r, "POST /tensors")

        @seed(a.seed)
        @settings(max_examples=a.tensors, **common)
        @given(name=st.one_of(st.sampled_from(LOADS + list(ids)), st.text(max_size=80)))
        def tensor_gets(name):
            from urllib.parse import quote

            seen("tensor downloads", c.get("/tensors/" + quote(name, safe="")), "GET /tensors/{id}")

        jobs()
        ups()
        tensor_jobs()
        tensor_ups()
        tensor_gets()
        for _ in range(200):  # the jobs admitted: let the runner read their tensors
            if not [j for j in c.get("/jobs").json() if j["status"] in ("queued", "running")]:
                break
            time.sleep(0.05)
        _WATCH[0] = False
        alive = c.get("/health").json().get("status") == "ok"
        jobs_5xx = [j for j in c.get("/jobs").json() if (j.get("error") or "").startswith("internal error")]
    names = {"jobs": "POST /jobs", "uploads": "POST /tasks/upload", "tensor jobs": "POST /jobs with load (tensor kinds)",
             "tensor uploads": "POST /tensors", "tensor downloads": "GET /tensors/{id}"}
    for r in routes:
        print(f"{sum(codes[r].values())} {names[r]}: {dict(sorted(codes[r].items()))}; largest error answer "
              f"{worst[r]} bytes")
    read = outside(cache)
    print(f"5xx or answers over 64 KB: {len(bad)}; jobs failing with an internal error: {len(jobs_5xx)}; files opened "
          f"outside the cache and the code: {len(read)}; service alive at the end: {alive}; {time.time() - t0:.0f} s")
    for line in bad[:20] + [f"internal error: {j['error'][:300]}" for j in jobs_5xx[:10]] + read[:20]:
        print("  ", line)
    sys.exit(1 if bad or jobs_5xx or read or not alive else 0)


if __name__ == "__main__":
    main()
