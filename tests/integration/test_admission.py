"""One admission for POST /jobs and POST /jobs/estimate (issue 24, items 3, 4 and 9): the same verdict for the same
body, a model that cannot load refused by both, fields that must fit the model's shape refused at submission from
its files (never inside the job), and a finished job whose saved tensors are gone computed again."""
from __future__ import annotations

from plain_job import submit

import http.server
import json
import threading
from typing import Any

import pytest
from starlette.testclient import TestClient

from backend.service.app import create_app
from backend.service.execute import outputs_present_in
from backend.service.jobs import LocalJobRunner
from hang import wait_until  # noqa: E402

BASE = {"model": "default", "task": "syn-antonym"}


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for var in ("HEADLENS_TOKEN", "HEADLENS_MODEL_ROOT", "HEADLENS_ALLOW_HUB", "HEADLENS_MAX_WORK",
                "HEADLENS_MAX_PROMPTS", "HEADLENS_MAX_SHOTS"):
        monkeypatch.delenv(var, raising=False)


def idle_client() -> TestClient:
    """The real app and admission, with a runner that computes nothing."""
    return TestClient(create_app(runner=LocalJobRunner(lambda job, progress: {})),
                      raise_server_exceptions=False)


def verdicts(c: TestClient, body: dict[str, Any]) -> tuple[tuple[int, str], tuple[int, str]]:
    """(status, detail) of POST /jobs/estimate and of POST /jobs for `body`."""
    e, j = c.post("/jobs/estimate", json=body), c.post("/jobs", json=body)
    return (e.status_code, e.json().get("detail", "")), (j.status_code, j.json().get("detail", ""))


# -- item 4: the same admission on both routes --------------------------------------------------------------------
REFUSED = [
    ({"kind": "findings", "model": "default", "tasks": ["nope"]}, 404, "unknown built-in task(s) ['nope']"),
    ({"kind": "findings", "model": "default", "tasks": ["upload:0123456789abcdef"]}, 404, "built-in task names"),
    ({"kind": "findings", "model": "default", "tasks": ["/etc/passwd"]}, 404, "unknown built-in task(s)"),
    ({"kind": "ltv_tasks", "model": "default", "tasks": ["syn-antonym", "nope"]}, 404, "['nope']"),
    ({"kind": "site_transfer", "model": "default", "tasks": ["/etc/passwd"]}, 404, "built-in task names"),
    ({"kind": "ltv_tasks", "model": "default", "tasks": ["syn-antonym"]}, 422, "at least two tasks"),
    ({"kind": "patching", "model": "/no/such/folder", "task": "syn-antonym"}, 404, "does not exist"),
]


@pytest.mark.parametrize("body,status,words", REFUSED, ids=[f"{b['kind']}-{i}" for i, (b, _, _) in
                                                             enumerate(REFUSED)])
def test_estimate_refuses_what_submit_refuses(body, status, words):
    with idle_client() as c:
        est, sub = verdicts(c, body)
    assert est == sub, (est, sub)
    assert sub[0] == status and words in sub[1], sub
    assert "/work" not in sub[1] and "Errno" not in sub[1]


def test_unknown_hub_id_is_refused_by_both_while_offline(monkeypatch):
    """The issue's `{"kind": "patching", "model": "nope"}`: with the hub off it cannot load, so no estimate on an
    invented 32-layer shape; with HEADLENS_ALLOW_HUB=0 a 403 from both."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    body = {"kind": "patching", "model": "nope", "task": "syn-antonym"}
    with idle_client() as c:
        est, sub = verdicts(c, body)
        assert est == sub and sub[0] == 404, sub
        assert "not in this server's Hugging Face cache" in sub[1] and "HF_HUB_OFFLINE" in sub[1]
        assert c.get("/jobs").json() == []  # nothing queued
    monkeypatch.setenv("HEADLENS_ALLOW_HUB", "0")
    with idle_client() as c:
        est, sub = verdicts(c, body)
    assert est == sub and sub[0] == 403 and "HEADLENS_ALLOW_HUB=0" in sub[1]


def test_hub_id_the_hub_does_not_know_is_refused(monkeypatch):
    """A reachable hub (a local server) that answers 404 for the id's config.json: 404 from both routes."""
    from backend.model import loading as models

    class NoSuchRepo(http.server.BaseHTTPRequestHandler):
        def _no(self) -> None:
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = _no  # noqa: N815

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NoSuchRepo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        import huggingface_hub.constants as hc

        monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)  # read once at import (conftest set it): online here
        models._hub_probe.clear()
        with idle_client() as c:
            est, sub = verdicts(c, {"kind": "scores", "model": "nobody/made-up-7f3a", "task": "syn-antonym"})
        assert est == sub and sub[0] == 404 and "no model 'nobody/made-up-7f3a' on the Hugging Face hub" in sub[1]
    finally:
        server.shutdown()
        server.server_close()
        models._hub_probe.clear()


