"""The HTTP service through FastAPI's TestClient: jobs, dedupe, cancel, limits, auth, bad requests, cache."""
from __future__ import annotations

import json

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from starlette.testclient import TestClient

from backend.analysis.kernel import Context
from backend.analysis.kinds import Kind, register, unregister
from backend.analysis.results import Result
from backend.service.app import create_app
from hang import HANG_S, returns, wait_until

REPO = Path(__file__).resolve().parents[2]
CALLS: Counter = Counter()  # computations of the test job kinds, by n


class CountParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = 0
    steps: int = 4
    delay: float = 0.05
    fail: bool = False


class CountResult(Result):
    n: int
    steps_done: int
    nan: float | None = None


def run_count(ctx: Context, p: CountParams) -> dict[str, Any]:
    """Computes `n` (cached by the kernel), counting real computations; progress after every step."""
    CALLS[p.n] += 1
    for i in range(p.steps):
        ctx.progress(i / p.steps, f"step {i}")
        time.sleep(p.delay)
    if p.fail:
        raise RuntimeError("boom")
    return {"n": p.n, "steps_done": p.steps, "nan": float("nan")}


COUNT = Kind("count", CountParams, CountResult, "test_service:run_count", "test kind", api="count", uses_task=False,
             uses_model=False)


