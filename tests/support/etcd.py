"""A private etcd in a subprocess, for the cluster tests.

``EtcdProcess`` starts the ``etcd`` binary (Debian's ``etcd-server``; its system service
is never touched) on two free loopback ports with a data directory of its own, waits
until ``/health`` answers, and stops it by PID. ``ETCD_BINARY`` says where it is; a
test that needs it calls :func:`require_etcd`, which skips with the reason when it is
missing.

With ``tls`` (:func:`make_etcd_tls`, certificates from ``trustme``) it serves https
only, and with ``client_cert_auth`` wants a client certificate signed by the same CA.
:meth:`EtcdProcess.enable_auth` adds users and turns etcd's authentication on, through
the same JSON gateway the broker uses.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import free_port

__all__ = ["EtcdProcess", "EtcdTLS", "etcd_binary", "make_etcd_tls", "require_etcd"]


def etcd_binary() -> str | None:
    found = os.environ.get("ETCD_BINARY") or shutil.which("etcd") or "/usr/bin/etcd"
    return found if os.access(found, os.X_OK) else None


def require_etcd() -> str:
    binary = etcd_binary()
    if binary is None:
        pytest.skip("etcd is not installed (Debian package etcd-server; or set ETCD_BINARY to its binary)")
    return binary


@dataclass(frozen=True)
class EtcdTLS:
    """PEM files of an etcd served over TLS: the CA that signed everything, etcd's own
    certificate, and a client certificate (what a trusted node presents)."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    #: etcd wants a client certificate signed by ``ca`` (``--client-cert-auth``)
    client_cert_auth: bool = True

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def make_etcd_tls(directory: Path, *, client_cert_auth: bool = True) -> EtcdTLS:
    """A new CA, etcd's certificate for 127.0.0.1 and a client certificate, in
    ``directory``."""
    import trustme

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("ackbus-node")
    files = {name: directory / name for name in ("ca.pem", "etcd.pem", "etcd.key", "client.pem", "client.key")}
    ca.cert_pem.write_to_path(str(files["ca.pem"]))
    server.cert_chain_pems[0].write_to_path(str(files["etcd.pem"]))
    server.private_key_pem.write_to_path(str(files["etcd.key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client.pem"]))
    client.private_key_pem.write_to_path(str(files["client.key"]))
    return EtcdTLS(files["ca.pem"], files["etcd.pem"], files["etcd.key"], files["client.pem"], files["client.key"],
                   client_cert_auth)


class EtcdProcess:
    """One etcd member on loopback; ``start()`` again reuses its ports and data.
    ``tls``: serve https (see the module docstring); ``extra``: more etcd flags
    (``--auth-token-ttl``)."""

    def __init__(
        self, directory: Path, *, binary: str | None = None, tls: EtcdTLS | None = None, extra: tuple[str, ...] = ()
    ) -> None:
        self.directory = Path(directory)
        self.binary = binary or require_etcd()
        self.tls = tls
        self.extra = extra
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.directory / "etcd.log"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"

    def _tls_flags(self) -> list[str]:
        if self.tls is None:
            return []
        flags = ["--cert-file", str(self.tls.cert), "--key-file", str(self.tls.key)]
        if self.tls.client_cert_auth:
            flags += ["--client-cert-auth", "--trusted-ca-file", str(self.tls.ca)]
        return flags

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
                *self._tls_flags(),
                *self.extra,
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

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if self.tls is None:
            return http.client.HTTPConnection("127.0.0.1", self.client_port, timeout=timeout_s)
        return http.client.HTTPSConnection("127.0.0.1", self.client_port, timeout=timeout_s,
                                           context=self.tls.client_context())

    def healthy(self) -> bool:
        conn = self._connection(1.0)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def call(self, path: str, body: dict[str, Any], token: str | None = None) -> tuple[int, dict[str, Any]]:
        """POST ``body`` to the JSON gateway's ``path``: (status, answer)."""
        conn = self._connection(10.0)
        try:
            headers = {"Content-Type": "application/json", **({"Authorization": token} if token else {})}
            conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
            answer = conn.getresponse()
            raw = answer.read()
            return answer.status, (json.loads(raw) if raw.strip() else {})
        finally:
            conn.close()

    def empty(self) -> None:
        """Revoke every lease (their keys go with them) and delete every key: what a
        test then sees is a new etcd's store, but for the revision counter. Raises
        AssertionError when etcd refuses (its authentication on, say)."""
        status, answer = self.call("/v3/lease/leases", {})
        assert status == 200, ("/v3/lease/leases", status, answer)
        for lease in answer.get("leases", []):
            status, revoked = self.call("/v3/lease/revoke", {"ID": lease["ID"]})
            # (404: it lapsed between the listing and the revocation)
            assert status in (200, 404), ("/v3/lease/revoke", status, revoked)
        everything = base64.b64encode(b"\0").decode()  # key and range_end "\0": every key
        status, answer = self.call("/v3/kv/deleterange", {"key": everything, "range_end": everything})
        assert status == 200, ("/v3/kv/deleterange", status, answer)

    def enable_auth(self, root_password: str, users: dict[str, tuple[str, str]]) -> None:
        """Add ``root`` and each user ``name: (password, key prefix it may read and
        write)``, then turn etcd's authentication on."""

        def ok(path: str, body: dict[str, Any]) -> None:
            status, answer = self.call(path, body)
            assert status == 200, (path, status, answer)

        def b64(raw: bytes) -> str:
            return base64.b64encode(raw).decode()

        ok("/v3/auth/user/add", {"name": "root", "password": root_password})
        ok("/v3/auth/role/add", {"name": "root"})
        ok("/v3/auth/user/grant", {"user": "root", "role": "root"})
        for name, (password, prefix) in users.items():
            start = prefix.encode()
            end = start[:-1] + bytes([start[-1] + 1])
            ok("/v3/auth/user/add", {"name": name, "password": password})
            ok("/v3/auth/role/add", {"name": f"{name}-role"})
            ok("/v3/auth/role/grant", {"name": f"{name}-role",
                                       "perm": {"key": b64(start), "range_end": b64(end), "permType": "READWRITE"}})
            ok("/v3/auth/user/grant", {"user": name, "role": f"{name}-role"})
        ok("/v3/auth/enable", {})

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
