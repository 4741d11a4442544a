"""Fuzz the service's POST /jobs and POST /tasks/upload with many generated inputs (the CI test runs a few hundred).

    python bench/fuzz_service.py [--jobs 5000] [--uploads 2000] [--seed 0]
    python bench/fuzz_service.py --smoke    # 30 bodies and 10 files (the CI test)

Prints the counts by status code, the largest answer, and whether any answer was a 5xx or over 64 KB.
The runner does not compute (the target is admission and upload validation).
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
from fuzz_bodies import job_bodies, uploads  # noqa: E402

MAX_ANSWER = 64 * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--uploads", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="30 bodies and 10 files (seconds)")
    a = ap.parse_args()
    if a.smoke:
        a.jobs, a.uploads = 30, 10
    os.environ["HEADLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="headlens-fuzz-")
    codes: dict[str, collections.Counter] = {"jobs": collections.Counter(), "uploads": collections.Counter()}
    worst = {"jobs": 0, "uploads": 0}
    bad: list[str] = []
    t0 = time.time()
    with TestClient(create_app(runner=LocalJobRunner(lambda kind, params, progress: {})),
                    raise_server_exceptions=False) as c:
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

        jobs()
        ups()
        alive = c.get("/health").json().get("status") == "ok"
    print(f"{sum(codes['jobs'].values())} POST /jobs: {dict(sorted(codes['jobs'].items()))}; largest answer "
          f"{worst['jobs']} bytes")
    print(f"{sum(codes['uploads'].values())} POST /tasks/upload: {dict(sorted(codes['uploads'].items()))}; largest "
          f"answer {worst['uploads']} bytes")
    print(f"5xx or answers over 64 KB: {len(bad)}; service alive at the end: {alive}; {time.time() - t0:.0f} s")
    for line in bad[:20]:
        print("  ", line)
    sys.exit(1 if bad or not alive else 0)


if __name__ == "__main__":
    main()
