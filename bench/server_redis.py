"""Redis as a benchmark peer (``--peer redis``): a private ``redis-server``, by PID.

:class:`RedisServer` has the interface of the other servers in ``bench.servers``. It
runs Debian's ``redis-server`` in the foreground with a config file written into the
run's own directory, and shares nothing with a system Redis (whose service is neither
started nor touched):

- ``bind 127.0.0.1``, a free port, ``protected-mode yes``, ``daemonize no``: the PID
  we start is the server itself, stopped with SIGTERM (SIGKILL after 60 s);
- ``dir`` and ``logfile`` under the run's directory;
- durability as close to ackbus's ``--fsync always`` as Redis goes: ``appendonly yes``,
  ``appendfsync always`` (every write command is in the fsynced AOF before its reply
  leaves), ``save ""`` (no RDB snapshots). Redis's other defaults are kept, among them
  the automatic AOF rewrite (at 100 % growth past 64 MB), as a user would run it.

A "queue" is a stream key; ``queue_messages`` is its ``XLEN``, the entries in the
stream. Every workload that counts a queue's depth does so on a freshly filled
stream (nothing consumed yet), where that is the number of messages waiting. Ready
means ``PING`` answers ``PONG`` (while it replays its AOF Redis answers ``-LOADING``).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.servers import (
    ServerError,
    ServerProcess,
    _descendants,
    _end,
    _kill_pids,
    _refuse_if_aborted,
    apt_install,
    free_port,
)

__all__ = ["RedisServer", "ensure_redis", "redis_installed"]


def _redis_binary() -> str | None:
    return shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)


def redis_installed() -> bool:
    return _redis_binary() is not None


def ensure_redis(say: Any) -> None:
    """Install Debian's redis-server if it is missing (root only; its service is kept
    from starting during the install, see ``bench.servers.apt_install``).

    Raises:
        ServerError: not root, no apt-get, or the install failed.
    """
    apt_install("redis-server", redis_installed, "redis-server", say)


class RedisServer(ServerProcess):
    side = "redis"
    name = "redis-server"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.conf_path = workdir / "redis.conf"
        self.log_path = workdir / "redis-server.log"
        self.stdout_path = workdir / "redis-stdout.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.aborted = False
        self.info: dict[str, Any] = {}

    def config(self) -> str:
        """The whole config file (paths quoted: Redis splits config lines on spaces)."""
        return "\n".join([
            "bind 127.0.0.1",
            f"port {self.port}",
            "protected-mode yes",
            "daemonize no",
            "supervised no",
            f'dir "{self.data_dir}"',
            f'logfile "{self.log_path}"',
            "appendonly yes",
            "appendfsync always",
            'save ""',
            "",
        ])

    def spawn(self) -> None:
        """Start redis-server (same directory and port again after a ``kill9``); do not wait."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        _refuse_if_aborted(self)
        binary = _redis_binary()
        if binary is None:
            raise ServerError("redis-server is not installed (apt-get install redis-server)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.conf_path.write_text(self.config())
        with open(self.stdout_path, "ab") as out:
            self.proc = subprocess.Popen(
                [binary, str(self.conf_path)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=str(self.workdir),
            )

    def _client(self, timeout_s: float = 5.0) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout_s,
                           socket_connect_timeout=timeout_s)

    def _poll(self, timeout_s: float, what: str, check: Any) -> None:
        """Call ``check(client)`` until it is true; connection errors and ``LOADING``
        (the AOF still replaying) mean "not yet"."""
        import redis.exceptions

        deadline = time.perf_counter() + timeout_s
        last: Any = None
        while time.perf_counter() < deadline:
            self._check_alive()
            client = self._client(timeout_s=2.0)
            try:
                last = check(client)
                if last is True:
                    return
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                    redis.exceptions.BusyLoadingError) as exc:
                last = exc
            finally:
                client.close()
            time.sleep(0.01)
        raise ServerError(f"redis-server: {what} not seen within {timeout_s:.0f} s (last: {last!r})\n"
                          f"{self.log_tail()}")

    def wait_ready(self, timeout_s: float) -> None:
        def ready(client: Any) -> Any:
            if client.ping() is not True:
                return "no PONG"
            self.info = dict(client.info("server"))
            return True

        self._poll(timeout_s, "PONG", ready)

    def wait_queue(self, queue: str, expected: int, timeout_s: float) -> None:
        """Wait until Redis answers and the stream ``queue`` holds ``expected`` entries."""
        def depth(client: Any) -> Any:
            n = int(client.xlen(queue))
            return True if n == expected else n

        self._poll(timeout_s, f"XLEN {queue} = {expected}", depth)

    def queue_messages(self, queue: str) -> int:
        client = self._client()
        try:
            return int(client.xlen(queue))
        finally:
            client.close()

    def client_spec(self) -> dict[str, Any]:
        return {"port": self.port}

    def wal_bytes_written(self) -> int | None:
        """Not compared for Redis: its AOF holds commands, and rewrites replace it."""
        return None

    def kill9(self) -> None:
        """SIGKILL redis-server and an AOF rewrite child, if one runs (found by PID
        under ours: a killed parent leaves its child running)."""
        assert self.proc is not None
        children = _descendants(self.proc.pid)
        _end(self.proc, signal.SIGKILL, 30)
        _kill_pids(children)

    def versions(self) -> dict[str, str]:
        from importlib.metadata import PackageNotFoundError, version

        out = {"redis": str(self.info.get("redis_version", "?"))}
        for dist, key in (("redis", "redis-py"), ("hiredis", "hiredis")):
            try:
                out[key] = version(dist)
            except PackageNotFoundError:
                out[key] = "not installed"
        return out

    def log_tail(self, n: int = 30) -> str:
        lines: list[str] = []
        for path in (self.stdout_path, self.log_path):
            try:
                lines += path.read_text(errors="replace").splitlines()[-n:]
            except OSError:
                pass
        return "\n".join(lines)
