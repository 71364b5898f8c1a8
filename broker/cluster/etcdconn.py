"""One HTTP/1.1 connection to an etcd endpoint, plain or TLS, driven by h11: the
endpoints as parsed from ``--etcd``, a request sent, an answer read whole.

``broker.cluster.etcd`` keeps these connections alive, fails over between endpoints
and follows watches; here is only what one connection does.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import h11
import trio

from broker.cluster.etcdaccess import start_tls
from broker.cluster.etcdproto import EtcdError, EtcdUnavailable
from broker.cluster.h11io import next_event

__all__ = ["MAX_ANSWER_BYTES", "Endpoint", "EtcdConnection", "NoResponse", "connect", "parse_endpoints", "read_answer"]

#: The largest answer accepted from etcd (a range over all of a cluster's metadata).
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024


@dataclass
class Endpoint:
    """One etcd URL and what the last call to it found."""

    url: str
    host: str
    port: int
    tls: bool = False  # https
    healthy: bool | None = None  # None: not tried yet
    error: str | None = None
    checked_at: float | None = None  # wall-clock seconds

    def mark(self, error: str | None) -> None:
        self.healthy = error is None
        self.error = error
        self.checked_at = time.time()

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "healthy": self.healthy, "error": self.error, "checked_at": self.checked_at}


def parse_endpoints(text: str) -> list[Endpoint]:
    """``http://h:p[,http://h:p...]`` (or all ``https://``) as endpoints. Raises
    ValueError naming a bad one, or when http and https are mixed (a cluster's etcd
    is reached one way: one plain endpoint would carry in clear what the others
    protect)."""
    found = []
    for raw in text.split(","):
        url = raw.strip().rstrip("/")
        if not url:
            continue
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path:
            raise ValueError(f"etcd endpoint {url!r} must look like http://HOST:PORT or https://HOST:PORT")
        try:
            port = parts.port or 2379
        except ValueError:
            raise ValueError(f"etcd endpoint {url!r} has an invalid port") from None
        found.append(Endpoint(url, parts.hostname, port, tls=parts.scheme == "https"))
    if not found:
        raise ValueError("no etcd endpoint given")
    if len({e.tls for e in found}) > 1:
        raise ValueError(f"etcd endpoints {text.strip()!r} mix http:// and https://: use one scheme for all")
    return found


class EtcdConnection:
    """One HTTP/1.1 connection to an endpoint, driven by h11."""

    def __init__(self, endpoint: Endpoint, stream: trio.abc.Stream) -> None:
        self.endpoint = endpoint
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    async def send_request(self, method: str, path: str, body: bytes, token: str | None = None) -> None:
        headers = [
            ("Host", f"{self.endpoint.host}:{self.endpoint.port}"),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
        ]
        if token is not None:
            headers.append(("Authorization", token))
        data = self.h11.send(h11.Request(method=method, target=path, headers=headers))
        data += self.h11.send(h11.Data(data=body)) or b""
        data += self.h11.send(h11.EndOfMessage()) or b""
        await self.stream.send_all(data)

    async def next_event(self) -> Any:
        return await next_event(self.h11, self.stream)

    def reusable(self) -> bool:
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False

    async def aclose(self) -> None:
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await self.stream.aclose()


async def connect(endpoint: Endpoint, ssl_context: ssl.SSLContext | None) -> EtcdConnection:
    """A connection to ``endpoint``, TLS set up over https. Raises OSError (EtcdTLSRefused
    for a failed handshake)."""
    tcp = await trio.open_tcp_stream(endpoint.host, endpoint.port)
    if not endpoint.tls:
        return EtcdConnection(endpoint, tcp)
    return EtcdConnection(endpoint, await start_tls(tcp, endpoint.host, ssl_context))


class NoResponse(Exception):
    """The connection ended before the answer's status line."""


async def read_answer(conn: EtcdConnection) -> tuple[int, bytes]:
    """The status and whole body of the answer to the request just sent. Raises
    NoResponse when the connection ended before any answer, EtcdUnavailable when it
    ended mid-answer, EtcdError for an answer too large."""
    event = await conn.next_event()
    if isinstance(event, h11.ConnectionClosed):
        raise NoResponse()
    if not isinstance(event, h11.Response):
        raise EtcdUnavailable(f"unexpected {type(event).__name__} from etcd")
    parts = []
    size = 0
    while True:
        item = await conn.next_event()
        if isinstance(item, h11.Data):
            size += len(item.data)
            if size > MAX_ANSWER_BYTES:
                raise EtcdError(f"etcd answer over {MAX_ANSWER_BYTES} bytes")
            parts.append(bytes(item.data))
        elif isinstance(item, h11.EndOfMessage):
            return event.status_code, b"".join(parts)
        elif isinstance(item, h11.ConnectionClosed):
            raise EtcdUnavailable("etcd closed the connection mid-answer")