@pytest.fixture(autouse=True)
def _service_env(monkeypatch):
    for var in ("HEADLENS_TOKEN", "HEADLENS_MODEL_ROOT", "HEADLENS_ALLOW_HUB", "HEADLENS_BACKEND_URL",
                "HEADLENS_MAX_PROMPTS", "HEADLENS_MAX_SHOTS", "HEADLENS_MAX_TOKENS", "HEADLENS_MAX_UPLOAD_MB",
                "HEADLENS_MAX_SWEEP_JOBS", "HEADLENS_SWEEP_WINDOW"):
        monkeypatch.delenv(var, raising=False)
    CALLS.clear()
    register(COUNT, replace=True)
    yield
    unregister("count")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny random GPT-2 saved as a Hugging Face folder (model + tokenizer)."""
    from tiny_models import GPT2_TOKENIZER, tiny_model
    from transformers import AutoTokenizer

    if not GPT2_TOKENIZER.is_dir():
        pytest.skip("../shared/gpt2-tokenizer is absent")
    root = tmp_path_factory.mktemp("models")
    folder = root / "tiny-gpt2"
    tiny_model("gpt2").save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(GPT2_TOKENIZER)).save_pretrained(folder)
    return folder


def client(**kw: Any) -> TestClient:
    return TestClient(create_app(**kw))


def wait(c: TestClient, job_id: str, timeout: float = HANG_S, headers: dict | None = None) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        j = c.get(f"/jobs/{job_id}", headers=headers).json()
        if j["status"] not in ("queued", "running"):
            return j
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} did not finish: {j}")


def wait_running(c: TestClient, job_id: str) -> None:
    wait_until(lambda: c.get(f"/jobs/{job_id}").json()["status"] == "running", f"job {job_id} starting", poll_s=0.01)


# -- service basics -----------------------------------------------------------------------------------
def test_health_and_capabilities():
    with client() as c:
        assert c.get("/health").json()["status"] == "ok"
        cap = c.get("/capabilities").json()
        kinds = {k["name"]: k for k in cap["job_kinds"]}
        assert {"model_info", "head_scores", "icl_curve", "ablation_curves", "ablate", "count"} <= set(kinds)
        assert kinds["head_scores"]["aliases"] == ["scores"] and kinds["ltv_layers"]["aliases"] == ["ltv", "train_ltv"]
        assert kinds["ablate"]["aliases"] == [] and not {"scores", "ltv"} & set(kinds)  # an alias is no kind of its own
        assert cap["limits"]["max_prompts"] == 500 and cap["limits"]["max_models"] == 2
        assert cap["limits"]["max_sweep_jobs"] == 10000 and cap["limits"]["sweep_window"] is None  # None: unset
        assert "sentiment" in {t["id"] for t in cap["tasks"]}
        assert cap["device"] == "cpu" and cap["loaded_models"] == [] and cap["auth_required"] is False
        assert c.get("/tasks").json()[0]["source"] == "builtin"


def test_job_lifecycle_progress_and_nan_result():
    with client() as c:
        r = c.post("/jobs", json={"kind": "count", "n": 1, "steps": 6, "delay": 0.05})
        assert r.status_code == 202 and r.json()["status"] in ("queued", "running")
        jid, seen = r.json()["id"], set()
        while (j := c.get(f"/jobs/{jid}").json())["status"] in ("queued", "running"):
            seen.add(j["progress"])
            time.sleep(0.01)
        assert j["status"] == "done" and j["progress"] == 1.0 and j["error"] is None
        assert j["result"]["n"] == 1 and j["result"]["nan"] is None  # NaN travels as null
        assert any(0 < p < 1 for p in seen), seen
        assert j["cache_hit"] is False and j["started"] >= j["created"] and j["finished"] >= j["started"]
        assert [x["id"] for x in c.get("/jobs").json()] == [jid]


def test_failed_job_does_not_stop_the_worker():
    with client() as c:
        bad = wait(c, c.post("/jobs", json={"kind": "count", "n": 2, "fail": True, "delay": 0}).json()["id"])
        assert bad["status"] == "error" and "boom" in bad["error"] and bad["error_type"] == "RuntimeError"
        good = wait(c, c.post("/jobs", json={"kind": "count", "n": 3, "delay": 0}).json()["id"])
        assert good["status"] == "done"
        # a failed job is not deduplicated: resubmitting runs it again
        again = c.post("/jobs", json={"kind": "count", "n": 2, "fail": True, "delay": 0}).json()["id"]
        assert again != bad["id"] and wait(c, again)["status"] == "error"


# -- dedupe and per-key locks ----------------------------------------------------------------------------
def test_identical_concurrent_requests_share_one_computation():
    with client() as c:
        ids: list[str] = []
        barrier = threading.Barrier(8)

        def submit() -> None:
            barrier.wait()
            ids.append(c.post("/jobs", json={"kind": "count", "n": 7, "delay": 0.05}).json()["id"])

        threads = [threading.Thread(target=submit) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(ids)) == 1 and len(ids) == 8
        assert wait(c, ids[0])["status"] == "done"
        # the same request after it is done: the same job again, still one computation
        assert c.post("/jobs", json={"kind": "count", "n": 7, "delay": 0.05}).json()["id"] == ids[0]
        assert CALLS[7] == 1


def test_per_key_lock_across_runners():
    """Two services (two runners, as in two processes) sharing the cache folder compute a key once."""
    with client() as a, client() as b:
        body = {"kind": "count", "n": 9, "steps": 4, "delay": 0.1}
        ja, jb = a.post("/jobs", json=body).json()["id"], b.post("/jobs", json=body).json()["id"]
        ra, rb = wait(a, ja), wait(b, jb)
        assert ra["status"] == rb["status"] == "done"
        assert CALLS[9] == 1 and sorted([ra["cache_hit"], rb["cache_hit"]]) == [False, True]


# -- cancel -------------------------------------------------------------------------------------------------
def test_cancel_running_and_queued_jobs():
    with client() as c:
        running = c.post("/jobs", json={"kind": "count", "n": 11, "steps": 200, "delay": 0.02}).json()["id"]
        queued = c.post("/jobs", json={"kind": "count", "n": 12, "delay": 0}).json()["id"]
        wait_running(c, running)
        q = c.delete(f"/jobs/{queued}").json()
        assert q["status"] == "cancelled"
        assert c.delete(f"/jobs/{running}").json()["status"] in ("running", "cancelled")
        j = wait(c, running)
        assert j["status"] == "cancelled" and j["result"] is None
        assert CALLS[12] == 0  # the queued job never ran
        # a cancelled request is not deduplicated: submitting it again starts a new job
        again = c.post("/jobs", json={"kind": "count", "n": 12, "delay": 0}).json()["id"]
        assert again != queued and wait(c, again)["status"] == "done"
        assert c.delete("/jobs/nope").status_code == 404


# -- limits and bad requests ----------------------------------------------------------------------------
def test_limits(monkeypatch):
    with client() as c:
        r = c.post("/jobs", json={"kind": "scores", "task": "sentiment", "prompts": 10_000})
        assert r.status_code == 422 and "HEADLENS_MAX_PROMPTS" in r.json()["detail"]
        r = c.post("/jobs", json={"kind": "icl", "task": "sentiment", "shots": [0, 64]})
        assert r.status_code == 422 and "shots=64" in r.json()["detail"]
    monkeypatch.setenv("HEADLENS_MAX_PROMPTS", "10")
    monkeypatch.setenv("HEADLENS_MAX_TOKENS", "20")
    monkeypatch.setenv("HEADLENS_MAX_UPLOAD_MB", "0.001")
    with client() as c:
        r = c.post("/jobs", json={"kind": "scores", "task": "sentiment", "prompts": 11})
        assert r.status_code == 422 and "limit of 10" in r.json()["detail"]
        r = c.post("/jobs", json={"kind": "scores", "task": "sentiment", "prompts": 5, "shots": 8})
        assert r.status_code == 422 and "HEADLENS_MAX_TOKENS" in r.json()["detail"]
        r = c.post("/tasks/upload", files={"file": ("big.jsonl", b'{"input": "a", "output": "b"}\n' * 100)})
        assert r.status_code == 413 and "HEADLENS_MAX_UPLOAD_MB" in r.json()["detail"]
        assert c.get("/capabilities").json()["limits"]["max_prompts"] == 10


def test_bad_requests_get_clear_4xx():
    with client() as c:
        r = c.post("/jobs", json={"kind": "scores", "task": "no-such-task"})
        assert r.status_code == 404 and "no-such-task" in r.json()["detail"] and "sentiment" in r.json()["detail"]
        r = c.post("/jobs", json={"kind": "scores", "task": "sentiment", "prompts": 0})
        assert r.status_code == 422 and r.json()["detail"] == ("invalid head_scores request: prompts: Input should be "
                                                               "greater than or equal to 1 (got 0)")
        r = c.post("/jobs", json={"kind": "scores", "task": "sentiment", "shots": True})
        assert r.status_code == 422 and "shots: Input should be a valid integer (got True)" in r.json()["detail"]
        r = c.post("/jobs", json={"kind": "scores", "task": "sentiment", "shotz": 3})
        assert r.status_code == 422 and "unknown field 'shotz'" in r.json()["detail"]
        r = c.post("/jobs", json={"kind": "nope", "task": "sentiment"})
        assert r.status_code == 422 and "unknown job kind 'nope'" in r.json()["detail"]
        r = c.post("/jobs", json={"kind": "ablate", "task": "sentiment", "heads": [[0, -1]]})
        assert r.status_code == 422 and "non-negative" in r.json()["detail"]
        r = c.post("/jobs", content=b"not json", headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["detail"].startswith("invalid request")
        assert c.get("/jobs/unknown").status_code == 404


def test_upload_validation_and_use():
    with client() as c:
        r = c.post("/tasks/upload", files={"file": ("bad.jsonl", b'{"input": "a", "output": "b"}\n{"input": "c"}\n')})
        assert r.status_code == 422 and "record 2" in r.json()["detail"] and "'output'" in r.json()["detail"]
        r = c.post("/tasks/upload", json={"filename": "bad.csv", "content": "input,output\nx,1\ny\n"})
        assert r.status_code == 422 and "record 2" in r.json()["detail"]
        r = c.post("/tasks/upload", json={"filename": "t.txt", "content": "x"})
        assert r.status_code == 422 and "extension" in r.json()["detail"]
        text = "input,output\n" + "".join(f"w{i},{'pos' if i % 2 else 'neg'}\n" for i in range(20))
        up = c.post("/tasks/upload", files={"file": ("mine.csv", text.encode())}).json()
        assert up["id"].startswith("upload:") and up["summary"]["kind"] == "classification"
        assert up["summary"]["n_examples"] == 20 and up["summary"]["name"] == "mine"
        assert up["id"] in {t["id"] for t in c.get("/tasks").json()}
        same = c.post("/tasks/upload", json={"filename": "mine.csv", "content": text}).json()
        assert same["id"] == up["id"]
        r = c.post("/jobs", json={"kind": "scores", "task": up["id"], "shots": 12})
        assert r.status_code == 422 and "demonstration pool" in r.json()["detail"]
    with client() as c:  # a restarted service still knows the upload (kept on disk)
        r = c.post("/jobs", json={"kind": "scores", "task": up["id"], "shots": 500})
        assert r.status_code == 422 and "HEADLENS_MAX_SHOTS" in r.json()["detail"]


def test_token(monkeypatch):
    monkeypatch.setenv("HEADLENS_TOKEN", "s3cret")
    with client() as c:
        assert c.get("/health").status_code == 200
        r = c.get("/capabilities")
        assert r.status_code == 401 and "token" in r.json()["detail"]
        assert c.get("/capabilities", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/capabilities", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.get("/tasks", headers={"X-Headlens-Token": "s3cret"}).status_code == 200
        assert c.post("/jobs", json={"kind": "count"}).status_code == 401
        assert c.get("/capabilities", headers={"X-Headlens-Token": "s3cret"}).json()["auth_required"] is True


# -- models ------------------------------------------------------------------------------------------------
def test_model_root_and_hub_rules(monkeypatch, tmp_path, tiny_dir):
    root = tmp_path / "root"
    root.mkdir()
    (root / "tiny").symlink_to(tiny_dir)  # a link out of the root does not get around it
    monkeypatch.setenv("HEADLENS_MODEL_ROOT", str(root))
    monkeypatch.setenv("HEADLENS_ALLOW_HUB", "0")
    with client() as c:
        body = {"kind": "scores", "task": "sentiment", "shots": 1, "prompts": 2}
        for name in (str(tiny_dir), "tiny", "../elsewhere/model"):
            r = c.post("/jobs", json={**body, "model": name})
            assert r.status_code == 403 and "HEADLENS_MODEL_ROOT" in r.json()["detail"], name
        r = c.post("/jobs", json={**body, "model": "gpt2"})
        assert r.status_code == 403 and "HEADLENS_ALLOW_HUB=0" in r.json()["detail"]
        r = c.post("/jobs", json={**body, "model": str(root / "missing")})
        assert r.status_code == 404 and "does not exist" in r.json()["detail"]
        (root / "tiny").unlink()
        import shutil

        shutil.copytree(tiny_dir, root / "tiny")
        r = c.post("/jobs", json={**body, "model": "tiny"})
        assert r.status_code == 202, r.json()
        assert wait(c, r.json()["id"])["status"] == "done"
        caps = c.get("/capabilities").json()
        assert caps["model_root"] is True and str(root) not in json.dumps(caps)  # said to be set, never shown
        assert [m["name"] for m in caps["loaded_models"]] == ["tiny"]


def test_analysis_kinds_on_a_tiny_model(tiny_dir):
    with client() as c:
        info = wait(c, c.post("/jobs", json={"kind": "model_info", "model": str(tiny_dir)}).json()["id"])
        assert info["status"] == "done" and (info["result"]["n_layers"], info["result"]["n_heads"]) == (2, 4)
        base = {"model": str(tiny_dir), "task": "sentiment", "shots": 2, "prompts": 4}
        s = wait(c, c.post("/jobs", json={"kind": "scores", **base}).json()["id"])  # an old name: an alias
        assert s["status"] == "done", s["error"]
        assert s["kind"] == "head_scores"  # answered under the kind's name
        again = c.post("/jobs", json={"kind": "head_scores", **base}).json()["id"]
        assert again == s["id"] or wait(c, again)["result"]["cache_hit"] is True  # the same job or its cached result
        res = s["result"]
        assert len(res["tr"]) == 2 and len(res["tr"][0]) == 4 and 0 <= res["icl"]["accuracy"] <= 1
        assert res["params"]["shots"] == 2 and res["model"] == str(tiny_dir)
        icl = wait(c, c.post("/jobs", json={"kind": "icl", **base, "shots": [0, 2], "examples": 1}).json()["id"])
        assert icl["status"] == "done", icl["error"]
        assert icl["result"]["shots"] == [0, 2] and len(icl["result"]["examples"]) == 2
        curves = wait(c, c.post("/jobs", json={"kind": "ablation_curves", **base, "ks": [2, 0],
                                               "random_seeds": [0, 1]}).json()["id"])
        assert curves["status"] == "done", curves["error"]
        assert curves["result"]["ks"] == [0, 2] and set(curves["result"]["curves"]) == {"tr", "tl", "induction", "random"}
        ab = wait(c, c.post("/jobs", json={"kind": "ablate", **base, "heads": [[1, 2], [0, 0]],
                                           "mode": "mean"}).json()["id"])
        assert ab["status"] == "done", ab["error"]
        assert ab["result"]["heads"] == [[0, 0], [1, 2]] and len(ab["result"]["rows"]) == 4
        loaded = c.get("/capabilities").json()["loaded_models"]
        assert [m["n_heads"] for m in loaded] == [4]  # loaded once, reused by every job
        # with the model resident, out-of-range heads are refused at submit time
        r = c.post("/jobs", json={"kind": "ablate", **base, "heads": [[5, 0]]})
        assert r.status_code == 422 and "outside" in r.json()["detail"]


def test_steering_geometry_and_perturbation_kinds(tiny_dir):
    with client() as c:
        base = {"model": str(tiny_dir), "task": "sentiment", "shots": 2, "prompts": 4}
        st = wait(c, c.post("/jobs", json={"kind": "steer", **base, "vectors": ["tr", "fv"], "layer": "all"}).json()["id"])
        assert st["status"] == "done", st["error"]
        assert st["result"]["layers"] == [0, 1] and set(st["result"]["vectors"]) == {"tr", "fv"}
        ge = wait(c, c.post("/jobs", json={"kind": "geometry", **base, "layer": 0}).json()["id"])
        assert ge["status"] == "done", ge["error"]
        assert ge["result"]["inject_layer"] == 0 and len(ge["result"]["pca"]["points"]) == 5
        pe = wait(c, c.post("/jobs", json={"kind": "perturb", **base, "perturbations": ["symbol_labels"]}).json()["id"])
        assert pe["status"] == "done", pe["error"]
        assert "symbol_labels" in pe["result"]["perturbations"]
        r = c.post("/jobs", json={"kind": "steer", **base, "layer": 9})  # the model is resident: refused at once
        assert r.status_code == 422 and "layer: 9 out of range" in r.json()["detail"]
        r = c.post("/jobs", json={"kind": "steer", **base, "vectors": ["nope"]})
        assert r.status_code == 422


def test_model_pool_lru():
    from backend.service.model_pool import ModelPool

    loads: list[str] = []

    class Fake:
        def __init__(self, name: str):
            self.name, self.lock = name, threading.RLock()

        def info(self) -> dict:
            return {"name": self.name}

    pool = ModelPool(max_models=2, allow_hub=True, loader=lambda key: loads.append(key) or Fake(key))
    for name in ("org-a/m", "org-b/m", "org-a/m", "org-c/m", "org-a/m", "org-b/m"):
        pool.get(name)
    assert loads == ["org-a/m", "org-b/m", "org-c/m", "org-b/m"]
    assert [m["name"] for m in pool.loaded()] == ["org-a/m", "org-b/m"]


def test_corrupt_cache_entry_is_recomputed(tiny_dir):
    from backend.store.cache import default_cache

    body = {"kind": "scores", "model": str(tiny_dir), "task": "sentiment", "shots": 1, "prompts": 3}
    with client() as c:
        first = wait(c, c.post("/jobs", json=body).json()["id"])
    with client() as c:  # a restarted service reads the disk cache
        cached = wait(c, c.post("/jobs", json=body).json()["id"])
    assert first["cache_hit"] is False and cached["cache_hit"] is True
    dc = default_cache().dc
    keys = [k for k in dc.iterkeys() if str(k).startswith("scores:")]
    assert keys
    for k in keys:
        dc.set(k, b"\x00garbage{")
    with client() as c:
        again = wait(c, c.post("/jobs", json=body).json()["id"])
    assert again["status"] == "done" and again["cache_hit"] is False
    assert again["result"]["tr"] == first["result"]["tr"]


# -- client --------------------------------------------------------------------------------------------------
def test_client_does_not_import_torch():
    code = ("import sys, ui.client; bad = [m for m in ('torch', 'transformers', 'backend.service.app') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_inprocess_client(monkeypatch):
    from ui.client import ClientError, HeadlensClient, JobFailed, reset_inprocess_app

    monkeypatch.setenv("HEADLENS_BACKEND_URL", "inprocess")
    try:
        hc = HeadlensClient()
        assert hc.health()["status"] == "ok"
        steps: list[tuple[float, str]] = []
        result = hc.run("count", n=21, steps=5, delay=0.03, on_progress=lambda f, m: steps.append((f, m)))
        assert result["n"] == 21 and steps and steps[-1] == (1.0, "done")
        with pytest.raises(JobFailed, match="boom"):
            hc.run("count", n=22, fail=True, delay=0)
        with pytest.raises(ClientError, match="prompts: Input should be greater than or equal to 1") as e:
            hc.submit("scores", task="sentiment", prompts=0)
        assert e.value.status == 422
        up = hc.upload_task("t.jsonl", b'{"input": "a", "output": "b"}\n{"input": "c", "output": "d"}\n')
        assert up["summary"]["n_examples"] == 2
        assert HeadlensClient().submit("count", n=23) == HeadlensClient().submit("count", n=23)  # one shared app
    finally:
        reset_inprocess_app()


def test_client_errors_are_readable(monkeypatch):
    from ui.client import ClientError, HeadlensClient

    with pytest.raises(ClientError, match="cannot reach the headlens service"):
        HeadlensClient("http://127.0.0.1:9", timeout=2).health()  # not a limit: refused at once


def test_serve_command_end_to_end(tmp_path):
    """`python -m backend serve` binds 127.0.0.1, and the HTTP client talks to it with the token."""
    import os
    import socket

    from ui.client import ClientError, HeadlensClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HEADLENS_TOKEN": "tok", "HEADLENS_CACHE_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "backend", "serve", "--port", str(port), "--log-level", "warning"],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        def up() -> bool:
            try:
                return bool(HeadlensClient(url, token="tok").health())
            except ClientError:
                assert proc.poll() is None, proc.stderr.read().decode()
                return False

        wait_until(up, "the service answering /health")
        with pytest.raises(ClientError) as e:
            HeadlensClient(url, token="").tasks()
        assert e.value.status == 401
        assert "sentiment" in {t["id"] for t in HeadlensClient(url, token="tok").tasks()}
    finally:
        proc.terminate()
        proc.wait(HANG_S)


def test_preload_makes_a_model_resident_at_start_up_and_a_bad_name_is_harmless(caplog):
    """`serve --preload` (what `launch` passes): the model loads in the background once the service is up, so a
    shared link's `POST /jobs/cached` finds its results without waiting for a first job to load the model."""
    import logging

    from backend.service.model_pool import ModelPool

    class Fake:
        def __init__(self, name: str):
            self.name, self.lock = name, threading.RLock()

        def info(self) -> dict:
            return {"name": self.name}

    pool = ModelPool(max_models=2, allow_hub=True, loader=lambda key: Fake(key))
    with caplog.at_level(logging.WARNING), client(pool=pool, preload=("org-a/m", "../nope")) as c:
        wait_until(lambda: pool.peek("org-a/m") is not None, "the preload", poll_s=0.02)
        assert c.get("/health").status_code == 200
    assert any("could not preload model ../nope" in r.getMessage() for r in caplog.records)


