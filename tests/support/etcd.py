"""A private etcd in a subprocess, for the cluster tests.

``EtcdProcess`` starts the ``etcd`` binary (Debian's ``etcd-server``; its system service
is never touched) on two free loopback ports with a data directory of its own, waits
until ``/health`` answers, and stops it by PID. ``ETCD_BINARY`` says where it is; a
test that needs it calls :func:`require_etcd`, which skips with the reason when it is
missing.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.broker import free_port

__all__ = ["EtcdProcess", "etcd_binary", "require_etcd"]


def etcd_binary() -> str | None:
    found = os.environ.get("ETCD_BINARY") or shutil.which("etcd") or "/usr/bin/etcd"
    return found if os.access(found, os.X_OK) else None


def require_etcd() -> str:
    binary = etcd_binary()
    if binary is None:
        pytest.skip("etcd is not installed (Debian package etcd-server; or set ETCD_BINARY to its binary)")
    return binary


class EtcdProcess:
    """One etcd member on loopback; ``start()`` again reuses its ports and data."""

    def __init__(self, directory: Path, *, binary: str | None = None) -> None:
        self.directory = Path(directory)
        self.binary = binary or require_etcd()
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.directory / "etcd.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self, timeout_s: float = 30.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.directory.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--name", "test",
                "--data-dir", str(self.directory / "data"),
                "--listen-client-urls", self.url,
                "--advertise-client-urls", self.url,
                "--listen-peer-urls", peer,
                "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"test={peer}",
                "--log-level", "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")},
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: {self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.05)
        raise TimeoutError(f"etcd not healthy after {timeout_s} s: {self.log_tail()}")

    def healthy(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", self.client_port, timeout=1.0)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def __enter__(self) -> EtcdProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
