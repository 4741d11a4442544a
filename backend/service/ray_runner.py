"""The Ray job runner: the same `JobRunner` interface, jobs run on model-pinned Ray actors.

    HEADLENS_RUNNER=ray python -m backend serve       # RAY_ADDRESS=host:6379 (unset: a local Ray instance)

This module is what the service calls (`RayJobRunner`, `make_runner`); `ray_worker.py` is the actor that holds a
model, `ray_actors.py` places actors and keeps their pool, `ray_cluster.py` connects to a cluster or starts a
local Ray instance.

What stays in the service (the routes' process), exactly as with `LocalJobRunner` (this runner *is* one, with
`workers` dispatch threads and an executor that ships each job to Ray): the job table, dedupe by key (eight
identical requests share one job), submitter counting for DELETE, per-key locks, and every write to the result
cache. What runs on the cluster: `analyze(...)` on an actor that holds the model.

Placement (`ModelActors`): one actor per (model, device) holds the loaded model. Its resources come from the
model's size (`placement`): no GPU in the cluster -> `num_cpus` only; a model that fits a GPU -> the smallest
of 1/8, 1/4, 1/2 or 1 GPU that holds it (small models share a GPU); a larger one -> `ceil(size / GPU)` GPUs of
one node and `device_map="auto"`. A job goes to an idle actor of its model; else a new actor is made while the
cluster has room and fewer than HEADLENS_RAY_MAX_ACTORS exist; else an idle actor of another model is released
to make room (at once for a model without an actor, after HEADLENS_RAY_EVICT_S idle for one more replica); else
the job waits for one. Actors idle for HEADLENS_RAY_IDLE_S are released. Ray does the rest:
it places actors on nodes with the resources, starts their processes and reports their deaths.

Results: the actor runs `analyze` with a `RecordingStore`: reads go to the service's cache (through a small
`CacheReader` actor pinned to the service's node, so workers need not share its disk), writes are recorded and
returned with the result. The service writes them, each under the kernel's per-key lock, after the job has
succeeded: diskcache stays on one disk with one writer, and a job that dies writes nothing. Trained tensors
(`ltv_vector`, `site_alphas`) go the same way (`RecordingTensors`): read from the service's tensor folder through the
reader, sent back with the result, checked (their bytes against their ids, the format's checks) and written by the
service before the results that refer to them; one that cannot be written comes back inline with a warning, and
the results that refer to it are not cached. Cache keys and
the dedupe key are the kernel's and the admission's, unchanged. Once an actor has reported a model's
fingerprint (kept in the cache under the model files' signature, so a restarted service or a rerun of a sweep
knows it too), a job whose result is cached is answered by the service without touching the cluster.

Progress and cancel: the service polls the actor (`poll`) while the job runs and feeds the job's progress and
live data; a DELETE (or the time limit, or a preemption) makes the job's check raise in the service at its next
poll, which then cancels the Ray task (`ray.cancel`: dropped if still queued) and tells the actor (`cancel`), whose
own check (`stopping.check`, installed for the analysis) raises `Cancelled` at the analysis's next batch, training
step or generated token. An actor that does not stop within HEADLENS_RAY_CANCEL_GRACE_S is killed (and replaced
when needed).

Faults: a worker that dies mid-job (its process killed, its node gone) is discarded and the job is retried on
another actor, up to HEADLENS_RAY_RETRIES times; then the job fails with an error naming the node(s). Only deaths
during a job count: an idle actor is pinged before it gets a job (and by the reaper), and one that died while idle
is replaced. A local Ray instance this service started is stopped with it, by a watchdog process
(`ray_watchdog.py`) even when the service is killed (kill -9), so Ray's agents do not outlive it. `ray` not
installed, or a cluster that does not answer within HEADLENS_RAY_CONNECT_TIMEOUT_S, is `RunnerUnavailable`
(one line, at start-up), never a hang.

| variable | default | meaning |
|---|---|---|
| HEADLENS_RUNNER | local | `local` (one worker thread) or `ray` |
| RAY_ADDRESS | unset | the cluster (`host:6379`, `auto`); unset: the `ray start` cluster of this machine, else a new local instance |
| HEADLENS_RAY_MAX_ACTORS | 4 | model actors at most (also the jobs running at once) |
| HEADLENS_RAY_IDLE_S | 300 | an actor idle this long is released |
| HEADLENS_RAY_EVICT_S | 10 | an idle actor of another model gives way to one more replica after this long |
| HEADLENS_RAY_RETRIES | 2 | retries of a job whose worker died |
| HEADLENS_RAY_GPU_GB | 80 | memory of one GPU, for placement |
| HEADLENS_RAY_ACTOR_CPUS | 1 | CPUs an actor reserves |
| HEADLENS_RAY_NUM_CPUS | unset | CPUs of a local Ray instance (unset: all) |
| HEADLENS_RAY_CONNECT_TIMEOUT_S | 30 | give up connecting after this long |
| HEADLENS_RAY_CANCEL_GRACE_S | 20 | a cancelled job's actor is killed when it has not stopped by then |
| HEADLENS_RAY_PYTHONPATH | unset | extra folders on the workers' Python path (the repository is always on it) |
| HEADLENS_RAY_NODE_IP | unset | the Ray node the service joins, by its `--node-ip-address` (a machine with several) |
| HEADLENS_RAY_HEAD_LOST_S | 10 | the head's GCS unreachable this long: the cluster is lost (see below) |

A job's `ran_on`: its actor's node IP, node id, host, pid; `lost`: the nodes of attempts whose worker died.
`cluster()`: the nodes (CPUs, GPUs) and actors. A lost head (its GCS port unanswered for HEADLENS_RAY_HEAD_LOST_S,
watched every second): running and sweep jobs fail with `ClusterLost`, a sentence naming it; other jobs run on
the service's own executor. (Ray would end the driver after 60 s without its GCS: `connect` raises that limit.)
"""
from __future__ import annotations

