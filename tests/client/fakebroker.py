"""An in-process fake broker for client tests: the channel protocol (docs/protocol.md)
and the REST calls the client uses, over in-memory byte streams (trio or asyncio, through anyio).

Written independently of the client's codec (plain orjson/base64 here) so the two
check each other. It keeps state in memory and models what matters to the client:

- publishes numbered per channel and confirmed in order (one ``ack`` each, or
  coalesced ``multiple`` acks per received chunk with ``ack_mode="batch"``);
  ``return`` before the ack of an unroutable mandatory publish; dedup by message_id;
- deliveries bounded by prefetch; ack/nack/reject; requeue to the original position;
  unacked deliveries of a channel that ends go back with ``redelivered``;
- faults: ``crash()`` drops every connection at once (like kill -9, with queues kept
  as if durable) and can refuse connections for a while; ``crash_after_publishes``
  crashes mid-stream, before or after storing the triggering publish; ``nack_ids``;
  ``hold_confirms``; ``channel_status`` to answer ``POST /channel`` with an error.
"""

from __future__ import annotations

import base64
import itertools
import socket
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import h11
import orjson
from sortedcontainers import SortedList

from client.endpoint import Endpoint
from client.transport import receive_some
from tests.support.memstream import memory_stream_pair


@dataclass
class FakeMessage:
    seq: int
    body: dict[str, str]
    properties: dict[str, Any]
    exchange: str
    routing_key: str
    redelivered: bool = False

    @property
    def message_id(self) -> str | None:
        return self.properties.get("message_id")

    @property
    def data(self) -> bytes:
        if "body" in self.body:
            return self.body["body"].encode()
        return base64.b64decode(self.body["body_b64"])


@dataclass
class FakeQueue:
    name: str
    durable: bool = True
    ready: SortedList = field(default_factory=lambda: SortedList(key=lambda m: m.seq))
    unacked: int = 0


@dataclass
class FakeConsumer:
    channel: FakeChannel
    tag: str
    queue: str
    prefetch: int
    no_ack: bool
    unacked: int = 0


class ChannelDropped(Exception):
    pass


class FakeChannel:
    def __init__(self, broker: FakeBroker, cid: int) -> None:
        self.broker = broker
        self.id = cid
        self.publish_tag = 0
        self.delivery_tag = 0
        self.consumers: dict[str, FakeConsumer] = {}
        self.unacked: dict[int, tuple[str, FakeMessage, str]] = {}
        self.outbox: list[bytes] = []
        self.wake = anyio.Event()
        self.dead = False
        self.closing = False
        self.pending_ack: int | None = None
        self.held: list[int] = []
        self.ops: list[dict[str, Any]] = []

    def send(self, ev: dict[str, Any]) -> None:
        if self.dead:
            return
        self.outbox.append(orjson.dumps(ev) + b"\n")
        self.wake.set()

    def flush_acks(self) -> None:
        if self.pending_ack is not None:
            self.send({"ev": "ack", "delivery_tag": self.pending_ack, "multiple": True})
            self.pending_ack = None


