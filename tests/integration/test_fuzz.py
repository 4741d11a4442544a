"""Fuzzing POST /jobs and POST /tasks/upload (issue 14) and the saved-tensor routes (issue 18) with generated
inputs: no 5xx, no answer over 64 KB, the service alive at the end. A few hundred cases here; bench/fuzz_service.py
runs many more, and counts the files the service opens outside its cache."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from backend.service.app import create_app  # noqa: E402
from backend.service.jobs import LocalJobRunner  # noqa: E402
from fuzz_bodies import (LOADS, admission_bodies, job_bodies, tensor_bodies, tensor_files, uploads,  # noqa: E402
                         valid_tensor_file)
from hypothesis import strategies as st  # noqa: E402

MAX_ANSWER = 64 * 1024


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """The real app, with a runner that does not compute (the target is admission, not the analyses)."""
    import os

    os.environ["HEADLENS_CACHE_DIR"] = str(tmp_path_factory.mktemp("fuzz-cache"))
    with TestClient(create_app(runner=LocalJobRunner(lambda job, progress: {})),
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


@pytest.fixture(scope="module")
def stored(client):
    """Two sound tensor files, uploaded: ids a fuzzed `load` may name."""
    return tuple(client.post("/tensors", content=valid_tensor_file(k)).json()["id"] for k in ("ltv", "site"))


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_post_jobs_with_load(client, stored, data):
    body = data.draw(tensor_bodies(stored))
    r = client.post("/jobs", content=json.dumps(body, allow_nan=True, default=str),
                    headers={"content-type": "application/json"})
    assert r.status_code < 500 and len(r.content) <= MAX_ANSWER, (body, r.text[:500])
    if isinstance(body.get("load"), str) and body["load"] not in stored:
        assert r.status_code >= 400  # a path, or an id of nothing stored, is never admitted


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=tensor_files(), multipart=st.booleans())
def test_post_tensors(client, data, multipart):
    r = (client.post("/tensors", files={"file": ("v.safetensors", data)}) if multipart
         else client.post("/tensors", content=data, headers={"content-type": "application/octet-stream"}))
    assert r.status_code in (200, 413, 422) and len(r.content) <= MAX_ANSWER, r.text[:500]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(name=st.one_of(st.sampled_from(LOADS), st.text(max_size=80)))
def test_get_tensors(client, name):
    from urllib.parse import quote

    r = client.get("/tensors/" + quote(name, safe=""))
    assert r.status_code in (404, 405) and len(r.content) <= MAX_ANSWER, r.text[:300]


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(body=st.one_of(job_bodies(), admission_bodies()))
def test_estimate_and_submit_give_the_same_verdict(client, body):
    """Issue 24: one admission. POST /jobs/estimate and POST /jobs answer the same body alike: accepted (200 with
    `admitted`, 202), or the same 4xx (an estimate over the work limit: its `refusal_status`)."""
    text = json.dumps(body, allow_nan=True, default=str)
    headers = {"content-type": "application/json"}
    e = client.post("/jobs/estimate", content=text, headers=headers)
    r = client.post("/jobs", content=text, headers=headers)
    if r.status_code == 202:
        client.delete(f"/jobs/{r.json()['id']}")
    verdict = e.status_code if e.status_code != 200 else (
        "accepted" if e.json()["admitted"] else e.json()["refusal_status"])
    assert verdict == ("accepted" if r.status_code == 202 else r.status_code), (body, e.text[:300], r.text[:300])
