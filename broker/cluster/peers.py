"""HTTP/1.1 between nodes, on trio and h11: the persistent channel a node forwards
publishes over (:class:`PeerChannel`), and one relayed request (:func:`relay`).

A :class:`PeerChannel` is an ordinary channel (``POST /channel``, docs/protocol.md)
opened by this node on a peer, marked ``X-Ackbus-Forwarded`` (the peer publishes what
arrives there to its own queues only, never forwards it again) and authenticated
with the cluster secret (``X-Ackbus-Cluster-Secret``). Publishes queued while a
write is in progress leave together as one chunk; the peer's ``ack``/``nack`` events
settle them in tag order (its confirms never skip). When the connection fails, every
publish still waiting is settled as a nack (``queue_unavailable``): the client's
resend with the same ``message_id`` is deduplicated by the owner. A publish made
without deduplication (AMQP's, by default) is forwarded with ``"dedup": false`` and
the owner does not deduplicate it either: if the owner took it but its answer was
lost, the resend is enqueued again (at least once, as RabbitMQ).
"""

from __future__ import annotations

import base64
import collections
import logging
import math
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final
from urllib.parse import urlsplit

import h11
import orjson
import trio

from broker.cluster.h11io import READ_BYTES, next_event
from broker.core import is_reply

__all__ = [
    "FORWARDED_HEADER",
    "SECRET_HEADER",
    "PeerChannel",
    "PeerStream",
    "PeerUnreachable",
    "RelayedResponse",
    "peer_address",
    "relay",
]

log = logging.getLogger("ackbus.cluster")

#: Marks a request a node sends another for a client (never forwarded again).
FORWARDED_HEADER: Final = "x-ackbus-forwarded"
#: Carries the cluster secret (``--cluster-secret``) between nodes.
SECRET_HEADER: Final = "x-ackbus-cluster-secret"
CONNECT_TIMEOUT_S: Final = 3.0
#: The most publishes one write carries.
MAX_BATCH: Final = 512

Settle = Callable[[bool, str | None], None]


class PeerUnreachable(Exception):
    """A peer could not be reached, or its answer was cut short."""


