"""Fuzzing POST /jobs and POST /tasks/upload with generated inputs (issue 14): no 5xx, no answer over 64 KB,
the service alive at the end. A few hundred cases here; bench/fuzz_service.py runs many more."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from backend.service.app import create_app  # noqa: E402
from backend.service.jobs import LocalJobRunner  # noqa: E402
from fuzz_bodies import job_bodies, uploads  # noqa: E402

MAX_ANSWER = 64 * 1024


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """The real app, with a runner that does not compute (the target is admission, not the analyses)."""
    import os

    os.environ["HEADLENS_CACHE_DIR"] = str(tmp_path_factory.mktemp("fuzz-cache"))
    with TestClient(create_app(runner=LocalJobRunner(lambda kind, params, progress: {})),
                    raise_server_exceptions=False) as c:
        yield c
        assert c.get("/health").json()["status"] == "ok"


SETTINGS = settings(max_examples=250, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


@SETTINGS
@given(body=job_bodies())
def test_post_jobs(client, body):
    # sent as raw JSON text (NaN / Infinity included, as a careless client would send them)
    r = client.post("/jobs", content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"})
    assert r.status_code < 500, (body, r.text[:500])
    assert len(r.content) <= MAX_ANSWER


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(upload=uploads())
def test_post_uploads(client, upload):
    name, data = upload
    r = client.post("/tasks/upload", files={"file": (name, data)})
    assert r.status_code < 500, (name, data[:200], r.text[:500])
    assert len(r.content) <= MAX_ANSWER
    r = client.post("/tasks/upload", json={"filename": name, "content": data.decode("utf-8", "replace")})
    assert r.status_code < 500 and len(r.content) <= MAX_ANSWER