def test_a_folder_of_an_unsupported_architecture_is_refused(tmp_path):
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mamba", "num_hidden_layers": 2,
                                                    "num_attention_heads": 2, "hidden_size": 8}))
    with idle_client() as c:
        est, sub = verdicts(c, {"kind": "scores", "model": str(folder), "task": "syn-antonym"})
    assert est == sub and sub[0] == 422 and "model_type 'mamba' is not supported" in sub[1]


def test_work_limit_is_the_one_difference(monkeypatch):
    """Over the work limit: POST /jobs refuses (422); the estimate answers, with the same refusal and status."""
    monkeypatch.setenv("HEADLENS_MAX_WORK", "10")
    body = {"kind": "scores", **BASE, "prompts": 50}
    with idle_client() as c:
        e = c.post("/jobs/estimate", json=body)
        j = c.post("/jobs", json=body)
    assert e.status_code == 200 and e.json()["admitted"] is False
    assert j.status_code == e.json()["refusal_status"] == 422 and j.json()["detail"] == e.json()["refusal"]


def test_the_other_checks_come_before_the_work_limit(monkeypatch):
    """A body over the work limit AND bad otherwise gets the same 422 from both routes (not the work refusal from
    one and the field's from the other)."""
    monkeypatch.setenv("HEADLENS_MAX_WORK", "10")
    with idle_client() as c:
        est, sub = verdicts(c, {"kind": "ablation_curves", **BASE, "ks": [33], "prompts": 50})
    assert est == sub and sub[0] == 422 and sub[1].startswith("ks: [33]")


# -- item 9: fields that must fit the model, from its files, at submission ------------------------------------------
SHAPE = [  # the embedded default model: 4 layers x 8 heads = 32 heads
    ({"kind": "ablation_curves", "ks": [33]}, "ks: [33] exceed this model's 32 heads"),
    ({"kind": "ablation_curves", "ks": [0, 8, 1000]}, "ks: [1000] exceed"),
    ({"kind": "ablate", "heads": [[0, 1], [4, 0]]}, "heads: [[4, 0]] outside this model's 4 layers x 8 heads"),
    ({"kind": "vectors", "heads": [[0, 8]]}, "heads: [[0, 8]] outside"),
    ({"kind": "steer", "heads": [[9, 9]]}, "heads: [[9, 9]] outside"),
    ({"kind": "steer", "layer": 4}, "layer: 4 out of range: this model has layers 0..3"),
    ({"kind": "head", "head": [0, 99]}, "head: [0, 99] outside"),
    ({"kind": "geometry", "layer": 7}, "layer: 7 out of range"),
    ({"kind": "geometry", "pca_layer": 40}, "pca_layer: 40 out of range"),
    ({"kind": "ltv_train", "layer": [1, 40]}, "layer: [40] out of range"),
    ({"kind": "ltv", "layer": 5}, "layer: 5 out of range"),
    ({"kind": "methods", "layer": 4}, "layer: 4 out of range"),
]


@pytest.mark.parametrize("fields,words", SHAPE, ids=[f"{f['kind']}-{i}" for i, (f, _) in enumerate(SHAPE)])
def test_fields_beyond_the_model_are_refused_at_submission(fields, words):
    with idle_client() as c:
        est, sub = verdicts(c, {**BASE, **fields})
        assert c.app.state.pool.loaded() == []  # read from the model's files: nothing was loaded
        assert c.get("/jobs").json() == []
    assert est == sub and sub[0] == 422 and words in sub[1], sub


def test_ltv_tasks_layer_beyond_the_model_is_refused():
    with idle_client() as c:
        est, sub = verdicts(c, {"kind": "ltv_tasks", "model": "default", "layer": 4})
    assert est == sub and sub[0] == 422 and "layer: 4 out of range" in sub[1]


def test_fields_within_the_model_are_admitted():
    with idle_client() as c:
        for fields in ({"kind": "ablation_curves", "ks": [0, 32]}, {"kind": "ablate", "heads": [[3, 7]]},
                       {"kind": "head", "head": [3, 7]}, {"kind": "geometry", "pca_layer": 3, "layer": 0}):
            r = c.post("/jobs", json={**BASE, **fields})
            assert r.status_code == 202, (fields, r.text)


