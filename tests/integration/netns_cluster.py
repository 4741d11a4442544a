"""Hosts made of Linux network namespaces, for the multi-host Ray tests (tests/integration/test_ray_cluster.py).

`NetnsHosts.create(names)` makes one network namespace per name (unique per run: `hl<run>-<name>`), each joined by a
veth pair to a private bridge in the root namespace, on a /24 of 10.77.x.0 (x chosen free on this machine): the
bridge is 10.77.x.1, the hosts 10.77.x.11, .12, ... Each namespace has only its loopback and its veth, no default
route: nothing it runs can reach (or be reached from) anything but the bridge. The root namespace reaches the hosts
through the bridge address (the test talks to the service that way).

`host.run(argv)` / `host.popen(argv)` run a command in a host (`ip netns exec`); `host.pids()` are the processes in it
(`ip netns pids`), `host.kill()` sends them SIGKILL (by PID: `ray stop` would stop every Ray on the machine, since
network namespaces share one PID space). `close()` kills what runs in every host and deletes the namespaces, veths and
bridge; it is safe to call twice and runs on failure too (the fixture's finally).

`RayHosts` starts Ray on them with the ordinary commands: `ray start --head --block` on the first, `ray start
--address` on the others, each with its own --temp-dir (Ray's sessions do not collide), 1 CPU and a small object
store.

Needs root and iproute2; `why_not()` says in a sentence why the namespaces cannot be made here (the tests skip with it).
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hang import HANG_S

RAY_BIN = Path(sys.executable).with_name("ray")
OBJECT_STORE = 100_000_000


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=HANG_S)


def why_not() -> str | None:
    """None when network namespaces can be made here, else why not (one sentence)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed: no network namespaces for the multi-host Ray test"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CI runs this test as root)"
    name = f"hlprobe{secrets.token_hex(3)}"
    r = _ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return f"`ip netns add` failed here ({r.stderr.strip()[:200]}): no network namespaces for the multi-host test"
    _ip("netns", "del", name, check=False)
    return None


def _free_subnet() -> int:
    used = _ip("-4", "-o", "addr").stdout + _ip("-4", "route").stdout
    for _ in range(200):
        x = secrets.randbelow(250) + 1
        if f"10.77.{x}." not in used:
            return x
    raise RuntimeError("no free 10.77.x.0/24 subnet on this machine")


