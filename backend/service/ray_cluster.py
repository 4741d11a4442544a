"""Connecting to Ray: the runner's settings (`RayConfig`, from HEADLENS_RAY_*), and joining a cluster or starting
a local Ray instance (`connect`), with the checks that make an unreachable one a one-line `RunnerUnavailable`
instead of a hang. The rest of the Ray runner: `ray_runner.py` (what the service calls), `ray_actors.py`
(placement and the pool of model actors), `ray_worker.py` (the actor that holds a model)."""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BadInput
from .errors import ServiceError
from .limits import env_number

log = logging.getLogger(__name__)


class RunnerUnavailable(BadInput):
    """The configured runner cannot start (Ray missing, cluster unreachable, a bad setting): one line."""


RECONNECT_S = 30 * 86400  # the driver's patience with a lost GCS (Ray's default, 60 s, would end the service)


class ClusterLost(ServiceError):
    """The Ray cluster's head stopped answering: jobs on the cluster cannot run (or finish) now."""

    status = 503


def _env_num(name: str, default: float, minimum: float = 0) -> float:
    try:
        return env_number(name, default, minimum)
    except ValueError as e:
        raise RunnerUnavailable(str(e)) from None


@dataclass(frozen=True)
class RayConfig:
    address: str | None = None
    max_actors: int = 4
    idle_s: float = 300.0
    evict_s: float = 10.0
    retries: int = 2
    gpu_gb: float = 80.0
    actor_cpus: float = 1.0
    num_cpus: int | None = None
    connect_timeout_s: float = 30.0
    cancel_grace_s: float = 20.0
    poll_s: float = 0.2
    pythonpath: tuple[str, ...] = ()
    node_ip: str | None = None  # this host's Ray node (its --node-ip-address), when the machine has several
    head_lost_s: float = 10.0  # the head's GCS unreachable this long: the cluster is lost

    @classmethod
    def from_env(cls) -> "RayConfig":
        d = cls()
        n = os.environ.get("HEADLENS_RAY_NUM_CPUS")
        extra = tuple(p for p in (os.environ.get("HEADLENS_RAY_PYTHONPATH") or "").split(os.pathsep) if p)
        return cls(address=(os.environ.get("RAY_ADDRESS") or "").strip() or None,
                   max_actors=int(_env_num("HEADLENS_RAY_MAX_ACTORS", d.max_actors, 1)),
                   idle_s=_env_num("HEADLENS_RAY_IDLE_S", d.idle_s, 0),
                   evict_s=_env_num("HEADLENS_RAY_EVICT_S", d.evict_s, 0),
                   retries=int(_env_num("HEADLENS_RAY_RETRIES", d.retries, 0)),
                   gpu_gb=_env_num("HEADLENS_RAY_GPU_GB", d.gpu_gb, 0.1),
                   actor_cpus=_env_num("HEADLENS_RAY_ACTOR_CPUS", d.actor_cpus, 0),
                   num_cpus=int(_env_num("HEADLENS_RAY_NUM_CPUS", 1, 1)) if n else None,
                   connect_timeout_s=_env_num("HEADLENS_RAY_CONNECT_TIMEOUT_S", d.connect_timeout_s, 1),
                   cancel_grace_s=_env_num("HEADLENS_RAY_CANCEL_GRACE_S", d.cancel_grace_s, 0),
                   pythonpath=extra, node_ip=(os.environ.get("HEADLENS_RAY_NODE_IP") or "").strip() or None,
                   head_lost_s=_env_num("HEADLENS_RAY_HEAD_LOST_S", d.head_lost_s, 1))


def connect(cfg: RayConfig) -> tuple[Any, bool]:
    """(the ray module, whether this call started Ray). RAY_ADDRESS set: that cluster (RunnerUnavailable at once
    when nothing answers there); unset: the cluster `ray start` runs on this machine, else a new local instance
    (HEADLENS_RAY_NUM_CPUS set: always a new one, of that many CPUs). RunnerUnavailable when Ray is not installed."""
    address = cfg.address or ("local" if cfg.num_cpus else None)
    # a cluster started by `ray start --head` wants its token (token authentication, Ray's default): use the one
    # this machine has (Ray reads the mode when it is imported, so set it before)
    if address != "local" and "RAY_AUTH_MODE" not in os.environ and (
            os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
            or (Path.home() / ".ray" / "auth_token").is_file()):
        os.environ["RAY_AUTH_MODE"] = "token"
        try:
            return _connect(cfg, address)
        except BaseException:  # nothing connected: leave the environment as it was (a later Ray start reads it)
            os.environ.pop("RAY_AUTH_MODE", None)
            raise
    return _connect(cfg, address)