def test_a_saved_tensor_for_another_shape_is_refused_at_submission():
    """`load` naming a stored file made for a 2 x 2-head model of width 16: refused before any job, from its
    metadata and the model's files (the analysis would refuse it only once the model is loaded)."""
    from fuzz_bodies import valid_tensor_file

    with idle_client() as c:
        ids = {k: c.post("/tensors", content=valid_tensor_file(k)).json()["id"] for k in ("ltv", "site")}
        for kind in ("ltv", "site"):
            est, sub = verdicts(c, {"kind": kind, **BASE, "load": ids[kind]})
            assert est == sub and sub[0] == 422 and "trained for d_model 16" in sub[1], sub


# -- item 3: a finished job whose saved tensors are gone is computed again ---------------------------------------------
def test_a_done_job_whose_tensor_is_gone_runs_again(tmp_path):
    """The runner's dedupe: a done job whose result names a tensor that is no longer stored is not served."""
    from backend.store.tensor_store import TensorStore, tensor_id

    store = TensorStore(tmp_path / "tensors")
    data = b"the tensor's bytes"
    tid = tensor_id("ltv", data)
    runs: list[int] = []

    def execute(job, progress) -> dict:
        kind, params = job.kind, job.params
        runs.append(1)
        store.put(tid, data)
        return {"tensor": tid}

    runner = LocalJobRunner(execute, outputs_present=outputs_present_in(store))
    try:
        first = submit(runner, "ltv_train", {}, "key")
        _until_done(runner, first.id)
        again = submit(runner, "ltv_train", {}, "key")
        assert again.id == first.id and len(runs) == 1  # deduped while the file is there
        store.path(tid).unlink()
        third = submit(runner, "ltv_train", {}, "key")
        assert third.id != first.id
        assert _until_done(runner, third.id).status == "done" and len(runs) == 2 and store.has(tid)
        assert submit(runner, "ltv_train", {}, "key").id == third.id  # and deduped again
    finally:
        runner.close()


def _until_done(runner: Any, job_id: str) -> Any:
    return wait_until(lambda: (j := runner.get(job_id)).status not in ("queued", "running") and j,
                      f"job {job_id} to finish", poll_s=0.02)


def test_ltv_train_whose_file_was_deleted_is_recomputed():
    """The issue's reproduction on the embedded model: train, delete the file in the tensor folder, POST the same
    body: a new job computes it again (not the cached result), its tensor answers, and `ltv` with `load` of it runs."""
    from backend.store.tensor_store import default_store

    body = {"kind": "ltv_train", "model": "default", "task": "syn-antonym", "epochs": 1, "train_prompts": 8,
            "val_prompts": 4, "seed": 11}
    with TestClient(create_app()) as c:
        first = _wait(c, c.post("/jobs", json=body).json()["id"])
        assert first["status"] == "done", first
        tid = first["result"]["tensor"]
        assert c.get(f"/tensors/{tid}").status_code == 200
        default_store().path(tid).unlink()
        assert c.get(f"/tensors/{tid}").status_code == 404
        assert c.post("/jobs", json={"kind": "ltv", **BASE, "load": tid}).status_code == 404  # "train it"
        r = c.post("/jobs", json=body)
        assert r.status_code == 202 and r.json()["id"] != first["id"]
        second = _wait(c, r.json()["id"])
        assert second["status"] == "done" and second["cache_hit"] is False
        tid2 = second["result"]["tensor"]
        assert c.get(f"/tensors/{tid2}").status_code == 200
        assert c.post("/jobs", json=body).json()["id"] == second["id"]  # deduped again, now that it is there
        ltv = {"kind": "ltv", **BASE, "load": tid2, "mechanism": False, "prompts": 8, "shots": 2}
        assert c.post("/jobs/estimate", json=ltv).status_code == 200
        done = _wait(c, c.post("/jobs", json=ltv).json()["id"])
        assert done["status"] == "done" and done["result"]["tensor"] == tid2, done.get("error")


def _wait(c: TestClient, job_id: str) -> dict[str, Any]:
    return wait_until(lambda: (j := c.get(f"/jobs/{job_id}").json())["status"] not in ("queued", "running") and j,
                      f"job {job_id} to finish")


def test_tensor_refs_names_a_results_saved_outputs():
    """What the runner's dedupe and the kernel's cache check: the ids in `tensor` / `tensors` at any depth, not
    those of `unsaved_tensors` (inline)."""
    from backend.store.tensor_store import tensor_refs

    assert tensor_refs({"tensor": "ltv-" + "0" * 32, "x": [{"tensors": {"a": "site-" + "1" * 32}}],
                        "unsaved_tensors": {"tensor": "ltv-" + "2" * 32}}) == ["ltv-" + "0" * 32, "site-" + "1" * 32]