def peer_address(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a node's advertised URL; ValueError unless it is
    ``http://`` or ``https://`` with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"node URL {url!r}: only http:// and https:// are forwarded to")
    return parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


#: What makes connecting to a peer fail (and a refused TLS handshake).
CONNECT_ERRORS = (OSError, ValueError, trio.TooSlowError, trio.BrokenResourceError)


async def open_peer(url: str, ssl_context: ssl.SSLContext | None) -> tuple[trio.abc.Stream, str]:
    """A stream to the node at ``url`` and the ``Host`` to name it by: TLS for
    ``https://``, the peer's certificate verified against ``ssl_context`` (the
    cluster's CA bundle) or the system's CAs. Raises one of :data:`CONNECT_ERRORS`."""
    scheme, host, port = peer_address(url)
    with trio.fail_after(CONNECT_TIMEOUT_S):
        tcp = await trio.open_tcp_stream(host, port)
        if scheme == "http":
            return tcp, f"{host}:{port}"
        tls = trio.SSLStream(tcp, ssl_context or ssl.create_default_context(), server_hostname=host)
        try:
            await tls.do_handshake()
        except BaseException:
            await tcp.aclose()
            raise
        return tls, f"{host}:{port}"


def _publish_line(
    exchange: str, routing_key: str, body: bytes, properties: dict[str, Any] | None, delay_s: float | None,
    dedup: bool = True,
) -> bytes:
    # mandatory: a copy the owner routes to none of its queues (the queue moved to
    # another leader, or was deleted, since this node routed it) comes back as a
    # return, and its confirm is taken as a nack (see ForwardingChannel._read); not
    # so a direct reply, which reaches no queue by design (broker/core/directreply.py)
    mandatory = not is_reply(exchange, routing_key)
    op: dict[str, Any] = {"op": "publish", "exchange": exchange, "routing_key": routing_key, "mandatory": mandatory}
    try:
        op["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        op["body_b64"] = base64.b64encode(body).decode("ascii")
    if properties:
        op["properties"] = properties
    if delay_s:
        op["delay_s"] = delay_s
    if not dedup:
        op["dedup"] = False
    return orjson.dumps(op) + b"\n"


class PeerChannel:
    """One persistent channel to the node ``name`` (see the module docstring).
    :meth:`send` queues a publish; :meth:`serve` connects and carries them until the
    connection fails (then every waiting publish is nacked) or it is cancelled."""

    def __init__(
        self, name: str, url: str, *, origin: str, secret: str | None, answer_timeout_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.ssl_context = ssl_context
        self.origin = origin
        self.secret = secret
        #: a publish sent (or a write begun) this long ago without an answer ends the
        #: channel: a node that hangs must not hold its peers' confirms for ever
        self.answer_timeout_s = answer_timeout_s
        self._outbox: list[tuple[bytes, Settle]] = []
        self._waiting: collections.deque[Settle] = collections.deque()
        #: trio time the oldest unanswered publish (or the write in progress) began
        self._waiting_since: collections.deque[float] = collections.deque()
        self._writing_since: float | None = None
        self._wakeup = trio.Event()
        self.closed = False
        self.sent = 0

    def send(self, line: bytes, settle: Settle) -> None:
        self._outbox.append((line, settle))
        self._wakeup.set()

    def queue_publish(
        self, exchange: str, routing_key: str, body: bytes, properties: dict[str, Any] | None, delay_s: float | None, settle: Settle,
        *, dedup: bool = True,
    ) -> None:
        self.send(_publish_line(exchange, routing_key, body, properties, delay_s, dedup), settle)

    def fail_all(self, reason: str) -> None:
        """Nack every publish queued or waiting for its confirm."""
        self.closed = True
        pending = list(self._waiting) + [settle for _line, settle in self._outbox]
        self._waiting.clear()
        self._waiting_since.clear()
        self._outbox.clear()
        for settle in pending:
            settle(False, reason)

    async def serve(self) -> None:
        try:
            stream, host = await open_peer(self.url, self.ssl_context)
        except CONNECT_ERRORS as exc:
            self.fail_all(f"queue_unavailable: node {self.name!r} cannot be reached: {exc or 'timed out'}")
            return
        conn = h11.Connection(h11.CLIENT)
        headers = [
            ("Host", host),
            ("Content-Type", "application/x-ndjson"),
            ("Transfer-Encoding", "chunked"),
            (FORWARDED_HEADER, self.origin),
        ]
        if self.secret:
            headers.append((SECRET_HEADER, self.secret))
        reason = f"queue_unavailable: the channel to node {self.name!r} was lost"
        try:
            async with stream:
                await stream.send_all(conn.send(h11.Request(method="POST", target="/channel", headers=headers)) or b"")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write, conn, stream)
                    stuck = trio.Event()
                    nursery.start_soon(self._watch, stuck)
                    with trio.CancelScope() as reading:
                        nursery.start_soon(_cancel_when, stuck, reading)
                        reason = await self._read(conn, stream) or reason
                    if stuck.is_set():
                        reason = f"queue_unavailable: node {self.name!r} did not answer within {self.answer_timeout_s:g} s"
                    nursery.cancel_scope.cancel()
        except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError) as group:
            # except*: a failure of the connection inside the nursery (a reset from a
            # peer killed with bytes unread, in the read or in the writer task) comes
            # out of it as a group; an ``except`` would let it through and take this
            # whole node down with its peer
            # here: etcd's modules, which a single node's channels (this module) do not load
            from broker.cluster.etcdaccess import tls_reason

            reason = f"queue_unavailable: the channel to node {self.name!r} failed: {tls_reason(_first_leaf(group))}"
        finally:
            self.fail_all(reason)

    async def _write(self, conn: h11.Connection, stream: trio.abc.Stream) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            while self._outbox:
                batch, self._outbox = self._outbox[:MAX_BATCH], self._outbox[MAX_BATCH:]
                now = trio.current_time()
                self._waiting.extend(settle for _line, settle in batch)
                self._waiting_since.extend(now for _ in batch)
                self.sent += len(batch)
                self._writing_since = now
                await stream.send_all(conn.send(h11.Data(data=b"".join(line for line, _s in batch))) or b"")
                self._writing_since = None

    async def _watch(self, stuck: trio.Event) -> None:
        """Set ``stuck`` once the oldest unanswered publish, or the write in
        progress, is older than ``answer_timeout_s``."""
        while True:
            await trio.sleep(min(0.25, self.answer_timeout_s / 4))
            now = trio.current_time()
            oldest = [t for t in (self._waiting_since[0] if self._waiting_since else None, self._writing_since) if t is not None]
            if oldest and now - min(oldest) > self.answer_timeout_s:
                stuck.set()
                return

    async def _read(self, conn: h11.Connection, stream: trio.abc.Stream) -> str | None:
        """Settle confirms as they come; returns why the channel ended."""
        buffer = b""
        settled = 0  # the last publish tag settled
        returned: set[int] = set()  # copies the owner routed nowhere
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(READ_BYTES)
                if not data:
                    return None
                conn.receive_data(bytes(data))
                continue
            if isinstance(event, h11.Response):
                if event.status_code != 200:
                    return f"queue_unavailable: node {self.name!r} refused the forwarding channel ({event.status_code})"
                continue
            if isinstance(event, h11.Data):
                buffer += bytes(event.data)
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    ev = orjson.loads(line)
                    kind = ev.get("ev")
                    if kind in ("ack", "nack"):
                        tag = int(ev["delivery_tag"])
                        ack = kind == "ack"
                        while settled < tag and self._waiting:
                            settled += 1
                            self._waiting_since.popleft()
                            if settled in returned:
                                returned.discard(settled)
                                self._waiting.popleft()(False, f"queue_unavailable: node {self.name!r} routed it to none of its queues (moved or deleted since); publish again")
                                continue
                            self._waiting.popleft()(ack, None if ack else str(ev.get("reason") or "nacked by the owner"))
                    elif kind == "return":
                        returned.add(int(ev["delivery_tag"]))
                    elif kind == "error":
                        return f"queue_unavailable: node {self.name!r} ended the forwarding channel: {ev.get('message')}"
                continue
            if isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return None


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception of ``group`` that is not itself a group."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


class RelayedResponse:
    """The head of an answer from a peer; its body with :meth:`chunks`."""

    def __init__(self, status: int, headers: list[tuple[str, str]], conn: h11.Connection, stream: trio.abc.Stream) -> None:
        self.status = status
        self.headers = headers
        self._conn = conn
        self._stream = stream

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            event = await next_event(
                self._conn, self._stream, closed=lambda: PeerUnreachable("the peer closed the connection mid-answer")
            )
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return


#: Request headers a relayed request carries on (the rest are the hop's own).
_RELAYED_REQUEST_HEADERS: Final = ("authorization", "content-type", "accept", "last-event-id")
#: Answer headers carried back to the client.
RELAYED_RESPONSE_HEADERS: Final = ("content-type", "retry-after", "www-authenticate", "location")


@asynccontextmanager
async def relay(
    url: str, method: str, target: str, headers: list[tuple[str, str]], body: bytes, *, origin: str,
    secret: str | None = None, ssl_context: ssl.SSLContext | None = None, answer_timeout_s: float | None = None,
) -> AsyncIterator[RelayedResponse]:
    """Send one request to the node at ``url`` (a connection of its own, closed after
    the answer) and yield its answer; with ``secret``, as a node (the cluster secret),
    else with the client's own credentials among ``headers``. Raises
    :class:`PeerUnreachable` when the peer cannot be reached or answers nothing, and,
    with ``answer_timeout_s``, when its answer has not begun within that many seconds
    (a hung node holds its connections open and answers nothing)."""
    deadline = trio.current_time() + answer_timeout_s if answer_timeout_s is not None else math.inf
    with trio.move_on_at(deadline) as connecting:
        try:
            stream, host = await open_peer(url, ssl_context)
        except CONNECT_ERRORS as exc:
            raise PeerUnreachable(str(exc) or "timed out") from None
    if connecting.cancelled_caught:
        raise PeerUnreachable(f"no connection within {answer_timeout_s:g} s")
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        fields = [("Host", host), ("Content-Length", str(len(body))), ("Connection", "close"), (FORWARDED_HEADER, origin)]
        fields += [(name, value) for name, value in headers if name.lower() in _RELAYED_REQUEST_HEADERS]
        if secret:
            fields.append((SECRET_HEADER, secret))
        try:
            data = conn.send(h11.Request(method=method, target=target, headers=fields)) or b""
            data += conn.send(h11.Data(data=body)) or b"" if body else b""
            data += conn.send(h11.EndOfMessage()) or b""
            event: h11.Response | None = None
            with trio.move_on_at(deadline):
                await stream.send_all(data)
                event = await _answer_head(conn, stream)
        except (OSError, trio.BrokenResourceError, h11.ProtocolError) as exc:
            raise PeerUnreachable(str(exc)) from None
        if event is None:
            raise PeerUnreachable(f"no answer within {answer_timeout_s:g} s")
        answer_headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in event.headers
            if k.decode("latin-1").lower() in RELAYED_RESPONSE_HEADERS
        ]
        yield RelayedResponse(event.status_code, answer_headers, conn, stream)


