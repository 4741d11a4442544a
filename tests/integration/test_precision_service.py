"""A request's `precision` through the service: the pool keeps a model resident per precision, the job's params
carry a precision other than the default, its results are cached apart from float32's, and a bad value is a 422."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from backend.service.app import create_app
from backend.service.model_pool import ModelPool
from hang import HANG_S

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for var in ("HEADLENS_TOKEN", "HEADLENS_MODEL_ROOT", "HEADLENS_ALLOW_HUB", "HEADLENS_DTYPE", "HEADLENS_DEVICE"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny random Llama saved as a Hugging Face folder (model + GPT-2 tokenizer)."""
    from tiny_models import GPT2_TOKENIZER, tiny_model
    from transformers import AutoTokenizer

    if not GPT2_TOKENIZER.is_dir():
        pytest.skip("../shared/gpt2-tokenizer is absent")
    folder = tmp_path_factory.mktemp("models") / "tiny-llama"
    tiny_model("llama").save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(GPT2_TOKENIZER)).save_pretrained(folder)
    return folder


def wait(c: TestClient, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        j = c.get(f"/jobs/{job_id}").json()
        if j["status"] not in ("queued", "running"):
            return j
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} did not finish: {j}")


def test_pool_keeps_one_model_per_precision():
    loads: list[tuple[str, str | None]] = []

    class Fake:
        def __init__(self, name: str, precision: str | None):
            self.name, self.precision, self.lock = name, precision, threading.RLock()

        def info(self) -> dict:
            return {"name": self.name, "dtype": self.precision or "float32"}

    pool = ModelPool(max_models=3, allow_hub=True, device="cpu",
                     loader=lambda key, precision=None: loads.append((key, precision)) or Fake(key, precision))
    assert pool.precision == "float32"
    f32, b16 = pool.get("org-a/m"), pool.get("org-a/m", "bfloat16")
    assert f32 is not b16 and b16.precision == "bfloat16"
    assert pool.get("org-a/m", "float32") is f32  # the default precision, asked by name: the same model
    assert pool.peek("org-a/m", "bfloat16") is b16 and pool.peek("org-a/m") is f32
    assert loads == [("org-a/m", None), ("org-a/m", "bfloat16")]
    with pytest.raises(Exception, match="precision must be float32, bfloat16 or float32-onednn"):
        pool.get("org-a/m", "int8")


def test_bfloat16_job_is_cached_apart_from_float32(tiny_dir):
    body = {"kind": "head_maps", "model": str(tiny_dir), "task": "syn-sentiment", "shots": 2, "prompts": 4}
    with TestClient(create_app()) as c:
        f32 = wait(c, c.post("/jobs", json=body).json()["id"])
        b16 = wait(c, c.post("/jobs", json={**body, "precision": "bfloat16"}).json()["id"])
        same = wait(c, c.post("/jobs", json={**body, "precision": "float32"}).json()["id"])
        again = wait(c, c.post("/jobs", json={**body, "precision": "bfloat16"}).json()["id"])
        loaded = {m["dtype"] for m in c.get("/capabilities").json()["loaded_models"]}  # 2 resident at most
        onednn = wait(c, c.post("/jobs", json={**body, "precision": "float32-onednn"}).json()["id"])
    assert f32["status"] == b16["status"] == "done", (f32.get("error"), b16.get("error"))
    assert "precision" not in f32["params"] and b16["params"]["precision"] == "bfloat16"
    assert b16["cache_hit"] is False  # not float32's cached result
    assert b16["result"]["tr"] != f32["result"]["tr"]
    # float32 by name is the default: the float32 job (done, kept by the runner under its key) or its cached result
    assert (same["id"] == f32["id"] or same["cache_hit"]) and same["result"]["tr"] == f32["result"]["tr"]
    assert (again["id"] == b16["id"] or again["cache_hit"]) and again["result"]["tr"] == b16["result"]["tr"]
    assert b16["id"] != f32["id"]
    assert loaded == {"float32", "bfloat16"}
    assert onednn["status"] == "done" and onednn["cache_hit"] is False and onednn["id"] != f32["id"]
    f, o = np.asarray(f32["result"]["tr"]), np.asarray(onednn["result"]["tr"])
    assert np.abs(f - o).max() <= 1e-5 * np.abs(f).max()


def test_bad_precision_is_a_422_naming_the_field(tiny_dir):
    body = {"kind": "head_maps", "model": str(tiny_dir), "task": "syn-sentiment", "shots": 2, "prompts": 4,
            "precision": "fp8"}
    with TestClient(create_app()) as c:
        r = c.post("/jobs", json=body)
    assert r.status_code == 422
    assert "precision" in r.text and "float32" in r.text and "bfloat16" in r.text
