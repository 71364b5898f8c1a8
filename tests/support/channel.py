"""A small test client for ``POST /channel`` and ``GET /queues/{name}/stream``.

Test code, not the product client (that lives in ``client/``): trio + h11 over any
``trio.abc.Stream`` (a loopback socket, or a ``trio.testing`` memory stream), with
direct control of every byte -- how ops are grouped into chunks, when the request body
ends, whether the response is read at all, and how the socket dies.

``open_tcp_broker`` / ``open_memory_broker`` run an in-memory broker in-process, so
tests can look at its state (``app.runtime.core``, ``app.runtime.sinks``) directly.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterable
from typing import Any

import h11
import orjson
import trio
import trio.testing

from tests.support.http import HTTPConnection

__all__ = [
    "ChannelClient",
    "Clients",
    "ChannelEnded",
    "MemoryBroker",
    "StreamClient",
    "connect",
    "open_channel",
    "open_memory_broker",
    "open_stream",
    "open_tcp_broker",
    "rest",
    "wait_until",
]

Event = dict[str, Any]


class ChannelEnded(Exception):
    """The broker ended the response (or the connection) while events were awaited."""


async def wait_until(condition: Callable[[], bool], *, rounds: int = 200) -> None:
    """Let every task run until ``condition()`` holds (checked whenever all tasks are
    blocked). Fails after ``rounds`` quiet moments without it."""
    for _ in range(rounds):
        if condition():
            return
        await trio.testing.wait_all_tasks_blocked(cushion=0.01)
    assert condition(), "condition never became true"


# -- the HTTP side -----------------------------------------------------------------------


class _HTTP(HTTPConnection):
    """The one raw client connection (:class:`tests.support.http.HTTPConnection`),
    reading the response body of a channel or stream line by line."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        super().__init__(stream)
        self.status: int | None = None
        self.informational: list[int] = []
        self.headers: dict[str, str] = {}
        self.ended = False  # the response body ended
        self.eof = False  # the connection ended
        self._lines = bytearray()
        self.raw_bytes = 0

    async def send_event(self, event: h11.Event) -> None:
        await self._send(event)

    async def _receive(self) -> None:
        try:
            data = await self.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.eof = True
        self.raw_bytes += len(data)
        self.h11.receive_data(data)

    async def next_h11_event(self) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if self.eof:
                    raise ChannelEnded("the connection ended")
                await self._receive()
                continue
            assert not isinstance(event, type)
            return event

    async def read_head(self) -> None:
        while True:
            event = await self.next_h11_event()
            if isinstance(event, h11.InformationalResponse):
                self.informational.append(event.status_code)
                continue
            assert isinstance(event, h11.Response), event
            self.status = event.status_code
            self.headers = {k.decode(): v.decode() for k, v in event.headers}
            return

    async def read_line(self) -> bytes | None:
        """The next line of the response body, or None when the body has ended."""
        while True:
            index = self._lines.find(b"\n")
            if index >= 0:
                line = bytes(self._lines[: index + 1])
                del self._lines[: index + 1]
                return line
            if self.ended:
                return None
            try:
                event = await self.next_h11_event()
            except (ChannelEnded, h11.RemoteProtocolError):
                self.ended = True
                continue
            if isinstance(event, h11.Data):
                self._lines += event.data
            elif isinstance(event, h11.EndOfMessage):
                self.ended = True
            elif isinstance(event, h11.ConnectionClosed):
                self.ended = True

    async def read_rest(self) -> bytes:
        while not self.ended:
            try:
                event = await self.next_h11_event()
            except (ChannelEnded, h11.RemoteProtocolError):
                break
            if isinstance(event, h11.Data):
                self._lines += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                break
        self.ended = True
        out = bytes(self._lines)
        self._lines.clear()
        return out

    async def abort(self) -> None:
        """Kill the connection the way a crashed client does: RST, not FIN."""
        sock = getattr(self.stream, "socket", None)
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await trio.aclose_forcefully(self.stream)


