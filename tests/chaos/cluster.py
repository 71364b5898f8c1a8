"""The cluster under test: three etcd members and N broker nodes, each a subprocess
started, signalled and stopped by PID.

Two placements, one interface: on loopback (every member on 127.0.0.1, free ports),
or each member in its own network namespace (:mod:`tests.chaos.netns`, fixed ports
on the member's own address, started through ``ip netns exec``). One node, the
*clock node*, runs under libfaketime with a timestamp file, so that the nemesis can
jump its wall clock while it runs (:meth:`Cluster.jump_clock`).
"""

from __future__ import annotations

import base64
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.chaos.netns import Topology
from tests.support.broker import ROOT, free_port
from tests.support.broker import request as broker_request
from tests.support.etcd import etcd_binary

__all__ = ["QUEUE", "Cluster", "Member", "request"]

QUEUE = "chaos"
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
#: beyond loopback a broker serves only once it has users, and nodes with users
#: forward to one another only with the cluster secret
USER, PASSWORD, SECRET = "chaos", "chaos-password", "chaos-cluster-secret"


def request(
    host: str, port: int, method: str, path: str, body: Any = None, *,
    headers: dict[str, str] | None = None, timeout_s: float = 10.0,
) -> tuple[int, Any]:
    """One HTTP request (a non-bytes body is sent as JSON); (status, parsed JSON or
    raw bytes). Raises OSError when there is no answer."""
    return broker_request(port, method, path, body, headers=headers, timeout_s=timeout_s, host=host)