def _cpu(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children (/proc/<pid>/stat), 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    f = text[text.rindex(")") + 2:].split()
    return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")


@dataclass
class Host:
    """One network namespace: its name, address, and what the test started in it."""

    name: str
    netns: str
    ip: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    cpu_killed_s: float = 0.0  # CPU seconds of the processes `kill` ended (read just before)

    def argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, argv: list[str], env: dict[str, str] | None = None, timeout: float = HANG_S
            ) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(argv), env=env, capture_output=True, text=True, timeout=timeout)

    def popen(self, argv: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> subprocess.Popen:
        out = open(log, "ab") if log else subprocess.DEVNULL
        p = subprocess.Popen(self.argv(argv), env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def pids(self) -> list[int]:
        r = _ip("netns", "pids", self.netns, check=False)
        return [int(x) for x in r.stdout.split()] if r.returncode == 0 else []

    def kill(self, sig: int = signal.SIGKILL) -> list[int]:
        """Send `sig` to every process in this namespace (by PID); the PIDs signalled. Repeats until none is left
        (a dying raylet's children)."""
        hit: list[int] = []
        for _ in range(20):
            pids = [p for p in self.pids() if p != os.getpid()]
            if not pids:
                break
            self.cpu_killed_s += sum(_cpu(p) for p in pids if p not in hit)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                    hit.append(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        for p in self.procs:
            try:
                p.wait(timeout=HANG_S)
            except subprocess.TimeoutExpired:
                pass
        return sorted(set(hit))

    def cpu_s(self) -> float:
        """CPU seconds of the processes in this namespace now, plus those `kill` ended."""
        return self.cpu_killed_s + sum(_cpu(p) for p in self.pids())

    def listening(self) -> list[str]:
        """The local addresses of the TCP sockets listening in this namespace (`ss -ltn`)."""
        r = self.run(["ss", "-Hltn"])
        return [line.split()[3] for line in r.stdout.splitlines() if line.strip()]


@dataclass
class NetnsHosts:
    """Network namespaces on a private bridge (see the module's docstring)."""

    run_id: str
    subnet: int
    bridge: str
    hosts: dict[str, Host]
    veths: list[str] = field(default_factory=list)
    closed: bool = False

    @property
    def bridge_ip(self) -> str:
        return f"10.77.{self.subnet}.1"

    @classmethod
    def create(cls, names: list[str]) -> "NetnsHosts":
        run = secrets.token_hex(3)
        x = _free_subnet()
        self = cls(run, x, f"hlbr{run}", {})
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, name in enumerate(names):
                h = Host(name, f"hl{run}-{name}", f"10.77.{x}.{11 + i}")
                _ip("netns", "add", h.netns)
                self.hosts[name] = h
                outer, inner = f"hl{run}o{i}", f"hl{run}i{i}"
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                self.veths.append(outer)
                _ip("link", "set", inner, "netns", h.netns)
                _ip("link", "set", outer, "master", self.bridge, "up")
                _ip("-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", inner)
                _ip("-n", h.netns, "link", "set", inner, "up")
                _ip("-n", h.netns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for h in self.hosts.values():
            h.kill()
        for h in self.hosts.values():
            _ip("netns", "del", h.netns, check=False)
        for v in self.veths:
            _ip("link", "del", v, check=False)  # gone with its namespace's peer already, as a rule
        _ip("link", "del", self.bridge, check=False)

    def leftovers(self) -> list[str]:
        """What of this run is still on the machine (empty after close)."""
        ns = _ip("netns", "list", check=False).stdout
        links = _ip("-o", "link", check=False).stdout
        return [n for n in [h.netns for h in self.hosts.values()] if n in ns] + \
            [n for n in [self.bridge, *self.veths] if f" {n}:" in links or f" {n}@" in links]


def ray_env(token_path: Path, **extra: str) -> dict[str, str]:
    """The environment for Ray's processes in the hosts: this one without its Ray settings, with token
    authentication on this run's own token (`token_path`, written here when absent)."""
    if not token_path.is_file():
        token_path.parent.mkdir(parents=True, exist_ok=True)
        token_path.write_text(secrets.token_hex(32))
        token_path.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path), **extra)
    return env


@dataclass
class RayHosts:
    """Ray on hosts: a head (`ray start --head --block`) and nodes (`ray start --address`)."""

    net: NetnsHosts
    head: str
    tmp: Path
    port: int = 6379

    @property
    def address(self) -> str:
        return f"{self.net.hosts[self.head].ip}:{self.port}"

    def temp_dir(self, name: str) -> Path:
        return self.tmp / name

    def start_head(self, env: dict[str, str], num_cpus: int = 1) -> None:
        h = self.net.hosts[self.head]
        self.temp_dir(h.name).mkdir(parents=True, exist_ok=True)
        h.popen([str(RAY_BIN), "start", "--head", f"--node-ip-address={h.ip}", f"--port={self.port}",
                 f"--num-cpus={num_cpus}", f"--object-store-memory={OBJECT_STORE}", "--include-dashboard=false",
                 "--disable-usage-stats", f"--temp-dir={self.temp_dir(h.name)}", "--block"], env=env,
                log=self.tmp / f"{h.name}.log")

    def start_node(self, name: str, env: dict[str, str], num_cpus: int = 1, timeout: float = HANG_S) -> None:
        h = self.net.hosts[name]
        self.temp_dir(h.name).mkdir(parents=True, exist_ok=True)
        r = h.run([str(RAY_BIN), "start", f"--address={self.address}", f"--node-ip-address={h.ip}",
                   f"--num-cpus={num_cpus}", f"--object-store-memory={OBJECT_STORE}", "--disable-usage-stats",
                   f"--temp-dir={self.temp_dir(h.name)}"], env=env, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"ray start on {name} ({h.ip}) failed: {(r.stdout + r.stderr)[-1500:]}")

    def wait_head(self, timeout: float = HANG_S) -> None:
        """Until the head's GCS port answers (from the root namespace, through the bridge)."""
        import socket

        h = self.net.hosts[self.head]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in h.procs):
                raise RuntimeError(f"ray start --head exited: {(self.tmp / f'{h.name}.log').read_text()[-1500:]}")
            try:
                socket.create_connection((h.ip, self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"the Ray head at {self.address} did not answer within {timeout:.0f} s")

