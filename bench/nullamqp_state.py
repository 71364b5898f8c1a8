"""The null AMQP peer's entities (``bench.nullamqp``): what it keeps, and its per-message work.

A queue is a count and the one message its deliveries repeat; a route is where the
bytes of one ``basic.publish`` method go; a consumer is kept at its prefetch with
pre-encoded deliveries; a channel holds its confirm and transaction modes, its
publish in progress and its unacked deliveries. No sockets here: a channel writes
its frames to its connection's ``out`` (a :class:`Link`), and the server process
(``bench.nullamqp``) sends them.
"""

from __future__ import annotations

import struct
from typing import Protocol

from pamqp import commands as spec

__all__ = [
    "FRAME_HEADER",
    "MAX_ENTITIES",
    "OUT_LIMIT",
    "PUBLISH",
    "U32",
    "U64",
    "UNLIMITED_PREFETCH",
    "Channel",
    "ChannelError",
    "ConnectionError_",
    "Consumer",
    "Link",
    "NullBroker",
    "Queue",
    "Route",
]

MAX_ENTITIES = 100_000  # queues, exchanges, bindings of an exchange, cached routes
OUT_LIMIT = 8 * 1024 * 1024  # a connection's unsent bytes before it is read no more
UNLIMITED_PREFETCH = 10_000  # a consumer's deliveries outstanding with prefetch 0

FRAME_HEADER = struct.Struct(">BHI")  # type, channel, size
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
PUBLISH = spec.Basic.Publish.index


class Link(Protocol):
    """What the entities need of a connection: where its frames go."""

    broker: NullBroker
    out: list[bytes]  # frames to send, joined into one ``send``
    frame_max: int

    def flush(self) -> None: ...


class ConnectionError_(Exception):
    """A connection exception: Connection.Close with this reply code."""

    def __init__(self, code: int, text: str, index: int = 0) -> None:
        super().__init__(text)
        self.code, self.text, self.index = code, text, index


class ChannelError(ConnectionError_):
    """A channel exception: Channel.Close with this reply code."""


def _shortstr(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw)]) + raw


class Queue:
    """A queue's count of messages and the one message every delivery repeats."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.count = 0
        self.sample: tuple[str, str, bytes, bytes] | None = None  # exchange, key, header payload, body
        self.consumers: list[Consumer] = []


class Route:
    """Where one publish method (its bytes) goes: the queues, and its exchange and key."""

    def __init__(self, exchange: str, key: str, queues: list[Queue]) -> None:
        self.exchange, self.key, self.queues = exchange, key, queues
        self.sampled = False  # every queue has its message to repeat

    def needs_sample(self) -> bool:
        if not self.sampled:
            self.sampled = all(queue.sample is not None for queue in self.queues)
        return not self.sampled


class NullBroker:
    """The entities all connections share: queues, exchanges, bindings, routes."""

    def __init__(self) -> None:
        self.queues: dict[str, Queue] = {}
        self.exchanges: dict[str, str] = {"": "direct", "amq.direct": "direct", "amq.fanout": "fanout"}
        self.bindings: dict[str, list[tuple[str, Queue]]] = {}  # exchange -> (key, queue)
        self.routes: dict[bytes, Route] = {}  # publish method payload -> its route
        self.dirty: set[Queue] = set()  # queues with consumers that got messages
        self.to_flush: set[Link] = set()  # connections with output to send
        self.names = 0

    def route(self, payload: bytes) -> Route:
        route = self.routes.get(payload)
        if route is None:
            exchange, key = publish_names(payload)
            if exchange not in self.exchanges:
                raise ChannelError(404, f"NOT_FOUND - no exchange '{exchange}'", PUBLISH)
            if exchange == "":
                queues = [self.queues[key]] if key in self.queues else []
            else:
                fanout = self.exchanges[exchange] == "fanout"
                queues = list({q.name: q for k, q in self.bindings.get(exchange, ()) if fanout or k == key}.values())
            if len(self.routes) >= MAX_ENTITIES:
                self.routes.clear()
            route = self.routes[payload] = Route(exchange, key, queues)
        return route

    def topology_changed(self) -> None:
        self.routes.clear()

    def queue(self, name: str, index: int) -> Queue:
        if name not in self.queues:
            raise ChannelError(404, f"NOT_FOUND - no queue '{name}'", index)
        return self.queues[name]

    def dispatch(self) -> None:
        for queue in self.dirty:
            for consumer in queue.consumers:
                consumer.fill()
        self.dirty.clear()


def publish_names(payload: bytes) -> tuple[str, str]:
    """(exchange, routing key) of a basic.publish's arguments (after the reserved short)."""
    try:
        n = payload[2]
        exchange = payload[3:3 + n].decode()
        m = payload[3 + n]
        return exchange, payload[4 + n:4 + n + m].decode()
    except (IndexError, UnicodeDecodeError) as exc:
        raise ConnectionError_(502, f"SYNTAX_ERROR - basic.publish: {exc}", PUBLISH) from exc