def test_launch_preloads_its_model_and_warms_the_dashboard():
    import argparse

    from backend.launch import commands

    a = argparse.Namespace(backend_port=8765, host="127.0.0.1", port=8501, model="smollm2-135m")
    service, dashboard = commands(a, {"HEADLENS_AUTO_PULL": "0"})
    assert service[service.index("--preload") + 1] == "smollm2-135m"
    assert dashboard[1:4] == ["-m", "ui.warm", "run"]


def test_the_pool_answers_while_a_model_loads():
    """A model loading (the launch's preload, a first job) no longer holds the pool: `loaded()` (what the
    capabilities list) and `peek` answer at once, and a second request for the same model waits for that load
    instead of loading it twice."""
    from backend.service.model_pool import ModelPool

    started, release, loads = threading.Event(), threading.Event(), []

    class Fake:
        def __init__(self, name: str):
            self.name, self.lock = name, threading.RLock()

        def info(self) -> dict:
            return {"name": self.name}

    def loader(key: str):
        loads.append(key)
        started.set()
        release.wait()  # until the test lets it finish: the pool must answer meanwhile
        return Fake(key)

    pool = ModelPool(max_models=2, allow_hub=True, loader=loader)
    got: list = []
    threads = [threading.Thread(target=lambda: got.append(pool.get("org-a/m"))) for _ in range(2)]
    threads[0].start()
    try:
        assert started.wait(HANG_S)
        threads[1].start()
        # the load is held until release.set(): a pool that waited for it would never answer (the hang guard)
        assert returns(pool.loaded, "pool.loaded() during a load") == []
        assert returns(lambda: pool.peek("org-a/m"), "pool.peek() during a load") is None
    finally:
        release.set()
    for t in threads:
        t.join(HANG_S)
    assert loads == ["org-a/m"] and len(got) == 2 and got[0] is got[1]
    assert [m["name"] for m in pool.loaded()] == ["org-a/m"]
