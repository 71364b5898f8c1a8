"""A private three-node RabbitMQ cluster on this machine, for the quorum-queue part of
``scripts/bench --cluster N`` (docs/benchmarks.md, "Cluster").

Three :class:`bench.servers.RabbitServer` nodes (``bench1@localhost`` ...), each with its
own directories and ports, share one epmd (started here, on a free loopback port, and
stopped here by PID) and one Erlang cookie, and list one another in their
``rabbitmq.conf`` (``cluster_formation.peer_discovery_backend = classic_config``), so
they form the cluster by themselves on first boot: no ``rabbitmqctl join_cluster``
round trips. Ready means every node opens an AMQP connection and the first node's
``rabbitmqctl cluster_status`` lists all three as running.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.servers import RABBITMQ_SERVER, RabbitServer, ServerError, _end, free_port

__all__ = ["RabbitCluster"]

RABBITMQCTL = RABBITMQ_SERVER.parent / "rabbitmqctl"


class RabbitCluster:
    """``size`` RabbitMQ nodes clustered; clients talk to ``members[0]``."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.workdir = workdir
        self.epmd_port = free_port()
        cookie = secrets.token_hex(16).upper()
        names = tuple(f"bench{i}@localhost" for i in range(1, size + 1))
        self.members = [
            RabbitServer(workdir / name.split("@")[0], nodename=name, epmd_port=self.epmd_port, cookie=cookie, cluster=names)
            for name in names
        ]
        self.epmd: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float) -> float:
        """Start every node at once and wait until the cluster has formed; the
        seconds that took. Raises :class:`ServerError` when it does not form."""
        t0 = time.perf_counter()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.epmd = subprocess.Popen(
            ["epmd", "-address", "127.0.0.1", "-port", str(self.epmd_port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "ERL_EPMD_ADDRESS": "127.0.0.1", "ERL_EPMD_PORT": str(self.epmd_port)},
        )
        for member in self.members:
            member.spawn()
        for member in self.members:
            member.wait_ready(t0 + timeout_s - time.perf_counter())
        while True:
            running = self.running_nodes()
            if len(running) == len(self.members):
                return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout_s:
                raise ServerError(f"the RabbitMQ cluster did not form within {timeout_s:.0f} s: running {running}")
            time.sleep(0.5)

    def running_nodes(self) -> list[str]:
        """The nodes the first member counts as running in its cluster."""
        first = self.members[0]
        try:
            out = subprocess.run(
                [str(RABBITMQCTL), "-n", first.nodename, "cluster_status", "--formatter", "json"],
                env=first._env(), capture_output=True, text=True, timeout=60,
            )
            status: dict[str, Any] = json.loads(out.stdout) if out.returncode == 0 else {}
        except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
            return []
        return [str(name) for name in status.get("running_nodes", [])]

    def client_spec(self) -> dict[str, Any]:
        return self.members[0].client_spec()

    def stop(self) -> None:
        for member in self.members:
            member.stop()
        if self.epmd is not None:
            _end(self.epmd, signal.SIGTERM, 10)

    def remove(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