class FakeBroker:
    def __init__(self, nursery: anyio.abc.TaskGroup) -> None:
        self._nursery = nursery
        self.queues: dict[str, FakeQueue] = {}
        self.exchanges: dict[str, str] = {"": "direct", "amq.direct": "direct", "amq.fanout": "fanout"}
        self.bindings: list[tuple[str, str, str]] = []  # exchange, queue, routing_key
        self.seen_ids: set[str] = set()
        self.channels: dict[int, FakeChannel] = {}
        self._scopes: set[anyio.CancelScope] = set()
        self._seq = itertools.count(1)
        self._cid = itertools.count(1)
        self._leases: dict[str, tuple[str, FakeMessage]] = {}
        self._lease_ids = itertools.count(1)
        # knobs
        self.ack_mode = "each"
        self.hold_confirms = False
        self.nack_ids: set[str] = set()
        self.crash_after_publishes: int | None = None
        self.crash_stores_publish = True
        self.crash_down_s = 0.0
        self.channel_status = 200
        self.refuse_until = -1.0
        self.refuse = False
        self.echo_error_ids = True
        # Connect over a socket pair instead of memory streams: the client then sees a
        # socket stream, which it may write to directly (client/session.py).
        self.socket_streams = False
        # observations
        self.publishes = 0
        self.duplicates = 0
        self.connects = 0
        self.attempts = 0
        self.channels_opened = 0
        self.acked_ids: list[str | None] = []
        self.ops_seen: list[dict[str, Any]] = []
        #: The client's end of each socket pair (with ``socket_streams``).
        self.client_sockets: list[socket.socket] = []

    # --- connections ------------------------------------------------------------------

    async def open_stream(self, endpoint: Endpoint) -> anyio.abc.ByteStream:
        await anyio.lowlevel.checkpoint()
        self.attempts += 1
        if self.refuse or anyio.current_time() < self.refuse_until:
            raise ConnectionRefusedError(111, "Connection refused (fake)")
        self.connects += 1
        client_side: anyio.abc.ByteStream
        server_side: anyio.abc.ByteStream
        if self.socket_streams:
            client_sock, server_sock = socket.socketpair()
            self.client_sockets.append(client_sock)
            client_side = await anyio.abc.UNIXSocketStream.from_socket(client_sock)
            server_side = await anyio.abc.UNIXSocketStream.from_socket(server_sock)
        else:
            client_side, server_side = memory_stream_pair()
        self._nursery.start_soon(self._serve_connection, server_side)
        return client_side

    def crash(self, down_s: float = 0.0) -> None:
        """Drop every connection at once; refuse new ones for ``down_s``."""
        self.refuse_until = anyio.current_time() + down_s
        for ch in list(self.channels.values()):
            ch.dead = True
        for scope in list(self._scopes):
            scope.cancel()

    async def _serve_connection(self, stream: anyio.abc.ByteStream) -> None:
        with anyio.CancelScope() as scope:
            self._scopes.add(scope)
            try:
                await self._http_loop(stream)
            except* (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError, h11.ProtocolError):
                pass
            finally:
                self._scopes.discard(scope)
                await anyio.aclose_forcefully(stream)

    async def _next_event(self, stream: anyio.abc.ByteStream, conn: h11.Connection) -> Any:
        while True:
            ev = conn.next_event()
            if ev is not h11.NEED_DATA:
                return ev
            conn.receive_data(await receive_some(stream, 65536))

    async def _http_loop(self, stream: anyio.abc.ByteStream) -> None:
        conn = h11.Connection(h11.SERVER)
        while True:
            req = await self._next_event(stream, conn)
            if isinstance(req, h11.ConnectionClosed):
                return
            assert isinstance(req, h11.Request), req
            target = req.target.decode()
            if req.method == b"POST" and target.split("?")[0] == "/channel":
                await self._serve_channel(stream, conn)
                return
            chunks = []
            while True:
                ev = await self._next_event(stream, conn)
                if isinstance(ev, h11.Data):
                    chunks.append(bytes(ev.data))
                elif isinstance(ev, h11.EndOfMessage):
                    break
            status, payload = self.rest(req.method.decode(), target, b"".join(chunks))
            body = orjson.dumps(payload)
            out = conn.send(h11.Response(status_code=status, headers=[
                ("Content-Type", "application/json"), ("Content-Length", str(len(body)))]))
            out += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
            await stream.send(out)
            conn.start_next_cycle()

    # --- channels ---------------------------------------------------------------------

    async def _serve_channel(self, stream: anyio.abc.ByteStream, conn: h11.Connection) -> None:
        if self.channel_status != 200:
            body = orjson.dumps({"error": "unavailable", "message": "fake says no"})
            out = conn.send(h11.Response(status_code=self.channel_status, headers=[
                ("Content-Length", str(len(body)))]))
            await stream.send(out + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
            return
        ch = FakeChannel(self, next(self._cid))
        self.channels[ch.id] = ch
        self.channels_opened += 1
        await stream.send(conn.send(h11.Response(status_code=200, headers=[
            ("Content-Type", "application/x-ndjson"), ("Transfer-Encoding", "chunked")])))
        ch.send({"ev": "open", "channel": str(ch.id), "server": "fake"})
        try:
            async with anyio.create_task_group() as nursery:
                nursery.start_soon(self._channel_writer, stream, conn, ch)
                buf = b""
                while not ch.dead and not ch.closing:
                    ev = await self._next_event(stream, conn)
                    if not isinstance(ev, h11.Data):
                        break  # request ended or connection closed
                    buf += bytes(ev.data)
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if line.strip() and not ch.dead and not ch.closing:
                            self._handle_op(ch, orjson.loads(line))
                    ch.flush_acks()
                # after close (or the client ending its body), let the writer finish
                if not ch.closing:
                    ch.dead = True
                    nursery.cancel_scope.cancel()
        finally:
            self._end_channel(ch)

    async def _channel_writer(self, stream: anyio.abc.ByteStream, conn: h11.Connection, ch: FakeChannel) -> None:
        while True:
            if ch.dead:
                return
            if ch.outbox:
                data, ch.outbox = b"".join(ch.outbox), []
                await stream.send(conn.send(h11.Data(data=data)))
                continue
            if ch.closing:
                await stream.send(conn.send(h11.EndOfMessage()))
                return
            ch.wake = anyio.Event()
            await ch.wake.wait()

    def _end_channel(self, ch: FakeChannel) -> None:
        ch.dead = True
        self.channels.pop(ch.id, None)
        touched = set()
        for _, (queue, msg, ctag) in sorted(ch.unacked.items()):
            q = self.queues.get(queue)
            if q is not None:
                msg.redelivered = True
                q.unacked -= 1
                q.ready.add(msg)
                touched.add(queue)
        ch.unacked.clear()
        ch.consumers.clear()
        for queue in touched:
            self._deliver(queue)

    def error(self, ch: FakeChannel, op: dict[str, Any], code: str, message: str) -> None:
        ev: dict[str, Any] = {"ev": "error", "error": code, "message": message}
        if "id" in op and self.echo_error_ids:
            ev["id"] = op["id"]
        ch.flush_acks()
        ch.send(ev)
        ch.closing = True  # the channel is closed after an error
        ch.wake.set()

    def ok(self, ch: FakeChannel, op: dict[str, Any], **fields: Any) -> None:
        ch.send({"ev": "ok", "op": op["op"], "id": op.get("id"), **fields})

    def _handle_op(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        ch.ops.append(op)
        self.ops_seen.append(op)
        kind = op.get("op")
        handler = getattr(self, f"_op_{kind}", None)
        if handler is None:
            self.error(ch, op, "unknown_op", f"unknown op {kind!r}")  # as the broker
            return
        handler(ch, op)

    def _op_publish(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        ch.publish_tag += 1
        tag = ch.publish_tag
        exchange = op.get("exchange", "")
        if len(op.get("routing_key", "").encode()) > 255:
            # as the broker: a channel error naming the limit
            self.error(ch, op, "invalid_argument", "routing_key is longer than 255 bytes")
            return
        if exchange not in self.exchanges:
            # as the broker: a nack, the channel stays open
            ch.flush_acks()
            ch.send({"ev": "nack", "delivery_tag": tag, "multiple": False,
                     "reason": f"not_found: no exchange {exchange!r}"})
            return
        props = op.get("properties", {})
        body = {k: op[k] for k in ("body", "body_b64") if k in op}
        msg = FakeMessage(0, body, props, exchange, op.get("routing_key", ""))
        self.publishes += 1
        crash_now = self.crash_after_publishes is not None and self.publishes >= self.crash_after_publishes
        if crash_now:
            self.crash_after_publishes = None
            if self.crash_stores_publish:
                self._store(ch, tag, op, msg)
            self.crash(self.crash_down_s)
            return
        if msg.message_id in self.nack_ids:
            self.nack_ids.discard(msg.message_id)
            ch.flush_acks()
            ch.send({"ev": "nack", "delivery_tag": tag, "multiple": False, "reason": "fake nack"})
            return
        returned = self._store(ch, tag, op, msg)
        if returned:
            ch.flush_acks()
            ch.send({"ev": "return", "delivery_tag": tag, "reply_code": 312, "reason": "NO_ROUTE",
                     "exchange": exchange, "routing_key": msg.routing_key,
                     "message": {**body, "properties": props}})
        self._confirm(ch, tag)

    def _store(self, ch: FakeChannel, tag: int, op: dict[str, Any], msg: FakeMessage) -> bool:
        """Enqueue (unless a duplicate); return whether it must be returned."""
        mid = msg.message_id
        if mid is not None and mid in self.seen_ids:
            self.duplicates += 1
            return False
        queues = self._route(msg.exchange, msg.routing_key)
        if mid is not None:
            self.seen_ids.add(mid)
        for name in queues:
            copy = FakeMessage(next(self._seq), msg.body, msg.properties, msg.exchange, msg.routing_key)
            self.queues[name].ready.add(copy)
        for name in queues:
            self._deliver(name)
        return not queues and bool(op.get("mandatory"))

    def _confirm(self, ch: FakeChannel, tag: int) -> None:
        if self.hold_confirms:
            ch.held.append(tag)
        elif self.ack_mode == "batch":
            ch.pending_ack = tag
        else:
            ch.send({"ev": "ack", "delivery_tag": tag, "multiple": False})

    def release_confirms(self, multiple: bool = True) -> None:
        for ch in self.channels.values():
            if ch.held:
                if multiple:
                    ch.send({"ev": "ack", "delivery_tag": ch.held[-1], "multiple": True})
                else:
                    for tag in ch.held:
                        ch.send({"ev": "ack", "delivery_tag": tag, "multiple": False})
                ch.held.clear()

    def _route(self, exchange: str, routing_key: str) -> list[str]:
        if exchange == "":
            return [routing_key] if routing_key in self.queues else []
        kind = self.exchanges[exchange]
        out = []
        for ex, queue, key in self.bindings:
            if ex == exchange and (kind == "fanout" or key == routing_key) and queue not in out:
                out.append(queue)
        return out

    def _deliver(self, queue: str) -> None:
        q = self.queues.get(queue)
        if q is None:
            return
        consumers = [c for ch in self.channels.values() if not ch.dead
                     for c in ch.consumers.values() if c.queue == queue]
        progress = True
        while q.ready and progress:
            progress = False
            for c in consumers:
                if not q.ready:
                    break
                if c.prefetch and c.unacked >= c.prefetch:
                    continue
                msg = q.ready.pop(0)
                ch = c.channel
                ch.delivery_tag += 1
                if not c.no_ack:
                    ch.unacked[ch.delivery_tag] = (queue, msg, c.tag)
                    c.unacked += 1
                    q.unacked += 1
                ch.send({"ev": "deliver", "consumer_tag": c.tag, "delivery_tag": ch.delivery_tag,
                         "redelivered": msg.redelivered, "exchange": msg.exchange,
                         "routing_key": msg.routing_key,
                         "message": {**msg.body, "properties": msg.properties}})
                progress = True

    def _op_consume(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        queue = op.get("queue", "")
        if queue not in self.queues:
            self.error(ch, op, "not_found", f"no queue {queue!r}")
            return
        tag = op.get("consumer_tag") or f"fake-ctag-{next(self._seq)}"
        if tag in ch.consumers:
            self.error(ch, op, "precondition_failed", f"consumer tag {tag!r} in use")
            return
        ch.consumers[tag] = FakeConsumer(ch, tag, queue, int(op.get("prefetch", 0)), bool(op.get("no_ack")))
        ch.send({"ev": "consume_ok", "consumer_tag": tag, "id": op.get("id")})
        self._deliver(queue)

    def _op_cancel(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        tag = op.get("consumer_tag", "")
        ch.consumers.pop(tag, None)
        ch.send({"ev": "cancel_ok", "consumer_tag": tag, "id": op.get("id")})

    def _settle(self, ch: FakeChannel, op: dict[str, Any], requeue: bool | None) -> None:
        dtag = op.get("delivery_tag")
        if op.get("multiple"):
            tags = [t for t in ch.unacked if t <= dtag]
        else:
            tags = [dtag] if dtag in ch.unacked else []
        if not tags:
            self.error(ch, op, "unknown_delivery_tag", f"unknown delivery tag {dtag}")  # as the broker
            return
        touched = set()
        for t in tags:
            queue, msg, ctag = ch.unacked.pop(t)
            consumer = ch.consumers.get(ctag)
            if consumer is not None:
                consumer.unacked -= 1
            q = self.queues.get(queue)
            if q is not None:
                q.unacked -= 1
                if requeue:
                    msg.redelivered = True
                    q.ready.add(msg)
            if requeue is None:
                self.acked_ids.append(msg.message_id)
            touched.add(queue)
        for queue in touched:
            self._deliver(queue)

    def _op_ack(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        self._settle(ch, op, None)

    def _op_nack(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        self._settle(ch, op, bool(op.get("requeue", True)))

    def _op_reject(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        self._settle(ch, {**op, "multiple": False}, bool(op.get("requeue", True)))

    def _op_declare_queue(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        name = op.get("queue") or f"amq.gen-{next(self._seq)}"
        if op.get("passive") and name not in self.queues:
            self.error(ch, op, "not_found", f"no queue {name!r}")
            return
        q = self.queues.setdefault(name, FakeQueue(name, bool(op.get("durable", True))))
        consumers = sum(1 for c in self.channels.values() for x in c.consumers.values() if x.queue == name)
        self.ok(ch, op, queue=name, messages=len(q.ready), consumers=consumers)

    def _op_declare_exchange(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        name = op["exchange"]
        kind = op.get("type", "direct")
        if name in self.exchanges and self.exchanges[name] != kind:
            self.error(ch, op, "precondition_failed", f"exchange {name!r} exists with type {self.exchanges[name]}")
            return
        self.exchanges[name] = kind
        self.ok(ch, op)

    def _op_bind(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        ex, queue, key = op.get("exchange", ""), op.get("queue", ""), op.get("routing_key", "")
        if ex not in self.exchanges or queue not in self.queues:
            self.error(ch, op, "not_found", "no such exchange or queue")
            return
        if (ex, queue, key) not in self.bindings:
            self.bindings.append((ex, queue, key))
        self.ok(ch, op)

    def _op_unbind(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        b = (op.get("exchange", ""), op.get("queue", ""), op.get("routing_key", ""))
        if b in self.bindings:
            self.bindings.remove(b)
        self.ok(ch, op)

    def _op_delete_queue(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        q = self.queues.pop(op["queue"], None)
        self.bindings = [b for b in self.bindings if b[1] != op["queue"]]
        self.ok(ch, op, messages=len(q.ready) if q else 0)

    def _op_purge_queue(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        q = self.queues.get(op["queue"])
        n = len(q.ready) if q else 0
        if q:
            q.ready.clear()
        self.ok(ch, op, messages=n)

    def _op_qos(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        self.ok(ch, op)

    def _op_close(self, ch: FakeChannel, op: dict[str, Any]) -> None:
        ch.flush_acks()
        # as the broker: the reply echoes the op's id
        ch.send({"ev": "close_ok", **({"id": op["id"]} if "id" in op else {})})
        ch.closing = True
        ch.wake.set()

    # --- helpers for tests ------------------------------------------------------------

    def cancel_consumers_of(self, queue: str) -> None:
        for ch in self.channels.values():
            for tag, c in list(ch.consumers.items()):
                if c.queue == queue:
                    del ch.consumers[tag]
                    ch.send({"ev": "cancel", "consumer_tag": tag, "reason": "queue deleted"})

    def forget_topology(self) -> None:
        """Lose every queue, exchange and binding (a broker restarted without them)."""
        self.queues.clear()
        self.exchanges = {"": "direct", "amq.direct": "direct", "amq.fanout": "fanout"}
        self.bindings.clear()

    def announce_closing(self) -> None:
        for ch in self.channels.values():
            ch.send({"ev": "closing", "reason": "shutdown"})

    def bodies(self, queue: str) -> list[bytes]:
        return [m.data for m in self.queues[queue].ready]

    # --- REST -------------------------------------------------------------------------

    def rest(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        parts = urllib.parse.urlsplit(target)
        path = [urllib.parse.unquote(p) for p in parts.path.strip("/").split("/")]
        query = dict(urllib.parse.parse_qsl(parts.query))
        data = orjson.loads(body) if body else {}
        if path == ["healthz"]:
            return 200, {"status": "ok"}
        if path == ["queues"] and method == "GET":
            return 200, {"queues": [self._queue_json(q) for q in self.queues.values()]}
        if path[0] == "queues" and len(path) == 2:
            name = path[1]
            if method == "PUT":
                self.queues.setdefault(name, FakeQueue(name, bool(data.get("durable", True))))
                return 200, {}
            if name not in self.queues:
                return 404, {"error": "not_found", "message": f"no queue {name!r}"}
            if method == "GET":
                return 200, self._queue_json(self.queues[name])
            if method == "DELETE":
                del self.queues[name]
                return 200, {}
        if path[0] == "queues" and len(path) == 3:
            name, action = path[1], path[2]
            q = self.queues.get(name)
            if q is None:
                return 404, {"error": "not_found", "message": f"no queue {name!r}"}
            if action == "get":
                out = []
                for _ in range(int(query.get("max", 1))):
                    if not q.ready:
                        break
                    msg = q.ready.pop(0)
                    lease = f"lease-{next(self._lease_ids)}"
                    self._leases[lease] = (name, msg)
                    q.unacked += 1
                    out.append({"lease_id": lease, **msg.body, "properties": msg.properties,
                                "exchange": msg.exchange, "routing_key": msg.routing_key,
                                "redelivered": msg.redelivered})
                return 200, {"messages": out}
            if action in ("ack", "nack"):
                for lease in data.get("lease_ids", []):
                    if lease not in self._leases:
                        return 404, {"error": "not_found", "message": f"no lease {lease}"}
                    qname, msg = self._leases.pop(lease)
                    q.unacked -= 1
                    if action == "nack" and data.get("requeue", True):
                        msg.redelivered = True
                        q.ready.add(msg)
                return 200, {}
            if action == "purge":
                n = len(q.ready)
                q.ready.clear()
                return 200, {"messages": n}
        if path[0] == "exchanges" and len(path) == 2 and method == "PUT":
            name = "" if path[1] == "amq.default" else path[1]
            kind = data.get("type", "direct")
            if name in self.exchanges and self.exchanges[name] != kind:
                return 409, {"error": "precondition_failed", "message": "exchange exists with another type"}
            self.exchanges[name] = kind
            return 200, {}
        if path == ["bindings"] and method == "POST":
            if data.get("exchange") not in self.exchanges or data.get("queue") not in self.queues:
                return 404, {"error": "not_found", "message": "no such exchange or queue"}
            b = (data["exchange"], data["queue"], data.get("routing_key", ""))
            if b not in self.bindings:
                self.bindings.append(b)
            return 200, {}
        return 404, {"error": "not_found", "message": f"no route {method} {target}"}

    def _queue_json(self, q: FakeQueue) -> dict[str, Any]:
        consumers = sum(1 for c in self.channels.values() for x in c.consumers.values() if x.queue == q.name)
        return {"name": q.name, "durable": q.durable, "messages_ready": len(q.ready),
                "messages_unacked": q.unacked, "consumers": consumers}


@asynccontextmanager
async def open_fake_broker() -> AsyncIterator[FakeBroker]:
    async with anyio.create_task_group() as nursery:
        broker = FakeBroker(nursery)
        try:
            yield broker
        finally:
            broker.crash()
            nursery.cancel_scope.cancel()
