"""The Ray runner against the local runner on this machine (issue 13): overhead per job, and a small sweep.

    .venv/bin/python bench/bench_ray.py [--jobs 60] [--json bench/ray.json]     # RAY_ADDRESS: an existing cluster
    .venv/bin/python bench/bench_ray.py --smoke    # 2 jobs, one actor, a one-job sweep on `default` (the CI test)

1. Overhead per job: N distinct jobs of a kind that does no work (`noop`), through the local runner (one thread,
   in process) and through the Ray runner with 1 and with 2 actors (warm: the actors started before timing).
   (T_ray - T_local) / N with one actor is what Ray adds to a job: the task round trip, the progress polls, the
   result coming back and the service writing it. With 2 actors the jobs overlap.
2. A sweep of 2 tiny random models x 3 tasks x 2 seeds (kind `scores`, 12 jobs), local runner vs the Ray runner
   with 2 actors: cold (actors start, import torch and load the models inside the timing), warm (the model the
   actors hold, 3 tasks x 2 new seeds: 6 jobs), the first sweep again (the same runner: the finished jobs), and
   the first sweep through a new runner on the same cache (a restarted service: every job a cache hit).
3. Cache hits: N jobs whose results are cached, through each runner.

A local Ray instance (2 CPUs) is started unless RAY_ADDRESS names a cluster.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).resolve().parent)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pydantic import BaseModel, ConfigDict  # noqa: E402

from backend.analysis.kinds import Kind, register  # noqa: E402
from backend.analysis.results import Result  # noqa: E402


class NoopParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = 0


class NoopResult(Result):
    n: int


def noop(ctx: Any, p: NoopParams) -> dict[str, Any]:
    ctx.progress(0.5, "half")
    return {"n": p.n}


NOOP = Kind("noop", NoopParams, NoopResult, "bench_ray:noop", "no work", api="noop", uses_task=False,
            uses_model=False)


def run_jobs(runner: Any, jobs: list[dict[str, Any]], kind: str = "noop") -> float:
    """Admit each job body (as POST /jobs does), submit it to `runner`, and wait for all: their wall seconds."""
    from backend.service.admit import admit
    from backend.service.limits import Limits
    from backend.service.model_pool import ModelPool
    from backend.service.task_store import TaskStore

    pool, tasks, limits = ModelPool(), TaskStore(), Limits()
    t0 = time.perf_counter()
    ids = [runner.submit(admit({"kind": kind, **p}, pool, tasks, limits)).id for p in jobs]
    for i in ids:
        while (j := runner.get(i, include_result=False)).status in ("queued", "running"):
            time.sleep(0.002)
        assert j.status == "done", (j.status, j.error)
    return time.perf_counter() - t0


TASKS = ["sentiment", "antonym", "country-capital"]


def sweep(runner: Any, models: list[str], seeds: tuple[int, ...] = (0, 1),
          tasks: list[str] = TASKS) -> tuple[float, dict[str, int]]:
    from backend.service.limits import Limits
    from backend.service.model_pool import ModelPool
    from backend.service.sweeps import SweepManager, SweepRequest, sweep_cells
    from backend.service.task_store import TaskStore

    req = SweepRequest(models=models, tasks=tasks, kinds=["scores"], seeds=list(seeds),
                       params={"shots": 2, "prompts": 6})
    m = SweepManager(runner, Limits(), poll=0.02)
    t0 = time.perf_counter()
    sid = m.start(req, sweep_cells(req, ModelPool(), TaskStore(), Limits()))["id"]
    final = m.wait(sid)
    assert final["status"] == "done" and final["counts"]["error"] == 0, final["counts"]
    return time.perf_counter() - t0, final["counts"]


def tiny_models(root: Path) -> list[str]:
    from tiny_models import GPT2_TOKENIZER, tiny_model
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(GPT2_TOKENIZER))
    out = []
    for arch in ("gpt2", "llama"):
        folder = root / f"tiny-{arch}"
        tiny_model(arch, seed=1).save_pretrained(folder)
        tok.save_pretrained(folder)
        out.append(str(folder))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=60, help="jobs per overhead measurement")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--smoke", action="store_true", help="2 jobs, one actor, one sweep job on `default` (seconds)")
    a = ap.parse_args()
    try:
        import ray
    except ImportError:
        if a.smoke:
            print("smoke: skipped (Ray is not installed: pip install -r requirements-ray.txt)")
            return
        raise
    import torch

    from backend.service.execute import make_executor
    from backend.service.jobs import LocalJobRunner
    from backend.service.limits import Limits
    from backend.service.model_pool import ModelPool
    from backend.service.ray_cluster import RayConfig, connect
    from backend.service.ray_runner import RayJobRunner
    from backend.service.task_store import TaskStore

    register(NOOP, replace=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    os.environ["HEADLENS_CACHE_DIR"] = str(tmp / "cache-local")
    limits = Limits(max_queue=10_000)
    if a.smoke:
        a.jobs = 2
    out: dict[str, Any] = {"jobs": a.jobs, "cpus": os.cpu_count(), "load_avg": os.getloadavg()[0]}
    t0 = time.perf_counter()
    connect(RayConfig.from_env() if os.environ.get("RAY_ADDRESS") else RayConfig(num_cpus=2))
    out["ray_connect_s"] = round(time.perf_counter() - t0, 2)
    paths = (str(Path(__file__).resolve().parent), str(ROOT / "tests"))

    def ray_runner(actors: int, cache: str) -> RayJobRunner:
        return RayJobRunner(ModelPool(), TaskStore(), limits=limits, cache_directory=tmp / cache,
                            config=RayConfig(max_actors=actors, poll_s=0.05, pythonpath=paths))

    # 1. overhead per job (noop jobs; local in process vs warm Ray actors)
    local = LocalJobRunner(make_executor(ModelPool(), TaskStore()), limits=limits)
    run_jobs(local, [{"n": -1}])
    t_local = run_jobs(local, [{"n": i} for i in range(a.jobs)])
    local.close()
    out["noop_local_s"] = round(t_local, 3)
    for actors in (1,) if a.smoke else (1, 2):
        r = ray_runner(actors, f"cache-noop-{actors}")
        t_start = time.perf_counter()
        run_jobs(r, [{"n": -1 - k} for k in range(actors)])  # start the actors
        out[f"actor_start_s_{actors}"] = round(time.perf_counter() - t_start, 2)
        t = run_jobs(r, [{"n": i} for i in range(a.jobs)])
        out[f"noop_ray{actors}_s"] = round(t, 3)
        # 3. cache hits: the same jobs through a fresh runner on the same cache (the service answers them once it
        # knows... noop has no model: the service looks the result up itself)
        r2 = ray_runner(actors, f"cache-noop-{actors}")
        out[f"cached_ray{actors}_s"] = round(run_jobs(r2, [{"n": i} for i in range(a.jobs)]), 3)
        r2.close()
        r.close()
    out["overhead_ms_per_job_1actor"] = round(1000 * (out["noop_ray1_s"] - t_local) / a.jobs, 1)
    if not a.smoke:
        out["overhead_ms_per_job_2actors"] = round(1000 * (out["noop_ray2_s"] - t_local) / a.jobs, 1)
    out["local_ms_per_job"] = round(1000 * t_local / a.jobs, 2)
    if a.smoke:  # one sweep job on the embedded model, locally and on one actor
        local = LocalJobRunner(make_executor(ModelPool(), TaskStore()), limits=limits)
        os.environ["HEADLENS_CACHE_DIR"] = str(tmp / "cache-sweep-local")
        out["sweep_local_cold_s"], _ = sweep(local, ["default"], (0,), ["syn-sentiment"])
        local.close()
        r = ray_runner(1, "cache-sweep-ray")
        out["sweep_ray1_cold_s"], _ = sweep(r, ["default"], (0,), ["syn-sentiment"])
        r.close()
        ray.shutdown()
        print(json.dumps(out, indent=1))
        return

    # 2. the sweep: 2 tiny models x 3 tasks x 2 seeds, scores (1 thread locally, as a 1-CPU Ray actor)
    models = tiny_models(tmp)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    local = LocalJobRunner(make_executor(ModelPool(), TaskStore()), limits=limits)
    os.environ["HEADLENS_CACHE_DIR"] = str(tmp / "cache-sweep-local")
    out["sweep_local_cold_s"], _ = sweep(local, models)  # loads both models
    out["sweep_local_warm_s"], _ = sweep(local, models[1:], (2, 3))  # the last model resident, new seeds
    out["sweep_local_again_s"], _ = sweep(local, models)
    local.close()
    torch.set_num_threads(threads)
    r = ray_runner(2, "cache-sweep-ray")
    out["sweep_ray2_cold_s"], _ = sweep(r, models)  # actors start, import torch, load the models
    out["sweep_ray2_warm_s"], _ = sweep(r, models[1:], (2, 3))  # both actors hold the last model, new seeds
    out["sweep_ray2_again_s"], _ = sweep(r, models)  # the finished jobs again (same runner: deduplicated)
    r.close()
    r = ray_runner(2, "cache-sweep-ray")
    out["sweep_ray2_new_runner_cached_s"], counts = sweep(r, models)  # a new service on the cache: actors load
    out["sweep_ray2_new_runner_cached"] = counts["cached"]  # each model once for its fingerprint, then all hits
    r.close()
    out = {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}
    ray.shutdown()
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