class Consumer:
    """One basic.consume: kept at ``prefetch`` deliveries outstanding."""

    def __init__(self, channel: Channel, tag: str, queue: Queue, prefetch: int) -> None:
        self.channel, self.tag, self.queue = channel, tag, queue
        self.prefetch = prefetch or UNLIMITED_PREFETCH
        self.outstanding = 0
        self.active = True
        self.frames: tuple[bytes, bytes] | None = None  # a delivery's bytes before and after its tag

    def _encode(self, sample: tuple[str, str, bytes, bytes]) -> tuple[bytes, bytes]:
        exchange, key, header, body = sample
        ch = self.channel.number
        ctag, tail = _shortstr(self.tag), b"\x00" + _shortstr(exchange) + _shortstr(key)
        prefix = FRAME_HEADER.pack(1, ch, 4 + len(ctag) + 8 + len(tail)) + U32.pack(spec.Basic.Deliver.index) + ctag
        parts = [tail, b"\xce", FRAME_HEADER.pack(2, ch, len(header)), header, b"\xce"]
        step = self.channel.conn.frame_max - 8
        for at in range(0, len(body), step):
            piece = body[at:at + step]
            parts += [FRAME_HEADER.pack(3, ch, len(piece)), piece, b"\xce"]
        return prefix, b"".join(parts)

    def fill(self) -> None:
        """Send as many deliveries as the prefetch allows and the queue holds."""
        queue = self.queue
        n = min(self.prefetch - self.outstanding, queue.count)
        if n <= 0 or not self.active or queue.sample is None:
            return
        if self.frames is None:
            self.frames = self._encode(queue.sample)
        prefix, suffix = self.frames
        n = min(n, max(1, OUT_LIMIT // (len(prefix) + 8 + len(suffix))))
        ch = self.channel
        first = ch.delivery_tag + 1
        ch.delivery_tag += n
        queue.count -= n
        self.outstanding += n
        ch.unacked.update(dict.fromkeys(range(first, first + n), self))
        pack = U64.pack
        ch.conn.out.append(b"".join([prefix + pack(tag) + suffix for tag in range(first, first + n)]))
        ch.conn.broker.to_flush.add(ch.conn)


class Channel:
    """A channel's modes, its publish in progress, its consumers and unacked deliveries."""

    def __init__(self, conn: Link, number: int) -> None:
        self.conn, self.number = conn, number
        self.closing = False
        self.confirm = False
        self.published = 0  # publish sequence number (confirm mode)
        self.confirmed = 0
        self.tx: dict[Queue, int] | None = None  # an open transaction's publishes per queue
        self.prefetch = 0
        self.consumers: dict[str, Consumer] = {}
        self.delivery_tag = 0
        self.unacked: dict[int, Consumer] = {}
        self.route: Route | None = None  # a publish whose content is being read
        self.remaining = 0
        self.sampling: list[bytes] | None = None  # header payload, then body pieces

    def settle(self, tag: int, multiple: bool, requeue: bool | None, index: int) -> None:
        """Ack (``requeue`` None), nack or reject deliveries; their consumers refill."""
        broker = self.conn.broker
        if not multiple and requeue is None:  # the per-message path: one ack
            consumer = self.unacked.pop(tag, None)
            if consumer is None:
                raise ChannelError(406, f"PRECONDITION_FAILED - unknown delivery tag {tag}", index)
            consumer.outstanding -= 1
            if consumer.queue.consumers:
                broker.dirty.add(consumer.queue)
            return
        if multiple:
            tags = [t for t in self.unacked if t <= tag] if tag else list(self.unacked)
        elif tag in self.unacked:
            tags = [tag]
        else:
            raise ChannelError(406, f"PRECONDITION_FAILED - unknown delivery tag {tag}", index)
        for t in tags:
            consumer = self.unacked.pop(t)
            consumer.outstanding -= 1
            if requeue:
                consumer.queue.count += 1
            if consumer.queue.consumers:
                broker.dirty.add(consumer.queue)

    def published_one(self) -> None:
        route = self.route
        assert route is not None
        if self.sampling is not None:
            sample = (route.exchange, route.key, self.sampling[0], b"".join(self.sampling[1:]))
            for queue in route.queues:
                queue.sample = queue.sample or sample
            self.sampling = None
        if self.tx is not None:
            for queue in route.queues:
                self.tx[queue] = self.tx.get(queue, 0) + 1
        else:
            dirty = self.conn.broker.dirty
            for queue in route.queues:
                queue.count += 1
                if queue.consumers:
                    dirty.add(queue)
        if self.confirm:
            self.published += 1
        self.route = None

    def release(self) -> None:
        """The channel is gone: its consumers stop, its unacked deliveries go back."""
        for consumer in self.consumers.values():
            consumer.active = False
            consumer.queue.consumers.remove(consumer)
        for consumer in self.unacked.values():
            consumer.queue.count += 1
            self.conn.broker.dirty.add(consumer.queue)
        self.unacked.clear()
        self.consumers.clear()
