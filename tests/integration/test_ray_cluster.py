"""The Ray runner on a cluster of three hosts: Linux network namespaces on a private bridge
(tests/integration/netns_cluster.py), Ray started with the ordinary `ray start --head` / `ray start --address`,
and the headlens service (`python -m backend serve`, HEADLENS_RUNNER=ray) on a fourth host joining the cluster as
its driver (a Ray node of 0 CPUs: Ray's driver needs a raylet on its own host). The test talks to the service over
HTTP through the bridge.

- every address is on the bridge: each host has only its loopback and its veth (no default route), and what
  listens in a host listens there;
- a sweep of 2 models (`default` and a tiny random Llama) x 4 tasks x 2 kinds (head_scores, icl_curve) spreads
  over the three hosts, each job's `ran_on` names its host, and a worker host killed mid-sweep (every process in its
  namespace, by PID) loses nothing: its running jobs rerun on the other hosts, the jobs it had finished are not
  run again, and the sweep's record says which were retried; the results are bit-identical to the local runner's;
- the head's host killed: the running sweep fails within seconds with a sentence naming the head, never hangs; the
  service stays up, says the cluster is lost (GET /cluster), and answers a toggle on its own local runner.

Marked `ray` (they run last) and `netns` (no shared local Ray instance: they bring their own cluster). Skipped, with
the reason, where network namespaces cannot be made (not root, no iproute2). Its wall and CPU time (the test's
processes plus every Ray and service process in the namespaces) are printed at the end (-s to see them).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from netns_cluster import NetnsHosts, RayHosts, ray_env, why_not  # noqa: E402
from hang import HANG_S  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.netns]
REPO = Path(__file__).resolve().parents[2]
TASKS = ["syn-sentiment", "syn-antonym", "syn-category", "syn-size"]
KINDS = ["head_scores", "icl_curve"]
PARAMS = {"prompts": 6, "head_scores.shots": 2, "icl_curve.shots": [0, 2]}
VOLATILE = ("seconds", "cache_hit")
PORT = 8765


class Service:
    """The headlens service in the `svc` host, over HTTP."""

    def __init__(self, url: str):
        self.url = url

    def call(self, method: str, path: str, body: Any = None, timeout: float = HANG_S) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"content-type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.call("POST", path, body)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, gpt2_tokenizer) -> str:
    from tiny_models import tiny_model

    folder = tmp_path_factory.mktemp("netns-models") / "tiny-llama"
    tiny_model("llama", seed=1).save_pretrained(folder)
    gpt2_tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Hosts head, w1, w2 (Ray: 1 CPU each) and svc (a Ray node of 0 CPUs, and the headlens service), all on one
    private bridge; removed afterwards, whatever happened."""
    why = why_not()
    if why:
        pytest.skip(f"no multi-host Ray test here: {why}")
    t0, cpu0 = time.monotonic(), sum(os.times()[:4])
    net = NetnsHosts.create(["head", "w1", "w2", "svc"])
    tmp = Path(f"/tmp/hlr-{net.run_id}")  # short: Ray's socket paths live under the temp dirs
    ray = RayHosts(net, "head", tmp)
    env = ray_env(tmp / "token")
    info: dict[str, Any] = {"net": net, "ray": ray, "tmp": tmp}
    try:
        ray.start_head(env)
        ray.wait_head()
        for name in ("w1", "w2"):
            ray.start_node(name, env)
        ray.start_node("svc", env, num_cpus=0)
        svc = net.hosts["svc"]
        cache = tmp / "cache"
        senv = {**env, "HEADLENS_RUNNER": "ray", "RAY_ADDRESS": ray.address, "HEADLENS_RAY_NODE_IP": svc.ip,
                "HEADLENS_RAY_MAX_ACTORS": "3", "HEADLENS_RAY_HEAD_LOST_S": "5", "HEADLENS_RAY_RETRIES": "2",
                "HEADLENS_CACHE_DIR": str(cache), "HEADLENS_TIMINGS": "0", "PYTHONPATH": str(REPO),
                "HEADLENS_TOKEN": ""}
        svc.popen([sys.executable, "-m", "backend", "serve", "--host", svc.ip, "--port", str(PORT),
                   "--log-level", "warning"], env=senv, log=tmp / "service.log")
        service = Service(f"http://{svc.ip}:{PORT}")
        deadline = time.monotonic() + HANG_S
        while True:
            try:
                service.get("/health")
                break
            except (OSError, AssertionError):
                if time.monotonic() > deadline or svc.procs[-1].poll() is not None:
                    raise RuntimeError(f"the service did not start: {(tmp / 'service.log').read_text()[-3000:]}")
                time.sleep(0.5)
        info.update(service=service, started_s=time.monotonic() - t0)
        yield info
    finally:
        cpu = sum(h.cpu_s() for h in net.hosts.values())
        log_tail = (tmp / "service.log").read_text()[-2000:] if (tmp / "service.log").is_file() else ""
        net.close()
        left = net.leftovers()
        print(f"\nnetns cluster: {time.monotonic() - t0:.1f} s wall, {cpu:.1f} CPU-s in the hosts' processes, "
              f"{sum(os.times()[:4]) - cpu0:.1f} CPU-s in the test's own; load {os.getloadavg()[0]:.2f}; "
              f"hosts {', '.join(f'{h.name} {h.ip}' for h in net.hosts.values())}; left over: {left}")
        if log_tail:
            print("service log (tail):\n" + log_tail)
        shutil.rmtree(tmp, ignore_errors=True)  # the hosts' Ray temp dirs, logs, token and cache
        assert not left, f"namespaces/links left over: {left}"