class PeerStream:
    """A plain channel to another node, for one relayed consumer: ops sent as lines
    (:meth:`send`), events read as dicts (:meth:`events`). Opened by :meth:`connect`
    (raising :class:`PeerUnreachable`); closing it ends the channel on the peer, which
    requeues what it delivered and was not acked."""

    def __init__(self, url: str, *, origin: str, secret: str | None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.url = url
        self.origin = origin
        self.secret = secret
        self.ssl_context = ssl_context
        self._stream: trio.abc.Stream | None = None
        self._conn = h11.Connection(h11.CLIENT)
        self._send_lock = trio.Lock()

    async def connect(self) -> None:
        try:
            self._stream, host = await open_peer(self.url, self.ssl_context)
            headers = [
                ("Host", host),
                ("Content-Type", "application/x-ndjson"),
                ("Transfer-Encoding", "chunked"),
                (FORWARDED_HEADER, self.origin),
            ]
            if self.secret:
                headers.append((SECRET_HEADER, self.secret))
            await self._stream.send_all(self._conn.send(h11.Request(method="POST", target="/channel", headers=headers)) or b"")
        except CONNECT_ERRORS as exc:
            await self.aclose()
            raise PeerUnreachable(str(exc) or "timed out") from None

    async def send(self, *ops: dict[str, Any]) -> None:
        """Send ops (raises :class:`PeerUnreachable` once the connection is gone)."""
        if self._stream is None:
            raise PeerUnreachable("not connected")
        data = b"".join(orjson.dumps(op) + b"\n" for op in ops)
        try:
            async with self._send_lock:
                await self._stream.send_all(self._conn.send(h11.Data(data=data)) or b"")
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError) as exc:
            raise PeerUnreachable(str(exc)) from None

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The peer's events until its answer ends (then returns) or the connection
        fails (raises :class:`PeerUnreachable`); a refused channel raises too."""
        stream = self._stream
        if stream is None:
            raise PeerUnreachable("not connected")
        buffer = b""
        conn = self._conn
        try:
            while True:
                event = await next_event(conn, stream, closed=lambda: PeerUnreachable("the peer closed the connection"))
                if isinstance(event, h11.Response):
                    if event.status_code != 200:
                        raise PeerUnreachable(f"the peer refused the channel ({event.status_code})")
                    continue
                if isinstance(event, h11.Data):
                    buffer += bytes(event.data)
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield orjson.loads(line)
                    continue
                if isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    return
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError) as exc:
            raise PeerUnreachable(str(exc)) from None

    async def aclose(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()


async def _answer_head(conn: h11.Connection, stream: trio.abc.Stream) -> h11.Response:
    """The head of the peer's answer to the request just sent."""
    while True:
        event = await next_event(conn, stream, closed=lambda: PeerUnreachable("the peer closed the connection without an answer"))
        if isinstance(event, h11.InformationalResponse):
            continue
        if isinstance(event, h11.Response):
            return event
        raise PeerUnreachable(f"unexpected answer from the peer: {event!r}")
