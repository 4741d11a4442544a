"""The Ray runner on a real local Ray cluster (`ray.init` with 2 CPUs: two model actors, each its own process).

- a sweep of 2 tiny random models x 3 tasks x 2 seeds (kind `scores`) gives results identical to the local
  runner's;
- a worker process killed (by its pid) mid-sweep loses no result: the job is retried on another actor and
  the sweep completes, with the same results;
- identical concurrent submissions run once; progress comes from the actor; DELETE cancels the Ray task and
  writes nothing to the cache; a job whose worker dies on every attempt fails naming the node.

Also bench/bench_ray.py's smoke (the CI test of the benchmark), joining the same cluster.

Marked `ray` (pytest -m "not ray" leaves them out): they run last, on one local Ray instance that all the tests
marked `ray` share (tests/conftest.py, `ray_cluster`); skipped when Ray is not installed. About a minute or two on
two cores, most of it starting Ray and the workers' imports of torch.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from backend.analysis.kinds import register, unregister  # noqa: E402
from backend.service.execute import make_executor  # noqa: E402
from backend.service.jobs import LocalJobRunner  # noqa: E402
from backend.service.limits import Limits  # noqa: E402
from backend.service.model_pool import ModelPool  # noqa: E402
from backend.service.ray_cluster import RayConfig  # noqa: E402
from backend.service.ray_runner import RayJobRunner  # noqa: E402
from backend.service.sweeps import SweepManager, SweepRequest, sweep_cells  # noqa: E402
from backend.service.task_store import TaskStore  # noqa: E402
from bench_runs import check_smoke, run_smoke  # noqa: E402
from hang import HANG_S  # noqa: E402
from plain_job import submit  # noqa: E402
from ray_kinds import RCOUNT  # noqa: E402

pytestmark = pytest.mark.ray
TESTS = Path(__file__).resolve().parents[1]
TASKS = ["sentiment", "antonym", "country-capital"]
SEEDS = [0, 1]
PARAMS = {"shots": 2, "prompts": 6}
VOLATILE = ("seconds", "cache_hit")


@pytest.fixture(scope="module")
def models(tmp_path_factory, gpt2_tokenizer) -> list[str]:
    """Two tiny random-weight models (GPT-2 and Llama families) saved as model folders."""
    from tiny_models import tiny_model

    out = []
    for arch in ("gpt2", "llama"):
        folder = tmp_path_factory.mktemp("ray-models") / f"tiny-{arch}"
        tiny_model(arch, seed=1).save_pretrained(folder)
        gpt2_tokenizer.save_pretrained(folder)
        out.append(str(folder))
    return out


@pytest.fixture
def cluster(ray_cluster):
    """The local Ray instance with 2 CPUs (2 actors of 1 CPU at most) that every test marked `ray` shares
    (tests/conftest.py)."""
    return ray_cluster


@pytest.fixture(autouse=True)
def _rcount():
    register(RCOUNT, replace=True)
    yield
    unregister("rcount")


def job_key(kind: str, params: dict[str, Any]) -> str:
    return f"{kind}:{sorted(params.items())}"


def ray_runner(cache: Path, **cfg: Any) -> RayJobRunner:
    # a cancelled actor that is slow to stop (a busy machine) is waited for, not killed: only a hang is
    config = RayConfig(**{"max_actors": 2, "poll_s": 0.05, "pythonpath": (str(TESTS),), "cancel_grace_s": HANG_S,
                          **cfg})
    return RayJobRunner(ModelPool(), TaskStore(), limits=Limits(), config=config, cache_directory=cache)


def sweep(runner: Any, models: list[str]) -> dict[tuple, dict[str, Any]]:
    """Run the sweep (kind `scores`) through `runner`; {(model, task, kind, seed): result without volatile fields}."""
    req = SweepRequest(models=models, tasks=TASKS, kinds=["scores"], seeds=SEEDS, params=PARAMS)
    limits = Limits()
    manager = SweepManager(runner, limits, keep_results=True)
    sid = manager.start(req, sweep_cells(req, ModelPool(), TaskStore(), limits))["id"]
    final = manager.wait(sid, timeout=HANG_S)
    assert final["status"] == "done" and final["counts"]["error"] == 0, [j for j in final["jobs"] if j["error"]]
    return {(r["model"], r["task"], r["kind"], r["seed"]): {k: v for k, v in r["result"].items() if k not in VOLATILE}
            for r in manager.results(sid)}


@pytest.fixture(scope="module")
def baseline(models, tmp_path_factory) -> dict[tuple, dict[str, Any]]:
    """The sweep through the local runner (its own cache folder), on one thread as a Ray worker of 1 CPU (CPU
    float sums depend on how many threads split them)."""
    import torch

    pool, tasks = ModelPool(), TaskStore()
    runner = LocalJobRunner(make_executor(pool, tasks), limits=Limits())
    old = os.environ.get("HEADLENS_CACHE_DIR")
    os.environ["HEADLENS_CACHE_DIR"] = str(tmp_path_factory.mktemp("local-cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = sweep(runner, models)
    finally:
        torch.set_num_threads(threads)
        runner.close()
        if old is not None:
            os.environ["HEADLENS_CACHE_DIR"] = old
    assert len(out) == 2 * 3 * 2
    return out


def test_sweep_on_ray_equals_the_local_runner(cluster, models, baseline, tmp_path):
    runner = ray_runner(tmp_path / "ray-cache")
    try:
        got = sweep(runner, models)
        actors = runner.actors.describe()
        # 2 CPUs: at most 2 actors, each its own process, each pinned to one model (jobs go model by model, so the
        # last model's jobs had both, the first model's actors released to make room)
        assert len(actors) == 2 and len({a.get("pid") for a in actors}) == 2
        assert {a["model"] for a in actors} <= set(models)
        assert all(a["num_cpus"] == 1 and a["num_gpus"] == 0 for a in actors)
        # the service wrote the results (the actors only read): the same request again is answered by the
        # service from the cache, without the cluster
        again = sweep(runner, models)
    finally:
        runner.close()
    assert got.keys() == baseline.keys()
    for key in baseline:
        assert got[key] == baseline[key], key
    assert again == got
    # a restarted service (a rerun of the sweep) finds every result in the cache without starting an actor: the
    # fingerprints the actors reported are kept under the model files' signature
    restarted = ray_runner(tmp_path / "ray-cache")
    try:
        assert sweep(restarted, models) == got and restarted.actors.describe() == []
    finally:
        restarted.close()


def test_a_worker_killed_mid_sweep_loses_nothing(cluster, models, baseline, tmp_path):
    runner = ray_runner(tmp_path / "ray-cache", retries=2)
    killed: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline and not killed:
            busy = [a for a in runner.actors.describe() if a["busy"] and a.get("pid")]
            running = [j for j in runner.list() if j.status == "running"]  # (mid-job: its model loads or it scores)
            if busy and running:
                os.kill(busy[0]["pid"], signal.SIGKILL)
                killed.append(busy[0]["pid"])
            time.sleep(0.05)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        got = sweep(runner, models[:1])
        t.join(5)  # not a limit: the killer is done once it killed (the assertion below)
        assert killed, "no worker was killed"
        assert runner.retried >= 1  # the job the killed worker held ran again on another actor
        assert killed[0] not in {a.get("pid") for a in runner.actors.describe()}
    finally:
        runner.close()
    assert got == {k: v for k, v in baseline.items() if k[0] == models[0]}


def test_identical_concurrent_submissions_run_once_and_progress_comes_back(cluster, tmp_path):
    log = tmp_path / "calls.log"
    runner = ray_runner(tmp_path / "ray-cache")
    try:
        params = {"n": 5, "steps": 10, "delay": 0.1, "log": str(log)}
        key = job_key("rcount", params)
        ids, barrier = [], threading.Barrier(8)

        def post() -> None:
            barrier.wait()
            ids.append(submit(runner, "rcount", params, key).id)

        threads = [threading.Thread(target=post) for _ in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert len(ids) == 8 and len(set(ids)) == 1
        seen = set()
        while (j := runner.get(ids[0])).status in ("queued", "running"):
            seen.add(round(j.progress, 2))
            time.sleep(0.02)
        assert j.status == "done" and j.result["n"] == 5 and j.result["pid"] != os.getpid()
        assert any(0 < p < 1 for p in seen), seen  # progress reported by the actor
        assert log.read_text().count("start 5 ") == 1
        # after it is done: the same job again, and a new runner on the same cache answers from the cache
        assert submit(runner, "rcount", params, key).id == ids[0]
    finally:
        runner.close()
    other = ray_runner(tmp_path / "ray-cache")
    try:
        j = submit(other, "rcount", params, key)
        while (j := other.get(j.id)).status in ("queued", "running"):
            time.sleep(0.02)
        assert j.status == "done" and j.cache_hit is True and log.read_text().count("start 5 ") == 1
    finally:
        other.close()


def test_cancel_stops_the_ray_task_and_writes_nothing(cluster, tmp_path):
    from backend.analysis.kernel import cache_key, validate_params

    log = tmp_path / "calls.log"
    runner = ray_runner(tmp_path / "ray-cache", max_actors=1)
    try:
        long = {"n": 1, "steps": 400, "delay": 0.05, "log": str(log)}
        j = submit(runner, "rcount", long, job_key("rcount", long))
        queued = {"n": 2, "log": str(log)}
        q = submit(runner, "rcount", queued, job_key("rcount", queued))
        while (s := runner.get(j.id)).progress <= 0:
            assert s.status in ("queued", "running")
            time.sleep(0.02)
        assert runner.cancel(q.id).status == "cancelled"
        runner.cancel(j.id)
        while (s := runner.get(j.id)).status == "running":
            time.sleep(0.02)
        assert s.status == "cancelled"  # and stopped early: no "end 1" in the log below (it runs 400 x 0.05 s)
        spec = RCOUNT
        assert runner.store.get(cache_key(spec, None, None, validate_params(spec, long))) is None
        text = log.read_text()
        assert "start 1 " in text and "end 1 " not in text and " 2 " not in text
        # the actor was stopped cooperatively, not killed: it takes the next job
        pid = runner.actors.describe()[0]["pid"]
        nxt = {"n": 3, "steps": 1}
        k = submit(runner, "rcount", nxt, job_key("rcount", nxt))
        while (k := runner.get(k.id)).status in ("queued", "running"):
            time.sleep(0.02)
        assert k.status == "done" and k.result["pid"] == pid
    finally:
        runner.close()


def test_a_job_whose_worker_always_dies_fails_naming_the_node(cluster, tmp_path):
    log = tmp_path / "calls.log"
    runner = ray_runner(tmp_path / "ray-cache", retries=1)
    try:
        bad = {"n": 4, "die": True, "log": str(log)}
        j = submit(runner, "rcount", bad, job_key("rcount", bad))
        while (j := runner.get(j.id)).status in ("queued", "running"):
            time.sleep(0.05)
        assert j.status == "error" and j.error_type == "WorkerLost", j
        assert "died 2 times" in j.error and "node " in j.error and "HEADLENS_RAY_RETRIES" in j.error
        assert log.read_text().count("start 4 ") == 2  # one retry, on a fresh actor
        # an analysis error is reported as such (not retried), and the worker keeps serving
        fail = {"n": 6, "fail": True, "steps": 1}
        f = submit(runner, "rcount", fail, job_key("rcount", fail))
        while (f := runner.get(f.id)).status in ("queued", "running"):
            time.sleep(0.05)
        assert f.status == "error" and f.error_type == "ValueError"  # a bare ValueError: an internal error now
        assert f.error == "internal error (ValueError): rcount 6 failed as asked"
    finally:
        runner.close()


def test_trained_tensors_come_back_to_the_service(cluster, models, tmp_path):
    """Issue 18, section 8: `ltv_train` and `site` on Ray write nothing on the worker: their tensors come back with
    the result and the service checks and writes them in its own cache folder; a `load` job reads them back through
    the service's reader."""
    import tempfile

    cache = tmp_path / "ray-cache"
    runner = ray_runner(cache)
    small_site = dict(m=2, shots=1, prompts=2, steps=2, val_every=2, val_prompts=1, max_new_tokens=2, compare=[],
                      patching=[], budget=[], correlations=[])

    def run(kind: str, params: dict[str, Any]) -> dict[str, Any]:
        full = {"model": models[1], "task": "antonym", **params}
        j = submit(runner, kind, full, job_key(kind, full))
        while (j := runner.get(j.id)).status in ("queued", "running"):
            time.sleep(0.05)
        assert j.status == "done", j.error
        return j.result

    try:
        ltv = run("ltv_train", {"epochs": 1, "train_prompts": 4, "val_prompts": 2})
        site = run("site", small_site)
        for tid in (ltv["tensor"], site["tensor"]):
            assert (cache / "tensors" / f"{tid}.safetensors").is_file()
        loaded = run("site", {**small_site, "load": site["tensor"]})
        assert loaded["loaded"] and loaded["site"] == site["site"] and loaded["tensor"] == site["tensor"]
        pids = {a["pid"] for a in runner.actors.describe()}
        private = [p for p in Path(tempfile.gettempdir()).glob("headlens-worker-*-*")
                   if p.name.split("-")[2].isdigit() and int(p.name.split("-")[2]) in pids]
        assert private and not any((p / "tensors").exists() for p in private)
    finally:
        runner.close()


def test_bench_smoke_bench_ray(cluster, tmp_path):
    """bench/bench_ray.py --smoke (see tests/integration/test_bench_smoke.py) joins the shared cluster (RAY_ADDRESS) instead of
    starting a Ray of its own."""
    address = cluster.get_runtime_context().gcs_address
    check_smoke("bench_ray.py", *run_smoke("bench_ray.py", tmp_path / "cache", RAY_ADDRESS=address))