def run_sweep(service: Service, models: list[str], on_poll: Any = None, seeds: list[int] | None = None,
              tasks: list[str] | None = None, timeout: float = HANG_S) -> dict[str, Any]:
    sw = service.post("/sweeps", {"models": models, "tasks": tasks or TASKS, "kinds": KINDS, "seeds": seeds or [0],
                                  "params": PARAMS})
    deadline = time.monotonic() + timeout
    while True:
        s = service.get(f"/sweeps/{sw['id']}")
        if s["status"] != "running":
            return s
        if on_poll is not None:
            on_poll(s)
        assert time.monotonic() < deadline, f"the sweep did not finish within {timeout} s: {s['counts']}"
        time.sleep(0.5)


def results(service: Service, sweep: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
    out = {}
    for j in sweep["jobs"]:
        r = service.get(f"/jobs/{j['job_id']}")["result"]
        out[(j["model"], j["task"], j["kind"])] = {k: v for k, v in r.items() if k not in VOLATILE}
    return out


def local_baseline(models: list[str]) -> dict[tuple, dict[str, Any]]:
    """The same sweep through the local runner in this process, on one thread (as a Ray worker of 1 CPU)."""
    import torch

    from backend.service.execute import make_executor
    from backend.service.jobs import LocalJobRunner
    from backend.service.limits import Limits
    from backend.service.model_pool import ModelPool
    from backend.service.sweeps import SweepManager, SweepRequest, sweep_cells
    from backend.service.task_store import TaskStore

    pool, tasks, limits = ModelPool(), TaskStore(), Limits()
    runner = LocalJobRunner(make_executor(pool, tasks), limits=limits)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        req = SweepRequest(models=models, tasks=TASKS, kinds=KINDS, seeds=[0], params=PARAMS)
        manager = SweepManager(runner, limits, keep_results=True)
        sid = manager.start(req, sweep_cells(req, pool, tasks, limits))["id"]
        final = manager.wait(sid, timeout=HANG_S)
        assert final["status"] == "done", final["message"]
        return {(r["model"], r["task"], r["kind"]): {k: v for k, v in r["result"].items() if k not in VOLATILE}
                for r in manager.results(sid)}
    finally:
        torch.set_num_threads(threads)
        runner.close()


def test_every_address_is_on_the_private_bridge(cluster):
    net = cluster["net"]
    ips = {h.name: h.ip for h in net.hosts.values()}
    assert len(set(ips.values())) == 4 and all(ip.startswith(f"10.77.{net.subnet}.") for ip in ips.values())
    for h in net.hosts.values():
        addrs = h.run(["ip", "-4", "-o", "addr"]).stdout.split("\n")
        v4 = sorted(line.split()[3].split("/")[0] for line in addrs if line.strip())
        assert v4 == sorted(["127.0.0.1", h.ip]), (h.name, v4)
        assert "default" not in h.run(["ip", "route"]).stdout  # nothing routes off the bridge
        for addr in h.listening():  # in a namespace, a wildcard bind covers only its loopback and its veth
            host = addr.rsplit(":", 1)[0].strip("[]")
            assert host in (h.ip, "127.0.0.1", "*", "0.0.0.0", "::", "::1", "::ffff:127.0.0.1") or \
                host.startswith("fe80"), (h.name, addr)
    c = cluster["service"].get("/cluster")
    assert c["runner"] == "ray" and c["address"] == cluster["ray"].address and c["lost"] is None
    nodes = {n["node_ip"]: n for n in c["nodes"] if n["alive"]}
    assert set(nodes) == set(ips.values())
    assert {ip: nodes[ip]["cpus"] for ip in nodes} == {ips["head"]: 1, ips["w1"]: 1, ips["w2"]: 1, ips["svc"]: 0}
    assert nodes[ips["head"]]["head"] and not nodes[ips["w1"]]["head"]
    print(f"\nhosts: {ips}; cluster up (and the service) in {cluster['started_s']:.1f} s")


def test_a_sweep_over_three_hosts_survives_a_lost_worker_host(cluster, tiny_llama):
    """16 jobs over head, w1, w2; w2 killed (every process in its namespace) while it runs a job, after at least one
    job is done."""
    net, service = cluster["net"], cluster["service"]
    w2 = net.hosts["w2"]
    workers = {net.hosts[n].ip for n in ("head", "w1", "w2")}
    models = ["default", tiny_llama]
    killed: dict[str, Any] = {}

    def kill_w2(s: dict[str, Any]) -> None:
        if killed:
            return
        on_w2 = [j for j in s["jobs"] if (j["ran_on"] or {}).get("node_ip") == w2.ip]
        running = any(j["status"] == "running" for j in on_w2)
        finished = any(j["status"] == "done" for j in on_w2)
        if running and (finished or s["counts"]["done"] >= 6):  # best after w2 has finished a job
            killed["done_on_w2"] = {j["job_id"] for j in on_w2 if j["status"] == "done"}
            killed["running_on_w2"] = {j["job_id"] for j in on_w2 if j["status"] == "running"}
            killed["pids"] = w2.kill()
            killed["at"] = time.monotonic()

    t0 = time.monotonic()
    final = run_sweep(service, models, on_poll=kill_w2)
    wall = time.monotonic() - t0
    assert killed, f"w2 never ran a job mid-sweep: {final['message']} {final['counts']} {final['placement']}"
    assert final["status"] == "done" and final["counts"]["done"] == 16 and final["counts"]["error"] == 0, final
    jobs = final["jobs"]
    assert len({j["job_id"] for j in jobs}) == 16
    hosts = {j["job_id"]: j["ran_on"]["node_ip"] for j in jobs}
    lost_on = {x["node_ip"] for j in jobs for x in j["ran_on"]["lost"]}
    assert set(hosts.values()) <= workers and set(hosts.values()) | lost_on == workers, (hosts, lost_on, killed, final["placement"], final["message"])  # all three
    # what w2 was running when it died reran elsewhere (retried, its lost attempt on w2); what it had finished did
    # not run again (its record still names w2, no lost attempt)
    placement = final["placement"]
    retried = {r["job_id"]: r for r in placement["retried"]}
    assert killed["running_on_w2"] <= set(retried)
    for jid, r in retried.items():
        assert r["lost_on"] == [w2.ip] and r["ran_on"] in workers - {w2.ip} and r["status"] == "done", r
    for jid in killed["done_on_w2"]:
        assert hosts[jid] == w2.ip and jid not in retried
    assert "retried after their worker was lost (on " + w2.ip in final["message"]
    assert sum(placement["hosts"].values()) == 16 and set(placement["hosts"]) <= workers
    got = results(service, final)
    base = local_baseline(models)
    assert got.keys() == base.keys() and len(got) == 16
    for key in base:
        assert got[key] == base[key], key
    print(f"\nsweep: {wall:.1f} s; jobs per host {placement['hosts']}; w2 ({w2.ip}) killed (pids {killed['pids']}) "
          f"while running {len(killed['running_on_w2'])} job(s), after finishing {len(killed['done_on_w2'])}; "
          f"retried: {[(r['kind'], r['task'], r['lost_on'], r['ran_on']) for r in placement['retried']]}; "
          f"message: {final['message']!r}; 16/16 results equal the local runner's")


def test_the_head_host_killed_is_an_error_not_a_hang(cluster):
    net, service = cluster["net"], cluster["service"]
    head = net.hosts["head"]
    killed: dict[str, Any] = {}

    def kill_head(s: dict[str, Any]) -> None:
        if not killed and s["counts"]["running"] >= 1:
            killed["pids"], killed["at"] = head.kill(), time.monotonic()

    final = run_sweep(service, ["default"], on_poll=kill_head, seeds=[1])  # not cached: seed 1
    assert killed, "no job ran"
    took = time.monotonic() - killed["at"]
    assert final["counts"]["error"] >= 1 and final["counts"]["done"] + final["counts"]["error"] == 8, final
    assert "stopped answering" in final["message"] and cluster["ray"].address in final["message"], final["message"]
    failed = [j for j in final["jobs"] if j["status"] == "error"]
    assert failed and all("head" in j["error"] for j in failed), failed
    c = service.get("/cluster")
    assert c["lost"] and "stopped answering" in c["lost"]
    # the service keeps answering: a toggle runs on its own local runner
    toggle = service.post("/jobs", {"kind": "head_scores", "model": "default", "task": "syn-antonym", "shots": 1,
                                    "prompts": 2})
    deadline = time.monotonic() + HANG_S
    while (j := service.get(f"/jobs/{toggle['id']}"))["status"] in ("queued", "running"):
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert j["status"] == "done" and j["ran_on"]["runner"] == "local", j
    print(f"\nhead {head.ip} killed (pids {killed['pids']}): the sweep ended {took:.1f} s later with "
          f"{final['message']!r}; a toggle then ran on the service's local runner")
