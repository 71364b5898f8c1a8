"""The null AMQP peer (``--peer null``, with ``--amqp``): pika's ceiling, not a broker.

:class:`NullAMQPServer` has the interface of the other servers in ``bench.servers``.
It starts ``python -m bench.nullamqp`` (that module says what it answers and how): a
single-threaded AMQP 0-9-1 server on 127.0.0.1 that speaks just enough of the protocol
for the pika worker (``bench/worker_rabbitmq.py``, unchanged) and does no broker work.
It keeps nothing on disk, no messages and no state across a restart: a queue is a
count and one message to repeat; confirms answer each chunk read, and a consumer's
acks are answered with as many new deliveries, pre-encoded.

So pika's rate against it is the most any broker could get with that client workload
on this machine: its column is an upper bound, and ackbus/null says how much of it a
broker reaches. Its "broker CPU per message" is what doing nothing costs in Python.
Workloads it has no equivalent for (latency at a fixed rate, recovery, dead letters,
the ackbus-only ones) are not run on it (``Workload.peers``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.nullamqp import PROTOCOL_HEADER
from bench.procs import code_root
from bench.servers import (
    ServerError,
    ServerProcess,
    _refuse_if_aborted,
    free_port,
)

__all__ = ["NullAMQPServer"]


class NullAMQPServer(ServerProcess):
    """The null peer as the benchmark starts it: a subprocess, by PID (see the module)."""

    side = "null"
    name = "the null AMQP peer"
    stop_timeout_s = 10.0
    worker_side = "rabbitmq"  # the pika workers, unchanged

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.log_path = workdir / "nullamqp.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.aborted = False

    def spawn(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        _refuse_if_aborted(self)
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(code_root()) + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.nullamqp", "--port", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=str(code_root()), env=env)

    def wait_ready(self, timeout_s: float) -> None:
        """Ready: it answers the protocol header with Connection.Start."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            self._check_alive()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as sock:
                    sock.sendall(PROTOCOL_HEADER)
                    if sock.recv(7)[:1] == b"\x01":
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise ServerError(f"the null AMQP peer not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def queue_messages(self, queue: str) -> int:
        """The count a passive queue.declare answers (pika, as for RabbitMQ)."""
        import pika  # type: ignore[import-untyped]

        conn = pika.BlockingConnection(pika.ConnectionParameters(
            host="127.0.0.1", port=self.port, connection_attempts=1, socket_timeout=5))
        try:
            return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
        finally:
            conn.close()

    def wait_queue(self, queue: str, expected: int, timeout_s: float) -> None:
        deadline, last = time.perf_counter() + timeout_s, None
        while time.perf_counter() < deadline:
            self._check_alive()
            last = self.queue_messages(queue)
            if last == expected:
                return
            time.sleep(0.02)
        raise ServerError(f"queue {queue} did not show {expected} messages in time (last: {last})")

    def client_spec(self) -> dict[str, Any]:
        return {"port": self.port}

    def wal_bytes_written(self) -> int | None:
        """It writes nothing: not measured."""
        return None

    def versions(self) -> dict[str, str]:
        from importlib.metadata import PackageNotFoundError, version

        out = {"null": "bench.server_nullamqp (no broker: pika's ceiling)"}
        try:
            out["pika"] = version("pika")
        except PackageNotFoundError:
            out["pika"] = "not installed"
        return out

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