import base64
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ServiceError, clip
from .execute import Cancelled, JobProgress, Progress, outputs_present_in
from .jobs import LocalJobRunner
from .limits import Limits
from .ray_actors import Actor, ModelActors, model_signature
from .ray_cluster import ClusterLost, RayConfig, RunnerUnavailable, connect
from .ray_worker import CacheReader
from ..store.paths import REPO_ROOT, cache_dir
from ..store.tensor_store import TensorStore, TensorWriteError

log = logging.getLogger(__name__)

PASS_ENV = ("HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HF_TOKEN",
            "HEADLENS_DTYPE", "HEADLENS_MODEL_ROOT", "HEADLENS_MODELS_DIR")


class WorkerLost(ServiceError):
    """A job whose worker died on every attempt."""

    status = 500


@dataclass(frozen=True)
class _ModelRef:
    """What the kernel needs of a model to look a result up: its name and fingerprint (no weights)."""

    name: str
    fingerprint: str


class RayJobRunner(LocalJobRunner):
    """`LocalJobRunner`'s bookkeeping (dedupe, submitters, locks, cancel) with jobs executed on Ray actors."""

    def __init__(self, pool: Any, tasks: Any, limits: Limits | None = None, config: RayConfig | None = None,
                 cache_directory: str | Path | None = None):
        self.cfg = config or RayConfig.from_env()
        self.ray, self._owns_ray = connect(self.cfg)
        self.pool, self.tasks = pool, tasks
        from ..store.cache import ResultCache

        self.cache_directory = Path(cache_directory) if cache_directory else cache_dir()
        self.store = ResultCache(self.cache_directory)
        self.tensors = TensorStore(self.cache_directory / "tensors")
        self._fingerprints: dict[str, _ModelRef] = {}
        self.retried = 0  # jobs run again because their worker died
        paths = [str(REPO_ROOT), *self.cfg.pythonpath]
        env = {k: os.environ[k] for k in PASS_ENV if os.environ.get(k)}
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths + [p for p in os.environ.get("PYTHONPATH", "")
                                                                 .split(os.pathsep) if p]))
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = self.ray.get_runtime_context().get_node_id()
        self.reader = self.ray.remote(CacheReader).options(
            num_cpus=0, max_concurrency=16, max_restarts=-1, runtime_env={"env_vars": env},
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote(str(self.cache_directory))
        self.actors = ModelActors(self.ray, self.cfg, self.reader, dtype=getattr(pool, "dtype", None), env=env,
                                  lost=lambda: self.lost)
        self.lost: str | None = None  # set once the head is lost: the sentence every Ray job then fails with
        self._local: Any = None  # the service's own executor, for non-sweep jobs once the cluster is lost
        self._nodes: list[dict[str, Any]] = []
        self._gcs = self.ray.get_runtime_context().gcs_address
        self._closing = threading.Event()
        self._watch = threading.Thread(target=self._watch_head, name="headlens-ray-head", daemon=True)
        self._watch.start()
        super().__init__(self._execute_on_ray, limits=limits, workers=self.cfg.max_actors,
                         outputs_present=outputs_present_in(self.tensors))  # a done job whose tensors are gone reruns

    # -- executing one job ------------------------------------------------------------------------------------
    def _execute_on_ray(self, job: Any, progress: Progress) -> dict[str, Any]:
        from ..analysis.kernel import lookup

        from ..analysis.kinds import get_kind

        if self.lost:
            return self._without_cluster(job, progress)
        kind = job.kind
        spec = getattr(job, "spec", None) or get_kind(kind)
        fields = dict(job.params)
        model, task_id = fields.pop("model", None), fields.pop("task", None)
        task = self.tasks.get(task_id) if spec.uses_task else None
        canon = self.pool.check(model) if spec.uses_model else None
        ref = self._fingerprint(canon) if canon else None
        if spec.cached and (ref is not None or not spec.uses_model):
            hit = lookup(kind, ref, task, fields, cache=self.store, tensors=self.tensors)
            if hit is not None:
                return hit.to_json()
        lost: list[str] = []
        lost_on: list[dict[str, Any]] = []
        where = getattr(progress, "where", None) or (lambda info: None)
        for attempt in range(self.cfg.retries + 1):
            progress(0.0, f"waiting for a Ray worker for {model or kind}" + (f" (retry {attempt})" if attempt else ""))
            self._check_cluster()
            a = self._acquire_live(canon, progress)
            try:
                out = self._run_on(a, spec, fields, task, progress,
                                   lambda info: where({"runner": "ray", **_place(info), "lost": list(lost_on)}))
            except _Died as e:
                log.warning("ray: worker for %s died on %s (attempt %d): %s", model, e.node, attempt + 1, e.cause)
                lost.append(e.node)
                lost_on.append(_place(e.info))
                where({"runner": "ray", "lost": list(lost_on)})
                if attempt < self.cfg.retries:
                    self.retried += 1
                continue
            finally:
                if a.busy and a in self.actors:
                    self.actors.release(a)
            if out.get("model") and canon:
                self._remember(canon, _ModelRef(**out["model"]))
            return self._write_outputs(out)
        raise WorkerLost(f"the worker running this job died {len(lost)} time{'s' if len(lost) != 1 else ''} "
                         f"(on {', '.join(dict.fromkeys(lost))}); gave up after {self.cfg.retries} "
                         f"retr{'ies' if self.cfg.retries != 1 else 'y'} (HEADLENS_RAY_RETRIES)")

    def _acquire_live(self, canon: str | None, progress: Progress) -> Actor:
        """An actor for the model that answers: one that died while idle is discarded here, before the job, and
        does not count against HEADLENS_RAY_RETRIES (only deaths during a job do)."""
        for _ in range(self.cfg.max_actors + 1):
            a = self.actors.acquire(canon, cancelled=lambda: _cancelled(progress, 0.0))
            if not a.reused or self.actors.alive(a):
                return a
            log.warning("ray: the idle actor for %s had died; discarded before the job", canon)
            self.actors.discard(a)
        return self.actors.acquire(canon, cancelled=lambda: _cancelled(progress, 0.0))

    def _run_on(self, a: Actor, spec: Any, fields: dict[str, Any], task: Any, progress: Progress,
                where: Any = None) -> dict[str, Any]:
        """Run the job on actor `a`, feeding `progress`; raises _Died when the actor dies (it is discarded),
        Cancelled when the job is cancelled, whatever `progress` raises (a time limit), or the analysis' error; the
        actor's task is then stopped (released, or killed if it hangs on)."""
        ray = self.ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        call = uuid.uuid4().hex
        ref = a.handle.run.remote(call, spec, fields, task)
        last, told, since = 0.0, False, time.monotonic()
        try:
            try:
                while True:
                    ready, _ = ray.wait([ref], timeout=self.cfg.poll_s)
                    if not told and where is not None and (info := a.where(ray, 0.01)):
                        where(info)  # the node it runs on, once the actor has said
                        told = True
                    if ready:
                        break
                    self._check_cluster()
                    if not told and time.monotonic() - since > max(20.0, 2 * self.cfg.evict_s):
                        # not started yet: its CPUs may be held by idle actors (the cluster lost a node after this
                        # one was counted as fitting); free one, once per wait
                        self.actors.make_room(a)
                        since = time.monotonic()
                    try:
                        frac, msg, live = ray.get(a.handle.poll.remote(call), timeout=10)
                    except GetTimeoutError:
                        frac, msg, live = None, "", None
                    except RayActorError:
                        continue  # the run ref reports the death
                    last = last if frac is None else frac
                    progress(last, msg)  # raises Cancelled once the job is cancelled
                    if live is not None and isinstance(progress, JobProgress):
                        progress.live(live)
                out = ray.get(ref)
                if not told and where is not None:
                    where(a.where(ray, 5.0))
                return out
            except RayTaskError as e:  # the analysis raised: its own exception, as the local runner would see it
                cause = getattr(e, "cause", None)
                if isinstance(cause, BaseException) and not isinstance(cause, RayActorError):
                    raise cause from None
                lines = [ln for ln in str(e).splitlines() if ln.strip()]
                raise RuntimeError(lines[-1][:500] if lines else type(e).__name__) from None
        except RayActorError as e:
            self.actors.discard(a)
            info = a.where(ray, 0.5)
            raise _Died(_node_name(info), e, info) from None
        except ClusterLost:
            self.actors.forget(a)  # no Ray call now: the head is gone
            raise
        except BaseException:  # Cancelled or the time limit from `progress`, or the analysis' own error:
            self._stop(a, ref, call)  # a finished task just releases the actor; a running one is stopped
            raise

    def _stop(self, a: Actor, ref: Any, call: str) -> None:
        """Cancel a job running on `a`: the Ray task, and the analysis (cooperatively); kill `a` if it hangs on."""
        ray = self.ray
        try:
            a.handle.cancel.remote(call)
            ray.cancel(ref)
        except Exception:
            pass
        ready, _ = ray.wait([ref], timeout=self.cfg.cancel_grace_s)
        if ready:
            self.actors.release(a)
        else:
            log.warning("ray: a cancelled job did not stop within %.0f s; killing its actor", self.cfg.cancel_grace_s)
            self.actors.discard(a)

    def _fingerprint(self, canon: str) -> _ModelRef | None:
        """The model's name and fingerprint as an actor reported them (this run, or an earlier one on the same
        files, from the cache), or None."""
        ref = self._fingerprints.get(canon)
        if ref is None:
            sig = model_signature(canon)
            got = self.store.get(sig) if sig else None
            if got and isinstance(got.get("name"), str) and isinstance(got.get("fingerprint"), str):
                ref = self._fingerprints[canon] = _ModelRef(got["name"], got["fingerprint"])
        return ref

    def _remember(self, canon: str, ref: _ModelRef) -> None:
        if self._fingerprints.get(canon) != ref:
            self._fingerprints[canon] = ref
            sig = model_signature(canon)
            if sig:
                self.store.put(sig, {"name": ref.name, "fingerprint": ref.fingerprint})

    def _write_outputs(self, out: dict[str, Any]) -> dict[str, Any]:
        """Write what a job made: its tensors (checked), then the results, but none that refers to a tensor that
        could not be written; that one comes back inline in the job's result, with a warning."""
        from ..analysis.kernel import unsaved_warning
        from ..analysis.primitives.saved import inspect

        written, failed = out.get("tensors") or {}, {}
        for tid, data in written.items():
            try:
                if inspect(data, f"tensor {tid}")[0] != tid:
                    raise ValueError(f"tensor {tid}: its bytes do not match its id")
                self.tensors.put(tid, data)
            except (ValueError, TensorWriteError) as e:
                log.warning("ray: tensor %s not written: %s", tid, e)
                failed[tid] = str(e)
        puts, result = out["puts"], out["result"]
        if failed:
            puts = [(k, v) for k, v in puts if not any(t in json.dumps(v) for t in failed)]
            result = {**result, "warnings": [*result.get("warnings", []),
                                             *(unsaved_warning(t, why) for t, why in failed.items())],
                      "unsaved_tensors": {**(result.get("unsaved_tensors") or {}),
                                          **{t: base64.b64encode(written[t]).decode("ascii") for t in failed}}}
        self._write(puts)
        return result

    def _write(self, puts: list[tuple[str, dict[str, Any]]]) -> None:
        """Write an actor's results to the cache, each under the kernel's per-key lock (as the kernel does); an
        index entry (what is cached per kind, model and task) is merged into the one there."""
        from ..analysis.kernel import LOCKS, INDEX, merge_index

        for key, value in puts:
            with LOCKS.hold(key):
                if key.startswith(INDEX):
                    merge_index(self.store, key, value)
                elif self.store.get(key) is None:
                    self.store.put(key, value)

    # -- shutdown (the actors: self.actors.describe()) ----------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        self._closing.set()
        super().close(timeout)
        if self.lost:  # every Ray call would wait for the head: leave Ray's processes to the process's exit
            self.actors.close(kill=False)
            return
        self.actors.close()
        try:
            self.ray.kill(self.reader)
        except Exception:
            pass
        if self._owns_ray:
            self.ray.shutdown()

    # -- the cluster: its head, its nodes -----------------------------------------------------------------------
    def _check_cluster(self) -> None:
        if self.lost:
            raise ClusterLost(self.lost)

    def _watch_head(self) -> None:
        """Connect to the head's GCS port every second; unanswered for HEADLENS_RAY_HEAD_LOST_S: the cluster is lost."""
        if not self._gcs:
            return
        host, _, port = str(self._gcs).rpartition(":")
        since: float | None = None
        while not self._closing.wait(1.0):
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                since = None
            except OSError as e:
                since = since or time.monotonic()
                if time.monotonic() - since >= self.cfg.head_lost_s:
                    self.lost = (f"the Ray cluster's head at {self._gcs} stopped answering {time.strftime('%H:%M:%S')}"
                                 f" ({type(e).__name__}: {e}); jobs on the cluster failed. Restart the head (`ray "
                                 f"start --head`) and then this service; meanwhile the service's own runner "
                                 f"answers interactive jobs")
                    log.error("ray: %s", self.lost)
                    self.actors.wake()
                    return

    def _without_cluster(self, job: Any, progress: Progress) -> dict[str, Any]:
        """A job once the cluster is lost: a sweep's fails with the sentence; any other runs on the service's own
        executor (the local runner's), so toggles keep their answers."""
        if getattr(progress, "lane", "") == "sweep":
            raise ClusterLost(self.lost or "the Ray cluster is lost")
        if self._local is None:
            from .execute import make_executor

            self._local = make_executor(self.pool, self.tasks)
        where = getattr(progress, "where", None)
        if where is not None:
            where({"runner": "local", "host": socket.gethostname(), "pid": os.getpid()})
        return self._local(job, progress)

    def cluster(self) -> dict[str, Any]:
        """The cluster as this service sees it: its address, whether it is lost, its nodes (IP, id, alive, CPUs,
        GPUs) and the model actors (what runs where). The nodes are read within a few seconds, else the last ones."""
        if not self.lost:
            got: list[Any] = []
            t = threading.Thread(target=lambda: got.append(self.ray.nodes()), daemon=True)
            t.start()
            t.join(3.0)
            if got:
                self._nodes = [{"node_ip": n.get("NodeManagerAddress"), "node_id": n.get("NodeID"),
                                "alive": bool(n.get("Alive")), "cpus": n.get("Resources", {}).get("CPU", 0.0),
                                "gpus": n.get("Resources", {}).get("GPU", 0.0),
                                "head": "node:__internal_head__" in n.get("Resources", {})} for n in got[0]]
        actors = [] if self.lost else self.actors.describe()
        return {"runner": "ray", "address": self._gcs, "lost": self.lost, "nodes": self._nodes,
                "actors": [{k: a.get(k) for k in ("model", "busy", "node_ip", "node_id", "pid", "num_cpus", "num_gpus")}
                           for a in actors], "retried": self.retried}


class _Died(Exception):
    def __init__(self, node: str, cause: BaseException, info: dict[str, Any] | None = None):
        super().__init__(node)
        self.node, self.cause, self.info = node, cause, info or {}


def _place(info: dict[str, Any]) -> dict[str, Any]:
    """What a job's `ran_on` keeps of an actor's info."""
    return {k: info.get(k) for k in ("node_ip", "node_id", "host", "pid")}


def _node_name(info: dict[str, Any]) -> str:
    if not info:
        return "node unknown (the worker died before it started)"
    return f"node {info.get('node_ip') or '?'} ({info.get('host') or '?'}, pid {info.get('pid')})"


def _cancelled(progress: Progress, fraction: float) -> bool:
    try:
        progress(fraction, "")
    except Cancelled:
        return True
    return False


# -- choosing the runner --------------------------------------------------------------------------------------
def make_runner(pool: Any, tasks: Any, limits: Limits | None = None) -> LocalJobRunner:
    """The runner HEADLENS_RUNNER names: `local` (default) or `ray`. RunnerUnavailable for anything else, or
    when Ray cannot be used."""
    from .execute import make_executor

    name = (os.environ.get("HEADLENS_RUNNER") or "local").strip().lower()
    if name == "local":
        return LocalJobRunner(make_executor(pool, tasks), limits=limits)
    if name == "ray":
        return RayJobRunner(pool, tasks, limits=limits)
    raise RunnerUnavailable(f"HEADLENS_RUNNER must be `local` or `ray`, not {clip(name, 60)!r}")
