"""Sweeps through the local runner (POST /sweeps, `python -m backend sweep`), their summary, and the runner's
configuration (HEADLENS_RUNNER, placement from a model's size, start-up errors). No Ray needed: the Ray runner
itself is tested on a real local cluster in test_ray.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from starlette.testclient import TestClient

from backend.analysis.kernel import Context
from backend.analysis.kinds import Kind, register, unregister
from backend.analysis.results import Result
from backend.service.app import create_app
from backend.service.limits import Limits
from backend.service.ray_actors import Placement, model_bytes, placement
from backend.service.ray_cluster import RayConfig, RunnerUnavailable, connect
from backend.service.ray_runner import make_runner
from backend.service.sweep_summary import compact, summarize
from backend.service.sweeps import Cell
from hang import HANG_S, wait_until

REPO = Path(__file__).resolve().parents[2]
SPEC = {"models": ["default"], "tasks": ["syn-sentiment", "syn-antonym"], "kinds": ["scores"], "seeds": [0, 1],
        "params": {"shots": 2, "prompts": 4}}


class SlowParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = 200
    delay: float = 0.02


class SlowResult(Result):
    steps: int


def run_slow(ctx: Context, p: SlowParams) -> dict[str, Any]:
    for i in range(p.steps):
        ctx.progress(i / p.steps, f"step {i}")
        time.sleep(p.delay)
    return {"steps": p.steps}


SLOW = Kind("slow", SlowParams, SlowResult, "test_sweeps:run_slow", "test kind", api="slow", uses_task=False,
            uses_model=False)


@pytest.fixture(autouse=True)
def _env(monkeypatch, shared_cache):
    for var in ("HEADLENS_TOKEN", "HEADLENS_MODEL_ROOT", "HEADLENS_RUNNER", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HEADLENS_CACHE_DIR", str(shared_cache))  # the module's tests share results
    register(SLOW, replace=True)
    yield
    unregister("slow")


def wait_sweep(c: TestClient, sid: str, timeout: float = HANG_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = c.get(f"/sweeps/{sid}").json()
        if s["status"] != "running":
            return s
        time.sleep(0.05)
    raise AssertionError(f"sweep {sid} did not finish: {s['counts']}")


# -- the service -------------------------------------------------------------------------------------------
def test_post_sweeps_runs_ordinary_jobs_and_summarizes():
    with TestClient(create_app()) as c:
        r = c.post("/sweeps", json=SPEC)
        assert r.status_code == 202, r.text
        sid = r.json()["id"]
        assert r.json()["counts"]["total"] == 4 and [m["model"] for m in r.json()["models"]] == ["default"]
        s = wait_sweep(c, sid)
        assert s["status"] == "done" and s["counts"]["done"] == 4 and s["counts"]["error"] == 0, s["jobs"]
        assert s["progress"] == 1.0 and s["models"][0]["progress"] == 1.0
        # every cell is an ordinary job: the same job as POST /jobs with the same fields
        j = s["jobs"][0]
        assert (j["model"], j["task"], j["kind"], j["seed"]) == ("default", "syn-sentiment", "head_scores", 0)  # an alias asked: its name answers
        same = c.post("/jobs", json={"kind": "scores", "model": "default", "task": "syn-sentiment", "seed": 0,
                                     "shots": 2, "prompts": 4}).json()
        assert same["id"] == j["job_id"] and same["status"] == "done"
        result = same["result"]
        # the summary: models x tasks rows (means over seeds), per model the TR/TL depth and induction overlap
        rows = {(r["model"], r["task"]): r for r in s["summary"]["rows"]}
        assert set(rows) == {("default", "syn-sentiment"), ("default", "syn-antonym")}
        row = rows[("default", "syn-sentiment")]
        assert row["jobs"] == 2 and row["seeds"] == [0, 1] and 0 <= row["tr_depth"] <= 1
        assert row["n_layers"] == result["n_layers"] and 0 <= row["tr_induction"] <= 1
        (m,) = s["summary"]["models"]
        assert m["model"] == "default" and m["tasks"] == 2
        assert abs(sum(m["tr_depth_hist"]) - 1) < 1e-9 and len(m["tl_depth_hist"]) == s["summary"]["depth_bins"]
        assert abs(m["accuracy"] - (rows[("default", "syn-sentiment")]["accuracy"]
                                    + rows[("default", "syn-antonym")]["accuracy"]) / 2) < 1e-9
        # listed without jobs; the same sweep again: every job is the finished one (nothing recomputed)
        listed = c.get("/sweeps").json()
        assert listed[0]["id"] == sid and "jobs" not in listed[0]
        again = wait_sweep(c, c.post("/sweeps", json=SPEC).json()["id"])
        assert [x["job_id"] for x in again["jobs"]] == [x["job_id"] for x in s["jobs"]]
        assert c.get("/sweeps/nope").status_code == 404


def test_sweep_bad_inputs_are_4xx_naming_them():
    with TestClient(create_app()) as c:
        def detail(body: dict[str, Any], status: int) -> str:
            r = c.post("/sweeps", json={**SPEC, **body})
            assert r.status_code == status, r.text
            return r.json()["detail"]

        assert "unknown kind 'nope'" in detail({"kinds": ["scores", "nope"]}, 422)
        assert "'no-such-task'" in detail({"tasks": ["syn-sentiment", "no-such-task"]}, 404)
        assert "/no/such/model" in detail({"models": ["default", "/no/such/model"]}, 404)
        assert "'shotz'" in detail({"params": {"shotz": 3}}, 422)
        assert "names kind 'icl'" in detail({"params": {"icl.shots": [0, 2]}}, 422)
        assert "seeds" in detail({"params": {"seed": 3}}, 422)
        assert "prompts" in detail({"params": {"prompts": 100000}}, 422)  # a job's own limit, with its cell named
        assert "models" in detail({"models": []}, 422)
        assert "unknown field 'extra'" in detail({"extra": 1}, 422)
        r = c.post("/sweeps", content=b"[1, 2]", headers={"content-type": "application/json"})
        assert r.status_code == 422
        assert c.get("/sweeps").json() == []  # nothing was started
    with TestClient(create_app(limits=Limits(max_sweep_jobs=3))) as c:  # HEADLENS_MAX_SWEEP_JOBS
        r = c.post("/sweeps", json=SPEC)
        assert r.status_code == 422, r.text  # 4 jobs, from the grid's size before any is admitted
        assert "4 jobs (1 models x 2 tasks x 1 kinds x 2 seeds), over this server's limit of 3 " \
               "(HEADLENS_MAX_SWEEP_JOBS)" in r.json()["detail"], r.text
        assert c.get("/sweeps").json() == []


def test_cancel_a_sweep_withdraws_its_jobs():
    with TestClient(create_app()) as c:
        sid = c.post("/sweeps", json={"models": ["default"], "tasks": ["syn-sentiment"], "kinds": ["slow"]}).json()["id"]
        s = wait_until(lambda: (s := c.get(f"/sweeps/{sid}").json())["jobs"][0]["status"] == "running" and s,
                       "the sweep's job running", poll_s=0.01)
        r = c.delete(f"/sweeps/{sid}").json()
        assert r["status"] == "cancelled"
        jid = s["jobs"][0]["job_id"]
        job = wait_until(lambda: (j := c.get(f"/jobs/{jid}").json())["status"] != "running" and j,
                         "the job stopping", poll_s=0.02)
        assert job["status"] == "cancelled"


# -- the command line ----------------------------------------------------------------------------------------
def test_cli_sweep_continues_where_it_stopped(tmp_path, capsys):
    from backend.cli import main

    args = ["sweep", "--models", "default", "--tasks", "syn-sentiment,syn-antonym", "--kinds", "scores",
            "--set", "shots=2", "--set", "prompts=4", "--no-bars"]
    # an interrupted run: seed 0 only
    assert main([*args, "--seeds", "0", "--json", str(tmp_path / "a.json")]) == 0
    # the whole sweep: the seed-0 jobs are cached (by the other test's service too), the rest computed
    assert main([*args, "--seeds", "0,1", "--json", str(tmp_path / "b.json")]) == 0
    out = json.loads((tmp_path / "b.json").read_text())
    counts = out["sweep"]["counts"]
    assert counts["total"] == 4 and counts["done"] == 4 and counts["cached"] >= 2
    assert {(r["task"], r["seed"]) for r in out["results"]} == {(t, s) for t in ("syn-sentiment", "syn-antonym")
                                                               for s in (0, 1)}
    assert all(r["result"]["n_layers"] > 0 for r in out["results"])
    err = capsys.readouterr().err
    assert "sweep done: 4 done" in err and "TR depth" in err
    # bad input: one line, exit status 2
    assert main(["sweep", "--models", "default", "--tasks", "nope-task"]) == 2
    assert "nope-task" in capsys.readouterr().err
    assert main(["sweep", "--models", "default", "--tasks", "syn-sentiment", "--seeds", "a"]) == 2


# -- the summary -----------------------------------------------------------------------------------------------
def _scores(top_tr: list[list[int]], top_tl: list[list[int]], acc: float, tr_ind: float) -> dict[str, Any]:
    return {"n_layers": 5, "n_heads": 2, "icl": {"accuracy": acc, "label_accuracy": acc},
            "zero_shot": {"accuracy": 0.0}, "top_tr": top_tr, "top_tl": top_tl,
            "overlap": {"tr_induction": {"jaccard": tr_ind}, "tl_induction": {"jaccard": 0.0},
                        "tr_tl": {"jaccard": 0.5}}}


def test_summary_rows_and_depths():
    cells = []
    for seed, (tr, acc) in enumerate([([[4, 0], [4, 1]], 1.0), ([[0, 0], [4, 1]], 0.5)]):
        c = Cell("m1", "t1", "scores", seed, admitted=None, status="done")  # type: ignore[arg-type]
        c.summary = compact("scores", _scores(tr, [[2, 0]], acc, 0.25 * (seed + 1)))
        cells.append(c)
    icl = Cell("m1", "t1", "icl", 0, admitted=None, status="done")  # type: ignore[arg-type]
    icl.summary = compact("icl", {"shots": [0, 4], "accuracy": [0.1, 0.7]})
    failed = Cell("m1", "t2", "scores", 0, admitted=None, status="error")  # type: ignore[arg-type]
    s = summarize([*cells, icl, failed])
    (row,) = s["rows"]
    assert row["model"] == "m1" and row["task"] == "t1" and row["jobs"] == 3 and row["seeds"] == [0, 1]
    assert row["accuracy"] == 0.75 and row["tr_depth"] == (1.0 + 0.5) / 2 and row["tl_depth"] == 0.5
    assert row["tr_induction"] == 0.375 and row["icl_accuracy"] == 0.7 and abs(row["icl_gain"] - 0.6) < 1e-9
    (m,) = s["models"]
    assert m["tr_depth_hist"] == [0.25, 0, 0, 0, 0.75] and m["tl_depth_hist"] == [0, 0, 1.0, 0, 0]
    abl = compact("ablation_curves", {"curves": {"tr": {"accuracy": [0.9, 0.2]}, "random": {"accuracy": [0.9, 0.8]}}})
    assert abl == {"ablation_drop_tr": pytest.approx(0.7), "ablation_drop_random": pytest.approx(0.1)}


def test_the_summary_is_rebuilt_only_when_a_job_finishes():
    from types import SimpleNamespace

    from backend.service.sweeps import SweepManager, SweepRequest, _Sweep

    done = Cell("m1", "t1", "scores", 0, admitted=None, status="done", job_id="a")  # type: ignore[arg-type]
    done.summary = compact("scores", _scores([[4, 0]], [[2, 0]], 1.0, 0.5))
    late = Cell("m1", "t1", "scores", 1, admitted=None, status="running", job_id="b")  # type: ignore[arg-type]
    sw = _Sweep("s", SweepRequest(models=["m1"], tasks=["t1"]), [done, late])
    first = sw.snapshot()["summary"]
    assert first["rows"][0]["jobs"] == 1
    late.progress = 0.5  # a poll's progress update: the same summary, not rebuilt
    assert sw.snapshot()["summary"] is first and sw.snapshot(detail=False).get("summary") is None
    result = {**_scores([[0, 0]], [[2, 0]], 0.5, 0.25), "cache_hit": False}
    job = SimpleNamespace(status="done", error=None, result=result)
    manager = SweepManager(SimpleNamespace(get=lambda job_id, include_result=False: job), window=1)
    late.status = "done"
    manager._finish(sw, late, job)  # a job finished: the summary is rebuilt with it
    again = sw.snapshot()["summary"]
    assert again is not first and again["rows"][0]["jobs"] == 2 and again["rows"][0]["accuracy"] == 0.75
    assert again == summarize(sw.cells)


# -- runner configuration ----------------------------------------------------------------------------------------
def test_placement_from_model_size():
    gb = 2**30
    assert placement(10 * gb, 80 * gb, 0) == Placement(0.0, 1.0, "cpu")  # a CPU cluster
    assert placement(1 * gb, 80 * gb, 8) == Placement(0.125, 1.0, "cuda")  # small models share a GPU
    assert placement(16 * gb, 80 * gb, 8).num_gpus == 0.5  # an 8B model in bf16
    assert placement(60 * gb, 80 * gb, 8) == Placement(1.0, 1.0, "cuda")
    big = placement(140 * gb, 80 * gb, 8)  # a 70B model in bf16: 3 GPUs of one node, device_map
    assert big == Placement(3.0, 1.0, "cuda", "auto")
    assert placement(None, 80 * gb, 8).num_gpus == 1.0  # unknown size: one GPU
    with pytest.raises(ValueError, match="largest node has 2"):
        placement(400 * gb, 80 * gb, 2)


def test_model_bytes_from_the_weight_files(tmp_path, gpt2_tokenizer):
    from tiny_models import tiny_model

    m = tiny_model("gpt2")
    m.save_pretrained(tmp_path)
    n_params = sum(p.numel() for p in m.parameters())
    on_disk = model_bytes(str(tmp_path), "fp32", "cpu")
    assert on_disk is not None and abs(on_disk - 4 * n_params) / (4 * n_params) < 0.05
    assert model_bytes(str(tmp_path), "bf16") == on_disk // 2
    assert model_bytes(str(tmp_path / "nothing")) is None and model_bytes(None) is None


def test_runner_choice_and_startup_errors(monkeypatch):
    from backend.service.jobs import LocalJobRunner

    r = make_runner(None, None)
    assert type(r) is LocalJobRunner
    r.close()
    monkeypatch.setenv("HEADLENS_RUNNER", "spark")
    with pytest.raises(RunnerUnavailable, match="local` or `ray"):
        make_runner(None, None)
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    # connect() sets RAY_AUTH_MODE=token (a cluster's token is on this machine) before it imports Ray: not past this
    # test (a local Ray started later in this process would then want a token that its driver does not send)
    monkeypatch.setenv("RAY_AUTH_MODE", os.environ.get("RAY_AUTH_MODE", "disabled"))
    with pytest.raises(RunnerUnavailable, match="requirements-ray.txt"):
        connect(RayConfig())
    monkeypatch.setenv("HEADLENS_RAY_MAX_ACTORS", "zero")
    with pytest.raises(RunnerUnavailable, match="HEADLENS_RAY_MAX_ACTORS"):
        RayConfig.from_env()


def _serve_error(address: str) -> str:
    env = dict(os.environ, HEADLENS_RUNNER="ray", RAY_ADDRESS=address, HEADLENS_RAY_CONNECT_TIMEOUT_S="3")
    r = subprocess.run([sys.executable, "-m", "backend", "serve", "--port", "0"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=HANG_S)  # a hang: no answer, ever
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    return lines[0]


def test_serve_with_an_unreachable_cluster_fails_in_one_line():
    import socket
    import threading

    line = _serve_error("127.0.0.1:1")  # nothing listens
    assert "RAY_ADDRESS=127.0.0.1:1 is unreachable" in line or "requirements-ray.txt" in line
    if "requirements-ray.txt" in line:
        return
    # something listens there but never answers as Ray would: not a hang either
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list = []
    threading.Thread(target=lambda: [held.append(srv.accept()) for _ in range(8)], daemon=True).start()
    try:
        line = _serve_error(f"127.0.0.1:{srv.getsockname()[1]}")
        assert "within 3 s (HEADLENS_RAY_CONNECT_TIMEOUT_S)" in line
    finally:
        srv.close()


def test_a_failed_connect_leaves_ray_auth_mode_as_it_was(monkeypatch, tmp_path):
    """connect() sets RAY_AUTH_MODE=token for a cluster when this machine holds a token; when nothing connects, the
    variable is gone again (a later local Ray start would otherwise want a token its driver never sends)."""
    ray = pytest.importorskip("ray")
    from backend.service.ray_cluster import RayConfig, RunnerUnavailable, connect

    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("secret")
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    if ray.is_initialized():  # the shared cluster of this module's other tests: connect() would join it
        pytest.skip("Ray is initialised in this process")
    with pytest.raises(RunnerUnavailable, match="unreachable"):
        connect(RayConfig(address="127.0.0.1:9"))
    assert "RAY_AUTH_MODE" not in os.environ
