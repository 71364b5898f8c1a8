"""The brokers under test: start, crash with ``kill -9``, restart, stop — by PID.

:class:`AckbusServer` runs ``python -m broker`` on a free loopback port with a fresh
data directory and ``--fsync always``; ready means ``GET /healthz`` answers 200 (the
broker says so once recovery is finished).

:class:`RabbitServer` runs a private RabbitMQ node that shares nothing with a system
RabbitMQ: its own node name (``bench@localhost``), Mnesia and log directories under
the run's directory, its own ``HOME`` (so the Erlang cookie it creates lands there),
an empty plugin list, free ports for AMQP, Erlang distribution and epmd; every
listener bound to 127.0.0.1 (``RABBITMQ_NODE_IP_ADDRESS``, ``ERL_EPMD_ADDRESS``,
``-kernel inet_dist_use_interface``). We start epmd ourselves (in the foreground, on
its own port) so that we can stop it by PID; ``RUNNING_UNDER_SYSTEMD=true`` makes
``rabbitmq-server`` exec the Erlang VM instead of forking it, so the PID we start is
``beam.smp`` itself. Ready means an AMQP connection opens.

Redis (``--peer redis``) lives in ``bench.server_redis`` and shares the helpers here.

Nothing here is stopped by name: each server remembers the PIDs it started (and, for
``kill -9``, the VM's helper processes it found under its own PID). ``abort`` is the
run watchdog's way in, from another thread: SIGKILL by PID, no restart after it.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.procs import code_root

__all__ = [
    "AckbusServer",
    "RabbitServer",
    "ServerError",
    "ServerProcess",
    "apt_install",
    "cpu_seconds",
    "ensure_rabbitmq",
    "free_port",
    "rabbitmq_installed",
    "rss_bytes",
]

RABBITMQ_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")


class ServerError(Exception):
    """A broker did not start, got ready, or answer as expected."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A loopback port that is free now and outside the ephemeral range, so that the
    source port of some client connection (ours or another program's) cannot take
    it between now and the broker's bind."""
    low, high = _ephemeral_range()
    candidates = [port for port in range(10000, 65000) if not low <= port <= high]
    for _ in range(200):
        port = random.choice(candidates)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ServerError("no free port found")


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise ServerError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process used so far."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of every process under ``pid``: the start time tells the same
    process from a later one that reused its PID."""
    found, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            start = _start_time(child)
            if start is not None:
                found.append((child, start))
            todo.append(child)
    return found


def _kill_pids(processes: list[tuple[int, int]]) -> None:
    """SIGKILL those of ``processes`` that still run (same PID, same start time)."""
    for pid, start in processes:
        if _start_time(pid) != start:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _end(proc: subprocess.Popen[bytes], sig: int, timeout_s: float) -> None:
    """Send ``sig``, wait up to ``timeout_s``, then SIGKILL; always reaped."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _refuse_if_aborted(server: Any) -> None:
    if server.aborted:
        raise ServerError("the run went over its time budget; the broker was killed")


def _abort_tree(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL ``proc`` and everything under it, without waiting or reaping (safe from
    a thread other than the one that owns ``proc``: PIDs are checked by start time)."""
    if proc is None or proc.returncode is not None:
        return
    start = _start_time(proc.pid)
    if start is None:
        return
    _kill_pids([(proc.pid, start), *_descendants(proc.pid)])


class ServerProcess:
    """What the benchmark's servers share: one process on ports of 127.0.0.1 chosen
    free beforehand, known by PID. Each server has its own ``spawn``, ``wait_ready``,
    ``stop`` and ``log_tail``; ``start`` tries again on new ports (:meth:`new_ports`)
    when a chosen one was taken meanwhile, which the server's log says in its own
    words (``port_taken``)."""

    #: how errors name it; what its log says when a port is taken
    name = "server"
    port_taken = "Address already in use"
    #: how long ``stop`` waits after SIGTERM before SIGKILL
    stop_timeout_s = 60.0
    proc: subprocess.Popen[bytes] | None
    port: int
    aborted: bool

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def spawn(self) -> None:
        raise NotImplementedError

    def wait_ready(self, timeout_s: float) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self.proc is not None:
            _end(self.proc, signal.SIGTERM, self.stop_timeout_s)

    def kill9(self) -> None:
        assert self.proc is not None
        _end(self.proc, signal.SIGKILL, 30)

    def abort(self) -> None:
        """From another thread (the run's watchdog): SIGKILL the server (and what it
        started) and refuse to start it again, so that whatever waits on it fails
        now. ``stop`` reaps."""
        self.aborted = True
        _abort_tree(self.proc)

    def log_tail(self, n: int = 30) -> str:
        raise NotImplementedError

    def new_ports(self) -> None:
        self.port = free_port()

    def start(self, timeout_s: float) -> float:
        """Start and wait until ready; return the seconds that took."""
        for attempt in range(3):
            t0 = time.perf_counter()
            self.spawn()
            try:
                self.wait_ready(t0 + timeout_s - time.perf_counter())
            except ServerError:
                if attempt == 2 or self.port_taken not in self.log_tail(200):
                    raise
                self.stop()
                self.new_ports()
                continue
            return time.perf_counter() - t0
        raise AssertionError("unreachable")

    def _check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise ServerError(f"{self.name} exited with {code}:\n{self.log_tail()}")


# --------------------------------------------------------------------------- ackbus


class AckbusServer(ServerProcess):
    side = "ackbus"
    name = "ackbus broker"

    def __init__(self, workdir: Path, *, fsync: str = "always", tls: bool = False, amqp: bool = False) -> None:
        self.workdir = workdir
        #: ``--amqp``: the broker serves AMQP 0-9-1 too and the workers are the pika
        #: ones (bench/worker_rabbitmq.py) against that port; else no AMQP listener.
        self.amqp_port = free_port() if amqp else 0
        self.worker_side = "rabbitmq" if amqp else "ackbus"
        self.data_dir = workdir / "data"
        self.fsync = fsync
        #: Serve HTTPS with a certificate made for the run (``--tls``): clients trust
        #: its CA file (``client_spec``), as a deployment with a private CA would.
        self.tls = tls
        self.ca_file = workdir / "bench-ca.pem"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "ackbus-broker.log"
        self.aborted = False

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}" if self.tls else f"http://127.0.0.1:{self.port}"

    def _tls_args(self) -> list[str]:
        """Make a CA and a certificate for localhost (trustme); the broker's flags."""
        if not self.tls:
            return []
        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert("localhost", "127.0.0.1")
        cert_path, key_path = self.workdir / "bench-cert.pem", self.workdir / "bench-key.pem"
        cert.cert_chain_pems[0].write_to_path(str(cert_path))
        cert.private_key_pem.write_to_path(str(key_path))
        ca.cert_pem.write_to_path(str(self.ca_file))
        return ["--tls-cert", str(cert_path), "--tls-key", str(key_path)]

    def spawn(self) -> None:
        """Start the broker process; do not wait for it."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        _refuse_if_aborted(self)
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = str(code_root()) + os.pathsep + env.get("PYTHONPATH", "")
        tls_args = self._tls_args() if not self.ca_file.exists() else self._tls_files_args()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "broker",
                    "--host", "127.0.0.1", "--port", str(self.port),
                    "--data-dir", str(self.data_dir), "--fsync", self.fsync, *tls_args,
                    "--amqp-port", str(self.amqp_port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(code_root()),
                env=env,
            )


    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            self._check_alive()
            try:
                if self.request("GET", "/healthz", timeout_s=1.0)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.01)
        raise ServerError(f"ackbus broker not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def wait_queue(self, queue: str, expected: int, timeout_s: float, *, field: str = "messages_ready") -> None:
        """Wait until the broker is ready and reports ``expected`` ready messages in
        ``queue`` (or ``expected`` of another count of ``GET /queues/<name>``: ``field``)."""
        deadline = time.perf_counter() + timeout_s
        last: Any = None
        while time.perf_counter() < deadline:
            self._check_alive()
            try:
                if self.request("GET", "/healthz", timeout_s=1.0)[0] == 200:
                    status, last = self.request("GET", f"/queues/{queue}", timeout_s=5.0)
                    if status == 200 and last.get(field) == expected:
                        return
            except OSError:
                pass
            time.sleep(0.01)
        raise ServerError(f"queue {queue} did not show {expected} messages in time (last: {last})")

    def queue_messages(self, queue: str) -> int:
        status, info = self.request("GET", f"/queues/{queue}")
        if status != 200:
            raise ServerError(f"GET /queues/{queue}: {status} {info}")
        return int(info["messages_ready"]) + int(info.get("messages_unacked", 0))

    def _tls_files_args(self) -> list[str]:
        """The same certificate again (a restart within the run)."""
        if not self.tls:
            return []
        return ["--tls-cert", str(self.workdir / "bench-cert.pem"), "--tls-key", str(self.workdir / "bench-key.pem")]

    def request(self, method: str, path: str, *, timeout_s: float = 30.0) -> tuple[int, Any]:
        conn: http.client.HTTPConnection
        if self.tls:
            context = ssl.create_default_context(cafile=str(self.ca_file))
            conn = http.client.HTTPSConnection("localhost", self.port, timeout=timeout_s, context=context)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout_s)
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, data

    def client_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"url": self.url, "ca_file": str(self.ca_file) if self.tls else None}
        if self.amqp_port:
            spec["port"] = self.amqp_port  # the pika worker's broker
        return spec

    def wal_bytes_written(self) -> int | None:
        """Bytes the broker appended to its WAL since it started (``GET /overview``,
        ``storage.wal_bytes_written``); None if it does not say."""
        status, overview = self.request("GET", "/overview")
        if status != 200 or not isinstance(overview, dict):
            raise ServerError(f"GET /overview: {status} {overview!r}")
        value = overview.get("storage", {}).get("wal_bytes_written")
        return None if value is None else int(value)

    def versions(self) -> dict[str, str]:
        from importlib.metadata import version

        status, overview = self.request("GET", "/overview")
        out = {"ackbus": str(overview.get("version", "?")) if status == 200 else "?"}
        for dist in ("trio", "h11", "orjson"):
            out[dist] = version(dist)
        return out

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


# --------------------------------------------------------------------------- RabbitMQ


def rabbitmq_installed() -> bool:
    return RABBITMQ_SERVER.exists() and shutil.which("epmd") is not None


def apt_install(package: str, installed: Any, check: str, say: Any) -> None:
    """Install Debian's ``package`` with apt-get (root only) unless ``installed()``.

    The package's own service must not start (it would listen where we do not want
    it, and we start private processes by PID): while installing, a ``policy-rc.d``
    that denies service starts is put in place if there is none, and removed
    afterwards.

    Raises:
        ServerError: not root, no apt-get, the install failed, or ``check`` (what
            must exist afterwards) is still missing.
    """
    if installed():
        return
    if os.geteuid() != 0:
        raise ServerError(f"{package} is not installed; run as root or: apt-get install {package}")
    if shutil.which("apt-get") is None:
        raise ServerError(f"{package} is not installed and there is no apt-get")
    policy = Path("/usr/sbin/policy-rc.d")
    created = False
    if not policy.exists():
        policy.write_text("#!/bin/sh\n# ackbus bench: do not start services while installing\nexit 101\n")
        policy.chmod(0o755)
        created = True
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        for cmd, timeout_s in (
            (["apt-get", "update"], 600),
            (["apt-get", "install", "-y", "--no-install-recommends", package], 1800),
        ):
            say(f"installing {package}: {' '.join(cmd)}")
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0:
                raise ServerError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    except subprocess.TimeoutExpired as exc:
        raise ServerError(f"{' '.join(map(str, exc.cmd))} did not finish in {exc.timeout:.0f} s") from exc
    finally:
        if created:
            policy.unlink()
    if not installed():
        raise ServerError(f"installed {package}, but {check} is missing")


def ensure_rabbitmq(say: Any) -> None:
    """Install Debian's rabbitmq-server if it is missing (root only; see ``apt_install``).

    Raises:
        ServerError: not root, no apt-get, or the install failed.
    """
    apt_install("rabbitmq-server", rabbitmq_installed, f"{RABBITMQ_SERVER} or epmd", say)


class RabbitServer(ServerProcess):
    """One private RabbitMQ node; with ``epmd_port``, ``cookie`` and ``cluster`` (the
    node names of every member), a member of a cluster that forms by itself on first
    boot (``cluster_formation`` with ``classic_config``): the epmd on that port is then
    the cluster's (``bench.rabbit_cluster``), not this node's to start or stop."""

    name = "RabbitMQ"
    port_taken = "eaddrinuse"

    side = "rabbitmq"

    def __init__(
        self, workdir: Path, *, nodename: str = "bench@localhost", epmd_port: int | None = None,
        cookie: str | None = None, cluster: tuple[str, ...] = (),
    ) -> None:
        self.workdir = workdir
        self.nodename = nodename
        self.port = free_port()
        self.dist_port = free_port()
        self.own_epmd = epmd_port is None
        self.epmd_port = free_port() if epmd_port is None else epmd_port
        self.cookie = cookie
        self.cluster = cluster
        self.proc: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "rabbitmq-stdout.log"
        self.server_properties: dict[str, Any] = {}
        self.aborted = False

    # (``pid``: the Erlang VM's, beam.smp)

    def _env(self) -> dict[str, str]:
        base = self.workdir
        env = dict(os.environ)
        env.update(
            HOME=str(base),
            ERL_EPMD_ADDRESS="127.0.0.1",
            ERL_EPMD_PORT=str(self.epmd_port),
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            RUNNING_UNDER_SYSTEMD="true",
        )
        return env

    def spawn(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        _refuse_if_aborted(self)
        base = self.workdir
        base.mkdir(parents=True, exist_ok=True)
        (base / "rabbitmq-env.conf").touch()
        (base / "enabled_plugins").write_text("[].\n")
        if self.cluster:
            (base / "rabbitmq.conf").write_text(
                "cluster_formation.peer_discovery_backend = classic_config\n"
                + "".join(f"cluster_formation.classic_config.nodes.{i} = {name}\n" for i, name in enumerate(self.cluster, 1))
            )
        if self.cookie is not None:
            cookie = base / ".erlang.cookie"
            if not cookie.exists():
                cookie.write_text(self.cookie)
                cookie.chmod(0o400)
        env = self._env()
        if self.own_epmd and (self.epmd is None or self.epmd.poll() is not None):
            self.epmd = subprocess.Popen(
                ["epmd", "-address", "127.0.0.1", "-port", str(self.epmd_port)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            )
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(RABBITMQ_SERVER)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            )

    def new_ports(self) -> None:
        self.port, self.dist_port = free_port(), free_port()
        if self.own_epmd:
            self.epmd_port = free_port()
        shutil.rmtree(self.workdir / "mnesia", ignore_errors=True)

    def _connect(self) -> Any:
        import pika

        return pika.BlockingConnection(
            pika.ConnectionParameters(
                host="127.0.0.1", port=self.port, connection_attempts=1, socket_timeout=2, blocked_connection_timeout=5
            )
        )

    def wait_ready(self, timeout_s: float) -> None:
        import pika.exceptions

        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            self._check_alive()
            try:
                conn = self._connect()
            except (pika.exceptions.AMQPError, OSError):
                time.sleep(0.02)
                continue
            self.server_properties = dict(conn._impl.server_properties)
            conn.close()
            return
        raise ServerError(f"RabbitMQ not ready within {timeout_s:.0f} s:\n{self.log_tail()}")

    def wait_queue(self, queue: str, expected: int, timeout_s: float) -> None:
        """Wait until a passive declare of ``queue`` succeeds and reports ``expected``
        messages."""
        import pika.exceptions

        deadline = time.perf_counter() + timeout_s
        last = None
        while time.perf_counter() < deadline:
            self._check_alive()
            try:
                conn = self._connect()
            except (pika.exceptions.AMQPError, OSError):
                time.sleep(0.02)
                continue
            try:
                while time.perf_counter() < deadline:
                    try:
                        last = conn.channel().queue_declare(queue, passive=True).method.message_count
                    except pika.exceptions.ChannelClosed:
                        last = None  # not recovered yet (404) — try again
                    if last == expected:
                        return
                    time.sleep(0.02)
            except (pika.exceptions.AMQPError, OSError):
                time.sleep(0.02)
            finally:
                try:
                    conn.close()
                except Exception:
                    pass
        raise ServerError(f"queue {queue} did not show {expected} messages in time (last: {last})")

    def queue_messages(self, queue: str) -> int:
        conn = self._connect()
        try:
            return int(conn.channel().queue_declare(queue, passive=True).method.message_count)
        finally:
            conn.close()

    def client_spec(self) -> dict[str, Any]:
        return {"port": self.port}

    def wal_bytes_written(self) -> int | None:
        """RabbitMQ has no single WAL counter to compare with: not measured."""
        return None

    def kill9(self) -> None:
        """SIGKILL the Erlang VM and the helpers it started (erl_child_setup, ...)."""
        assert self.proc is not None
        helpers = _descendants(self.proc.pid)
        _end(self.proc, signal.SIGKILL, 30)
        _kill_pids(helpers)

    def stop(self) -> None:
        if self.proc is not None:
            helpers = _descendants(self.proc.pid)
            _end(self.proc, signal.SIGTERM, 90)
            _kill_pids(helpers)
        if self.epmd is not None:
            _end(self.epmd, signal.SIGTERM, 10)

    def versions(self) -> dict[str, str]:
        from importlib.metadata import version

        props = self.server_properties

        def text(value: Any) -> str:
            return value.decode() if isinstance(value, bytes) else str(value)

        return {
            "rabbitmq": text(props.get("version", "?")),
            "erlang": text(props.get("platform", "?")),
            "pika": version("pika"),
        }

    def log_tail(self, n: int = 30) -> str:
        lines: list[str] = []
        for path in (self.log_path, self.workdir / "log" / f"{self.nodename}.log"):
            try:
                lines += path.read_text(errors="replace").splitlines()[-n:]
            except OSError:
                pass
        return "\n".join(lines)