async def connect(port: int, *, rcvbuf: int | None = None) -> trio.SocketStream:
    """A loopback TCP connection; ``rcvbuf`` shrinks the receive window (set before
    connecting, so that the kernel buffers little of what the broker sends)."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


# -- channels --------------------------------------------------------------------------


class ChannelClient:
    """The client end of one channel. Ops go out with :meth:`send` (all ops of one
    call in one chunk); events come back one at a time from :meth:`next_event`."""

    def __init__(self, http: _HTTP) -> None:
        self.http = http
        self.open_event: Event | None = None
        self.channel_id: int | None = None
        self.body_ended = False
        self._sync_n = 0
        #: Events read while waiting for a reply, not yet returned by sync().
        self.backlog: list[Event] = []

    # -- sending

    async def send(self, *ops: Event) -> None:
        """Send ``ops`` as NDJSON lines in one chunk."""
        await self.send_raw(b"".join(orjson.dumps(op) + b"\n" for op in ops))

    async def send_raw(self, data: bytes) -> None:
        await self.http.send_event(h11.Data(data=data))

    async def end_body(self) -> None:
        """End the request body (the terminating zero-length chunk)."""
        self.body_ended = True
        await self.http.send_event(h11.EndOfMessage())

    async def abort(self) -> None:
        await self.http.abort()

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.http.stream)

    # -- receiving

    async def next_event(self) -> Event:
        """The next event. Raises ChannelEnded once the response has ended."""
        line = await self.http.read_line()
        if line is None:
            raise ChannelEnded("the response ended")
        event = orjson.loads(line)
        assert isinstance(event, dict), line
        return event

    async def events_until(self, stop: Callable[[Event], bool]) -> list[Event]:
        """Events up to and including the first one ``stop`` accepts."""
        events = []
        while True:
            event = await self.next_event()
            events.append(event)
            if stop(event):
                return events

    async def expect(self, ev: str, **fields: Any) -> Event:
        """The next event, which must be ``ev`` with these fields."""
        event = await self.next_event()
        assert event.get("ev") == ev, event
        for name, value in fields.items():
            assert event.get(name) == value, (name, event)
        return event

    async def remaining_events(self) -> list[Event]:
        """Every event until the response ends."""
        events = []
        while True:
            try:
                events.append(await self.next_event())
            except ChannelEnded:
                return events

    async def call(self, op: Event) -> Event:
        """Send ``op`` with a fresh ``id`` and return its reply (``ok``,
        ``consume_ok``, ``cancel_ok``, ``close_ok``, or ``error``). Events that arrive
        before the reply are kept in ``backlog`` (see :meth:`sync`)."""
        self._sync_n += 1
        op = {**op, "id": f"call-{self._sync_n}"}
        await self.send(op)
        events = await self.events_until(lambda e: e.get("id") == op["id"])
        self.backlog.extend(events[:-1])
        return events[-1]

    async def ok(self, op: Event) -> Event:
        """:meth:`call` that must not fail."""
        reply = await self.call(op)
        assert reply["ev"] != "error", reply
        return reply

    async def sync(self) -> list[Event]:
        """A barrier: return every event not yet returned by :meth:`sync` (the backlog
        of :meth:`call`, then whatever precedes a fresh reply). Events caused by ops
        sent so far (deliveries, returns, confirms not waiting for the disk, expiries)
        are all in it (docs/protocol.md, "Ordering")."""
        await self.ok({"op": "declare_exchange", "exchange": "amq.direct", "passive": True})
        events, self.backlog = self.backlog, []
        return events


async def open_channel(
    stream: trio.abc.Stream, *, expect_continue: bool = False, headers: Iterable[tuple[str, str]] = ()
) -> ChannelClient:
    """Send the head of ``POST /channel`` (with any extra ``headers``, such as
    credentials) and read up to the ``open`` event."""
    http = _HTTP(stream)
    extra = list(headers)
    headers = [
        ("Host", "broker.test"),
        ("Content-Type", "application/x-ndjson"),
        ("Transfer-Encoding", "chunked"),
        *extra,
    ]
    if expect_continue:
        headers.append(("Expect", "100-continue"))
    await http.send_event(h11.Request(method="POST", target="/channel", headers=headers))
    await http.read_head()
    client = ChannelClient(http)
    assert http.status == 200, (http.status, await http.read_rest())
    event = await client.next_event()
    assert event["ev"] == "open", event
    client.open_event = event
    client.channel_id = event["channel"]
    return client


# -- streaming consume -------------------------------------------------------------------


class StreamClient:
    def __init__(self, http: _HTTP) -> None:
        self.http = http

    @property
    def status(self) -> int | None:
        return self.http.status

    @property
    def headers(self) -> dict[str, str]:
        return self.http.headers

    async def next_item(self) -> Event:
        """The next NDJSON line as an object. Raises ChannelEnded at the end."""
        line = await self.http.read_line()
        if line is None:
            raise ChannelEnded("the response ended")
        return orjson.loads(line)  # type: ignore[no-any-return]

    async def next_sse(self) -> tuple[str | None, Event | None]:
        """The next SSE event as (event name, parsed data); comments are skipped."""
        name: str | None = None
        data: list[bytes] = []
        while True:
            line = await self.http.read_line()
            if line is None:
                raise ChannelEnded("the response ended")
            line = line.rstrip(b"\n")
            if not line:
                if data or name:
                    return name, orjson.loads(b"\n".join(data)) if data else None
                continue
            if line.startswith(b":"):
                continue
            field, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if field == b"event":
                name = value.decode()
            elif field == b"data":
                data.append(value)

    async def read_rest(self) -> bytes:
        return await self.http.read_rest()

    async def abort(self) -> None:
        await self.http.abort()

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.http.stream)


async def open_stream(
    stream: trio.abc.Stream,
    queue: str,
    query: str = "",
    *,
    accept: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
) -> StreamClient:
    http = _HTTP(stream)
    headers = [("Host", "broker.test"), *headers]
    if accept is not None:
        headers.append(("Accept", accept))
    target = f"/queues/{queue}/stream" + (f"?{query}" if query else "")
    await http.send_event(h11.Request(method="GET", target=target, headers=headers))
    await http.send_event(h11.EndOfMessage())
    await http.read_head()
    return StreamClient(http)


# -- bookkeeping ------------------------------------------------------------------------


class Clients:
    """Opens channels, streams and REST calls to one broker and closes every
    connection it opened on exit (tests must not leak sockets: warnings are errors).

    ``connect`` is a zero-argument async callable returning a new stream; ``port``
    is the shortcut for a loopback TCP broker."""

    def __init__(
        self,
        port: int | None = None,
        *,
        connect_fn: Callable[[], Any] | None = None,
    ) -> None:
        if connect_fn is None:
            assert port is not None

            async def connect_fn() -> trio.abc.Stream:
                return await connect(port)

        self._connect = connect_fn
        self._streams: list[trio.abc.Stream] = []

    async def new_stream(self) -> trio.abc.Stream:
        stream = await self._connect()
        self._streams.append(stream)
        return stream

    def track(self, stream: trio.abc.Stream) -> trio.abc.Stream:
        self._streams.append(stream)
        return stream

    async def channel(self, **kwargs: Any) -> ChannelClient:
        return await open_channel(await self.new_stream(), **kwargs)

    async def stream(self, queue: str, query: str = "", **kwargs: Any) -> StreamClient:
        return await open_stream(await self.new_stream(), queue, query, **kwargs)

    async def rest(self, method: str, target: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        return await rest(await self.new_stream(), method, target, body, **kwargs)

    async def aclose(self) -> None:
        for stream in self._streams:
            await trio.aclose_forcefully(stream)
        self._streams.clear()

    async def __aenter__(self) -> Clients:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- one-shot REST ----------------------------------------------------------------------


async def rest(
    stream: trio.abc.Stream,
    method: str,
    target: str,
    body: Any = None,
    *,
    headers: Iterable[tuple[str, str]] = (),
) -> tuple[int, Any]:
    """One request on a fresh connection: (status, parsed JSON body or None)."""
    http = _HTTP(stream)
    data = b"" if body is None else body if isinstance(body, bytes) else orjson.dumps(body)
    fields = [("Host", "broker.test"), ("Content-Length", str(len(data))), ("Connection", "close")]
    fields.extend(headers)
    try:
        await http.send_event(h11.Request(method=method, target=target, headers=fields))
        await http.send_event(h11.Data(data=data))
        await http.send_event(h11.EndOfMessage())
        await http.read_head()
        raw = await http.read_rest()
    finally:
        await trio.aclose_forcefully(stream)
    assert http.status is not None
    return http.status, orjson.loads(raw) if raw.strip() else None