class Member:
    """One subprocess (an etcd member or a node): its command, its log, its PID."""

    def __init__(self, name: str, host: str, port: int, argv: list[str], log_path: Path,
                 env: dict[str, str] | None = None, health: str = "/health") -> None:
        self.name = name
        self.host = host
        self.port = port
        self.argv = argv
        self.env = env or {}
        self.log_path = log_path
        self.health = health
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        #: headers every request to it carries (credentials)
        self.auth: dict[str, str] = {}
        #: run before a start without this data directory (a node's user, made in it)
        self.before_start: tuple[list[str], Path] | None = None

    def request(self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None,
                timeout_s: float = 10.0) -> tuple[int, Any]:
        """One HTTP request to this member, with its credentials."""
        return request(self.host, self.port, method, path, body, headers={**self.auth, **(headers or {})}, timeout_s=timeout_s)

    def start(self, timeout_s: float = 60.0, *, wait: bool = True) -> None:
        assert not self.running(), f"{self.name} already running"
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.pop("ACKBUS_FAULTS", None)
        if self.before_start is not None and not self.before_start[1].exists():
            subprocess.run(self.before_start[0], input=PASSWORD + "\n", text=True, capture_output=True,
                           env=env, cwd=str(ROOT), check=False, timeout=60)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
        self.paused = False
        if wait:
            self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc and self.proc.returncode}):\n{self.log_tail()}")
            try:
                if self.request("GET", self.health, timeout_s=1.0)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout_s} s:\n{self.log_tail()}")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def alive(self) -> bool:
        """Running and not paused: expected to answer."""
        return self.running() and not self.paused

    def kill(self) -> None:
        """SIGKILL (a crash), reaped."""
        if self.proc is not None and self.proc.poll() is None:
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.paused = False

    def pause(self) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.running() and self.paused:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s; always reaped."""
        self.resume()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Cluster:
    """Three etcd members (``e1``..``e3``) and the nodes (``n1``..), on loopback or in
    the namespaces of ``topology``."""

    ETCD_MEMBERS = ("e1", "e2", "e3")

    def __init__(self, directory: Path, nodes: int, ttl_s: int, topology: Topology | None = None,
                 clock_node: bool = True) -> None:
        self.dir = directory
        self.ttl_s = ttl_s
        self.topology = topology
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not installed (Debian package etcd-server; or set ETCD_BINARY)")
        node_names = [f"n{i + 1}" for i in range(nodes)]
        #: the node whose wall clock the nemesis may jump (None without libfaketime)
        self.clock_node: str | None = node_names[-1] if clock_node and os.path.exists(LIBFAKETIME) else None
        self.clock_file = directory / "faketime"
        self.clock_file.write_text("+0\n")
        self.etcd: dict[str, Member] = {}
        peers: dict[str, tuple[str, int, int]] = {}
        for name in self.ETCD_MEMBERS:
            host = self.host(name)
            client, peer = (2379, 2380) if topology else (free_port(), free_port())
            peers[name] = (host, client, peer)
        initial = ",".join(f"{n}=http://{h}:{p}" for n, (h, _c, p) in peers.items())
        for name, (host, client, peer) in peers.items():
            (directory / name).mkdir(parents=True, exist_ok=True)
            argv = [
                binary, "--name", name, "--data-dir", str(directory / name / "data"),
                "--listen-client-urls", f"http://{host}:{client}", "--advertise-client-urls", f"http://{host}:{client}",
                "--listen-peer-urls", f"http://{host}:{peer}", "--initial-advertise-peer-urls", f"http://{host}:{peer}",
                "--initial-cluster", initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", f"chaos-{os.getpid()}", "--log-level", "warn",
            ]
            self.etcd[name] = Member(name, host, client, self.prefix(name) + argv, directory / f"{name}.log")
        endpoints = ",".join(f"http://{m.host}:{m.port}" for m in self.etcd.values())
        self.nodes: dict[str, Member] = {}
        for name in node_names:
            host = self.host(name)
            port = 8081 if topology else free_port()
            env = {"ACKBUS_AMQP_PORT": "0"}
            if name == self.clock_node:
                # the wall clock only: trio's deadlines and the lease are on the
                # monotonic clock, which a real clock step does not move either. (With
                # libfaketime 0.9.10 so set, Python's time.sleep fails with EINVAL; the
                # broker never calls it: trio waits in epoll.)
                env.update({
                    "LD_PRELOAD": LIBFAKETIME, "FAKETIME_TIMESTAMP_FILE": str(self.clock_file),
                    "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                })
            argv = [
                sys.executable, "-m", "broker", "--host", host, "--port", str(port),
                "--data-dir", str(directory / name / "data"), "--etcd", endpoints, "--node-name", name,
                "--advertise-url", f"http://{host}:{port}", "--cluster-lease-ttl-s", str(ttl_s),
            ]
            if topology is not None:
                argv += ["--cluster-secret", SECRET]
            (directory / name).mkdir(parents=True, exist_ok=True)
            node = self.nodes[name] = Member(name, host, port, self.prefix(name) + argv, directory / f"{name}.log", env, "/healthz")
            if topology is not None:
                credentials = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                node.auth = {"Authorization": f"Basic {credentials}"}
                node.before_start = ([
                    sys.executable, "-m", "broker", "users", "--data-dir", str(self.data_dir(name)), "add", USER,
                    "--tags", "administrator", "--configure", ".*", "--write", ".*", "--read", ".*", "--password-stdin",
                ], self.data_dir(name))

    # ------------------------------------------------------------- placement

    def host(self, member: str) -> str:
        return self.topology.addresses[member] if self.topology else "127.0.0.1"

    def prefix(self, member: str) -> list[str]:
        return self.topology.exec_prefix(member) if self.topology else []

    def data_dir(self, node: str) -> Path:
        return self.dir / node / "data"

    # ------------------------------------------------------------- life

    def start(self) -> None:
        for member in self.etcd.values():
            member.start(wait=False)
        for member in self.etcd.values():
            member.wait_ready(60)
        for node in self.nodes.values():
            node.start()

    def stop(self) -> None:
        if self.topology is not None:
            self.topology.heal()
        for node in self.nodes.values():
            node.stop()
        for member in self.etcd.values():
            member.stop()

    def restart_when_free(self, node: str, *, wipe: bool = False) -> None:
        """Start a killed node again once its lease lapsed (its name is free)."""
        member = self.nodes[node]
        if wipe:
            shutil.rmtree(self.data_dir(node), ignore_errors=True)
        deadline = time.monotonic() + self.ttl_s + 30
        while time.monotonic() < deadline:
            try:
                member.start(timeout_s=30)
                return
            except (RuntimeError, TimeoutError):
                member.kill()
                time.sleep(0.5)  # the name was still held (or etcd unreachable): again

    def restart_etcd(self, name: str) -> None:
        member = self.etcd[name]
        member.start(wait=False)
        try:
            member.wait_ready(30)
        except (RuntimeError, TimeoutError):
            pass  # it rejoins in the background, or the heal at the end restarts it

    def heal(self) -> None:
        """Every member running and unpaused, every partition removed, clocks true."""
        if self.topology is not None:
            self.topology.heal()
        self.jump_clock(0)
        for name, member in self.etcd.items():
            member.resume()
            if not member.running():
                self.restart_etcd(name)
        for name, node in self.nodes.items():
            node.resume()
            if not node.running():
                self.restart_when_free(name)

    def jump_clock(self, offset_s: int) -> None:
        """Set the clock node's wall clock ``offset_s`` from the true time."""
        self.clock_file.write_text(f"{offset_s:+d}\n")

    # ------------------------------------------------------------- views

    def status(self) -> dict[str, Any] | None:
        """The queue's replication as some live node sees it."""
        for name in random.sample(list(self.nodes), len(self.nodes)):
            node = self.nodes[name]
            if not node.alive():
                continue
            try:
                status, body = node.request("GET", "/cluster", timeout_s=2)
            except OSError:
                continue
            if status == 200 and isinstance(body, dict):
                return dict(body.get("replicated_queues", {}).get(QUEUE) or {})
        return None

    def leader(self) -> Member | None:
        info = self.status()
        name = info.get("leader") if info else None
        return self.nodes[name] if name in self.nodes and self.nodes[name].alive() else None

    def any_node(self) -> Member | None:
        live = [n for n in self.nodes.values() if n.alive()]
        return random.choice(live) if live else None
