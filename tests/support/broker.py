"""A real broker in a subprocess, for crash, signal and client tests.

``BrokerProcess`` starts ``python -m broker`` on a free loopback port with its own
data directory, waits until ``/healthz`` says ready, and can ``kill()`` it (SIGKILL),
``terminate()`` it (SIGTERM, graceful) and ``start()`` it again on the same port and
data directory. The process is always reaped.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.servers import free_port as any_free_port

__all__ = ["BrokerProcess", "free_port", "stop_all"]

ROOT = Path(__file__).resolve().parents[2]

#: This process's share of the ports: pytest-xdist worker ``gwN`` of ``count`` takes
#: the ports ``p`` with ``p % count == N`` (one share without xdist).
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
_WORKERS = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port free now, outside the kernel's ephemeral range (no client
    connection's source port can take it before the broker binds it), never handed out
    before by this process, and from this xdist worker's share of the ports. A port is
    free only until its broker binds it, and again while that broker is down for a
    restart on the same port: without the shares another worker could pick it then
    (two brokers on one port: one fails to start, or a test talks to the wrong one)."""
    for _ in range(1000):
        port = any_free_port()
        if port % _WORKERS == _WORKER % _WORKERS and port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free port left in this worker's share")


#: How often :meth:`BrokerProcess.wait_ready` asks ``/healthz``. A broker is ready
#: ~0.25-0.5 s after its spawn (its imports, mostly); a poll refused before it listens
#: costs ~0.2 ms of this process's CPU, and every poll interval is wall time each of
#: the suite's hundreds of starts may wait past the ready broker (half of it on
#: average: 25 ms at the 50 ms this was).
POLL_S = 0.01

# Small segments and frequent checkpoints, so that a crash or a signal under load also
# lands during segment rollover and checkpoint writing.
STRESS_ARGS = (
    "--segment-max-bytes",
    "131072",
    "--checkpoint-wal-bytes",
    "262144",
    "--checkpoint-interval-s",
    "1",
)


def request(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    timeout_s: float = 30.0,
    host: str = "127.0.0.1",
) -> tuple[int, Any]:
    """One HTTP request to a broker on ``host``:``port`` (a non-bytes body is sent as
    JSON); returns (status, parsed JSON or raw bytes). Raises OSError when there is no
    answer (a broken one included)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
    except http.client.HTTPException as exc:
        raise OSError(str(exc)) from None
    finally:
        conn.close()
    try:
        return resp.status, json.loads(data)
    except ValueError:
        return resp.status, data


class BrokerProcess:
    def __init__(
        self,
        data_dir: Path,
        *,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.args = tuple(args)
        self.env = dict(env or {})
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"
        #: the AMQP port it listens on, when made by :func:`amqp_broker`
        self.amqp_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, wait_ready: bool = True, timeout_s: float = 60.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = dict(os.environ)
        env.pop("ACKBUS_FAULTS", None)
        env.pop("ACKBUS_FAULTS_ALLOWED", None)
        # No AMQP listener unless a test asks for one (ACKBUS_AMQP_PORT in env): the
        # default port 5672 would be shared by every broker a test run starts.
        env.setdefault("ACKBUS_AMQP_PORT", "0")
        env.update(self.env)
        if "ACKBUS_FAULTS" in self.env:
            env["ACKBUS_FAULTS_ALLOWED"] = "1"  # fault points are refused without it
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "broker",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(ROOT),
        )
        log.close()
        if wait_ready:
            self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, _ = self.request("GET", "/healthz", timeout_s=1.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(POLL_S)
        raise TimeoutError(f"broker not ready after {timeout_s} s:\n{self.log_tail()}")

    def request(
        self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None, timeout_s: float = 30.0
    ) -> tuple[int, Any]:
        """One HTTP request; returns (status, parsed JSON or raw bytes)."""
        return request(self.port, method, path, body, headers=headers, timeout_s=timeout_s)

    def drain(self, queue: str) -> list[dict[str, Any]]:
        """Every message left in ``queue``, taken as long leases that are never acked
        (so nothing is lost if the test looks again after a restart)."""
        out: list[dict[str, Any]] = []
        while True:
            status, body = self.request("POST", f"/queues/{queue}/get?max=1000&lease=600")
            assert status == 200, body
            if not body["messages"]:
                return out
            out.extend(body["messages"])

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM: a graceful shutdown; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def signal_stop(self) -> None:
        """SIGTERM without waiting (:func:`stop_all` waits)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def log_tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def __enter__(self) -> BrokerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def amqp_broker(data_dir: Path, env: dict[str, str] | None = None) -> BrokerProcess:
    """A broker (not started; a context manager starts and stops it) with its AMQP
    listener on a free port, ``amqp_port``."""
    port = free_port()
    proc = BrokerProcess(data_dir, env={**(env or {}), "ACKBUS_AMQP_PORT": str(port)})
    proc.amqp_port = port
    return proc


def stop_all(procs: Iterable[BrokerProcess]) -> None:
    """Stop several brokers (a cluster's nodes) as :meth:`BrokerProcess.stop` does each,
    but all at once: every one is sent SIGTERM first, then each is waited for (20 s,
    then SIGKILL). One after the other, each node's graceful shutdown waited for the
    previous one's (a second or more a test with replicated queues)."""
    procs = list(procs)
    for proc in procs:
        proc.signal_stop()
    for proc in procs:
        if proc.proc is None:
            continue
        try:
            proc.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.proc.kill()
            proc.proc.wait()