def _connect(cfg: RayConfig, address: str | None) -> tuple[Any, bool]:
    try:
        import ray
    except ImportError:
        raise RunnerUnavailable("HEADLENS_RUNNER=ray needs Ray: pip install -r requirements-ray.txt") from None
    if ray.is_initialized():
        return ray, False
    if address and address not in ("auto", "local") and not address.startswith("ray://"):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host or address, int(port or 6379)), timeout=min(5.0, cfg.connect_timeout_s)
                                     ).close()
        except (OSError, ValueError) as e:
            raise RunnerUnavailable(f"the Ray cluster at RAY_ADDRESS={address} is unreachable "
                                    f"({type(e).__name__}: {e}); start it with `ray start --head`") from None
        _probe_gcs(address, cfg.connect_timeout_s)
    kw: dict[str, Any] = {"include_dashboard": False, "logging_level": "warning", "log_to_driver": False,
                          "ignore_reinit_error": True, "address": address}
    if cfg.node_ip and address != "local":
        kw["_node_ip_address"] = cfg.node_ip  # which of this machine's Ray nodes the service's driver joins
    if address != "local":
        # Ray ends a driver (std::_Exit) whose GCS has been unreachable for gcs_rpc_server_reconnect_timeout_s
        # (60 s): a lost head would take the service down. The runner notices a lost head itself (HEADLENS_RAY_
        # HEAD_LOST_S) and answers with an error; the service stays up. Read by Ray's core worker at ray.init.
        os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(RECONNECT_S))
    if address == "local" and cfg.num_cpus:
        kw["num_cpus"] = cfg.num_cpus
    where = (f"the Ray cluster at RAY_ADDRESS={address}" if cfg.address else
             "a new local Ray instance" if address == "local" else "Ray (this machine's cluster, or a new instance)")
    t0 = time.monotonic()
    try:  # in the calling thread: Ray's driver must be initialised from the thread that later uses it
        ray.init(**kw)
    except Exception as e:
        hint = ("; with token authentication, the head's token must be here too (~/.ray/auth_token, or "
                "RAY_AUTH_TOKEN)" if address != "local" else "")
        raise RunnerUnavailable(f"could not connect to {where}: {type(e).__name__}: "
                                f"{(str(e).splitlines() or [''])[0][:300]}{hint}") from None
    if time.monotonic() - t0 > cfg.connect_timeout_s:
        log.warning("connecting to %s took %.0f s", where, time.monotonic() - t0)
    # shut it down on close only when this process started it (not when it joined a running cluster); and have a
    # watchdog end it should this process die without closing (kill -9): Ray's agents would outlive it
    started = address == "local" or (address is None and ray.get_runtime_context().gcs_address is not None
                                     and _started_here(ray))
    if started:
        from . import ray_watchdog

        try:
            ray_watchdog.start()
        except OSError as e:
            log.warning("no watchdog for the local Ray instance (%s): after a kill -9 of the service, stop it with "
                        "`ray stop`", e)
    return ray, started


def _probe_gcs(address: str, timeout: float) -> None:
    """RunnerUnavailable unless a Ray GCS answers at `address` within `timeout` s: something else listening there
    (or a GCS that never answers) would otherwise hold `ray.init` for minutes. The probe runs in a helper thread
    (ray.init itself must run in the caller's), which is left behind if it hangs."""
    done: list[BaseException | None] = []

    def probe() -> None:
        try:
            from ray._raylet import GcsClient

            GcsClient(address=address)  # fetches the cluster id: a GCS answers at once
            done.append(None)
        except BaseException as e:  # noqa: BLE001  (reported below)
            done.append(e)

    t = threading.Thread(target=probe, name="headlens-ray-probe", daemon=True)
    t.start()
    t.join(timeout)
    if not done:
        raise RunnerUnavailable(f"no Ray cluster answered at RAY_ADDRESS={address} within {timeout:g} s "
                                f"(HEADLENS_RAY_CONNECT_TIMEOUT_S); is it the head's GCS port (ray start --head "
                                f"--port)?")
    if done[0] is not None:
        e = done[0]
        raise RunnerUnavailable(f"no Ray cluster at RAY_ADDRESS={address}: {type(e).__name__}: "
                                f"{(str(e).splitlines() or [''])[0][:300]}; with token authentication, the head's "
                                f"token must be here too (~/.ray/auth_token, or RAY_AUTH_TOKEN)")


def _started_here(ray: Any) -> bool:
    """Whether this process started the Ray instance it is connected to (rather than joining one)."""
    try:
        return bool(ray._private.worker.global_worker.node.is_head())  # a driver that started Ray owns its head
    except Exception:
        return False
