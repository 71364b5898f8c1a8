"""The null AMQP peer's server process (``python -m bench.nullamqp --port N``).

A small single-threaded AMQP 0-9-1 server on 127.0.0.1 that speaks just enough of the
protocol for the pika worker (``bench/worker_rabbitmq.py``, unchanged) and does no
broker work; ``bench.server_nullamqp`` starts it for the benchmark (``--peer null
--amqp``) and says what its figures mean: pika's ceiling, not a broker's.

- It keeps nothing on disk and no messages: a queue is a count and the first message
  published to it (properties and body), which every delivery of that queue repeats.
  The benchmark's queues hold messages of one size, so each delivery has the size of
  the messages published.
- A publish is counted into the queues it routes to (the default exchange, or a
  ``direct`` or ``fanout`` exchange's bindings); in confirm mode each chunk read is
  answered by one ``basic.ack`` (``multiple`` when it covers several publishes). An
  unroutable publish is dropped (no ``basic.return``).
- A consumer is kept at ``prefetch`` deliveries outstanding (``UNLIMITED_PREFETCH``
  when the prefetch is 0): each ``basic.ack`` read frees that many, and the
  deliveries that refill it (``basic.deliver`` + header + body, encoded once per
  consumer; only the delivery tag differs) go out with the rest of that chunk's
  answers in one ``send``. A ``basic.nack``/``basic.reject`` with requeue counts the
  message back (not marked redelivered); without, it is dropped (no dead letters).
- The handshake, channels, ``confirm.select``, ``tx``, ``basic.qos``, queue and
  exchange declares (``passive`` answers the count), binds, purge, delete, consume
  and cancel are answered as RabbitMQ answers them. Any other method closes the
  connection with 540 (not implemented), a broken frame with 501, a method out of
  place with 503/505; an unknown queue or exchange closes the channel with 404.

The per-message frames (publish, header, body, ack) are parsed by hand (``struct``);
pamqp decodes and encodes everything else. It is plain ``socket`` + ``selectors``
rather than trio: one thread and no scheduler, so that the least Python runs per
message and pika, sharing the machine with it, is what bounds the rate.

Bounded: 127.0.0.1 only, at most ``MAX_CONNECTIONS`` connections, ``MAX_ENTITIES``
queues, exchanges and bindings per exchange, ``MAX_CONSUMERS`` per channel, frames up
to ``FRAME_MAX``, bodies up to ``MAX_BODY``, a connection's unsent output up to
``OUT_LIMIT`` before it is read no more (and a consumer's deliveries of one chunk to
about that much), ``DEADLINE_S`` to finish a handshake or a close. It exits on
SIGTERM, and by itself once the process that started it is gone.

The entities (queues as counts, routes, consumers, channels) are in
``bench.nullamqp_state``; this module is the connections, their frames and the loop.
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import socket
import struct
import time
import traceback
from typing import Any

from pamqp import commands as spec
from pamqp import frame as pamqp_frame

from bench.nullamqp_state import (
    FRAME_HEADER,
    MAX_ENTITIES,
    OUT_LIMIT,
    PUBLISH,
    U32,
    U64,
    Channel,
    ChannelError,
    ConnectionError_,
    Consumer,
    NullBroker,
    Queue,
)

__all__ = ["PROTOCOL_HEADER", "serve"]

FRAME_MAX = 131_072
CHANNEL_MAX = 2047
MAX_CONNECTIONS = 512
MAX_CONSUMERS = 1024  # per channel
MAX_BODY = 16 * 1024 * 1024
DEADLINE_S = 10.0
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

_ACK = spec.Basic.Ack.index
_ACK_FRAME = struct.Struct(">BHII QB B")  # type, channel, size, class+method, tag, multiple, frame end

def _reply_text(text: str) -> str:
    """``text`` cut to what a short string holds (255 bytes of UTF-8)."""
    return text.encode()[:255].decode(errors="ignore")


def _validate(method: Any, error: ConnectionError_) -> None:
    """pamqp's checks of a channel method's fields (names, lengths) before anything is
    applied: a name the replies could not carry is refused with ``error`` (its code and
    name). (Not the handshake's: pika's Connection.Open sets ``insist``, which pamqp
    refuses and RabbitMQ ignores.)"""
    try:
        method.validate()
    except (ValueError, AttributeError) as exc:
        raise type(error)(error.code, f"{error.text} - {exc}", error.index) from exc


# handshake states of a connection
HEADER, START_OK, TUNE_OK, OPEN, READY, CLOSING, CLOSED = range(7)


class Connection:
    """One client socket: frames in, answers out (one ``send`` per chunk read)."""

    def __init__(self, broker: NullBroker, sock: socket.socket, selector: selectors.BaseSelector) -> None:
        self.broker, self.sock, self.selector = broker, sock, selector
        self.state = HEADER
        self.deadline: float | None = time.monotonic() + DEADLINE_S
        self.drop_when_sent = False  # a Close after a frame error: nothing more is read
        self.frame_max = FRAME_MAX
        self.inbuf = b""
        self.out: list[bytes] = []
        self.pending = b""
        self.channels: dict[int, Channel] = {}
        self.mask = selectors.EVENT_READ
        selector.register(sock, self.mask, self)

    # ------------------------------------------------------------------ IO

    def on_readable(self) -> None:
        try:
            data = self.sock.recv(262_144)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.drop()
            return
        try:
            self.feed(self.inbuf + data if self.inbuf else data)
        except ConnectionError_ as exc:
            self.close_with(exc)
        self.broker.to_flush.add(self)

    def flush(self) -> None:
        if self.state == CLOSED:
            return
        data = self.pending + b"".join(self.out) if self.out else self.pending
        self.out.clear()
        sent = 0
        if data:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                pass
            except OSError:
                self.drop()
                return
        self.pending = data[sent:]
        if self.drop_when_sent and not self.pending:
            self.drop()  # a frame error: nothing more can be read, the Close is out
            return
        mask = (selectors.EVENT_WRITE if self.pending else 0) | (
            selectors.EVENT_READ if len(self.pending) <= OUT_LIMIT else 0)
        if mask != self.mask:
            self.selector.modify(self.sock, mask, self)
            self.mask = mask

    def drop(self) -> None:
        if self.state == CLOSED:
            return
        self.state = CLOSED
        for channel in self.channels.values():
            channel.release()
        self.channels.clear()
        self.selector.unregister(self.sock)
        self.sock.close()
        self.broker.to_flush.discard(self)

    def send_method(self, channel: int, method: Any) -> None:
        self.out.append(pamqp_frame.marshal(method, channel))

    def close_with(self, exc: ConnectionError_, readable: bool = True) -> None:
        """Connection.Close with ``exc``'s code; wait (bounded) for Close-Ok, or, when
        the input cannot be parsed any more (``readable`` False), drop once it is out."""
        self.send_method(0, spec.Connection.Close(exc.code, _reply_text(exc.text), exc.index >> 16, exc.index & 0xFFFF))
        self.state, self.deadline = CLOSING, time.monotonic() + DEADLINE_S
        self.drop_when_sent = not readable
        self.inbuf = b""

    # ------------------------------------------------------------------ frames in

    def feed(self, buf: bytes) -> None:
        """Handle every complete frame of ``buf``; keep the rest for the next read."""
        pos, n = 0, len(buf)
        if self.state == HEADER:
            if n < 8:
                self.inbuf = buf
                return
            if buf[:8] != PROTOCOL_HEADER:
                self.out.append(PROTOCOL_HEADER)  # the one we speak, as the spec asks
                self.state, self.drop_when_sent = CLOSING, True
                return
            props: dict[str, Any] = {"product": "ackbus bench null AMQP peer", "version": "0", "capabilities": {
                "publisher_confirms": True, "consumer_cancel_notify": True, "basic.nack": True,
                "per_consumer_qos": True, "exchange_exchange_bindings": False}}
            self.send_method(0, spec.Connection.Start(server_properties=props, mechanisms="PLAIN AMQPLAIN"))
            self.state, pos = START_OK, 8
        channels, broker = self.channels, self.broker
        while n - pos >= 7:
            ftype, number, size = FRAME_HEADER.unpack_from(buf, pos)
            if size > self.frame_max:
                self.close_with(ConnectionError_(501, f"FRAME_ERROR - frame of {size} bytes"), readable=False)
                return
            end = pos + 7 + size
            if end >= n:
                break
            if buf[end] != 0xCE:
                self.close_with(ConnectionError_(501, "FRAME_ERROR - no frame end"), readable=False)
                return
            if ftype == 8:  # a heartbeat (the client's; we ask for none)
                pos = end + 1
                continue
            ch = channels.get(number)
            if self.state != READY or ch is None or ch.closing:
                self.control(buf[pos:end + 1], number, ch)
                if self.state == CLOSED:
                    return
            elif ftype == 1:
                if size < 4:
                    raise ConnectionError_(502, f"SYNTAX_ERROR - a method frame of {size} bytes")
                index = U32.unpack_from(buf, pos + 7)[0]
                if ch.route is not None:
                    raise ConnectionError_(505, "UNEXPECTED_FRAME - a method frame inside a publish's content", index)
                try:
                    if index == PUBLISH:
                        ch.route = broker.route(buf[pos + 11:end])
                        ch.remaining = -1
                    elif index == _ACK and size >= 13:
                        ch.settle(U64.unpack_from(buf, pos + 11)[0], bool(buf[pos + 19] & 1), None, index)
                    else:
                        self.control(buf[pos:end + 1], number, ch)
                        if self.state == CLOSED:
                            return
                except ChannelError as exc:
                    self.channel_error(ch, exc)
            elif ftype == 2:
                if ch.route is None or ch.remaining != -1:
                    raise ConnectionError_(505, "UNEXPECTED_FRAME - a content header outside a publish")
                if size < 14:
                    raise ConnectionError_(502, f"SYNTAX_ERROR - a content header of {size} bytes")
                ch.remaining = U64.unpack_from(buf, pos + 11)[0]
                if ch.remaining > MAX_BODY:
                    self.channel_error(ch, ChannelError(406, f"PRECONDITION_FAILED - a body of {ch.remaining} bytes "
                                                             f"(the null peer takes up to {MAX_BODY})", 0))
                    pos = end + 1
                    continue
                if ch.route.needs_sample():
                    ch.sampling = [buf[pos + 7:end]]
                if ch.remaining == 0:
                    ch.published_one()
            elif ftype == 3:
                if ch.route is None or ch.remaining < size:
                    raise ConnectionError_(505, "UNEXPECTED_FRAME - a content body outside a publish or past its size")
                ch.remaining -= size
                if ch.sampling is not None:
                    ch.sampling.append(buf[pos + 7:end])
                if ch.remaining == 0:
                    ch.published_one()
            elif ftype != 8:
                raise ConnectionError_(501, f"FRAME_ERROR - unknown frame type {ftype}")
            pos = end + 1
        self.inbuf = buf[pos:]
        for ch in channels.values():
            if ch.confirm and ch.published > ch.confirmed and not ch.closing:
                multiple = ch.published - ch.confirmed > 1
                self.out.append(_ACK_FRAME.pack(1, ch.number, 13, _ACK, ch.published, multiple, 0xCE))
                ch.confirmed = ch.published
        broker.dispatch()

    def channel_error(self, ch: Channel, exc: ChannelError) -> None:
        self.send_method(ch.number, spec.Channel.Close(exc.code, _reply_text(exc.text), exc.index >> 16, exc.index & 0xFFFF))
        ch.closing, ch.route, ch.sampling = True, None, None
        ch.release()

    def control(self, raw: bytes, number: int, ch: Channel | None) -> None:
        """Every frame off the per-message path, decoded with pamqp."""
        if self.state == CLOSING:  # only Close-Ok (or the client's own Close) matters now
            index = U32.unpack_from(raw, 7)[0] if raw[0] == 1 and len(raw) >= 12 else 0
            if index == spec.Connection.Close.index:
                self.send_method(0, spec.Connection.CloseOk())
                self.flush()
            if index in (spec.Connection.Close.index, spec.Connection.CloseOk.index):
                self.drop()
            return
        try:
            _, _, method = pamqp_frame.unmarshal(raw)
        except Exception as exc:  # (pamqp's UnmarshalingException, and what a fuzzed frame makes it raise)
            raise ConnectionError_(502, f"SYNTAX_ERROR - {exc}") from exc
        index = getattr(method, "index", 0)
        if self.state != READY or number == 0:
            self.connection_method(method, number, index)
        elif ch is None:
            if not isinstance(method, spec.Channel.Open):
                raise ConnectionError_(504, f"CHANNEL_ERROR - channel {number} is not open", index)
            if len(self.channels) >= CHANNEL_MAX:
                raise ConnectionError_(530, "NOT_ALLOWED - too many channels", index)
            self.channels[number] = Channel(self, number)
            self.send_method(number, spec.Channel.OpenOk())
        elif ch.closing:
            if isinstance(method, (spec.Channel.CloseOk, spec.Channel.Close)):
                del self.channels[number]
                if isinstance(method, spec.Channel.Close):
                    self.send_method(number, spec.Channel.CloseOk())
        else:
            try:
                _validate(method, ChannelError(406, "PRECONDITION_FAILED", index))
                self.channel_method(ch, method, index)
            except ChannelError as exc:
                self.channel_error(ch, exc)

    def connection_method(self, method: Any, number: int, index: int) -> None:
        name = getattr(method, "name", type(method).__name__)
        if isinstance(method, spec.Connection.Close):
            self.send_method(0, spec.Connection.CloseOk())
            self.flush()
            self.drop()
            return
        expected = {START_OK: spec.Connection.StartOk, TUNE_OK: spec.Connection.TuneOk, OPEN: spec.Connection.Open}
        if self.state in expected and not isinstance(method, expected[self.state]):
            raise ConnectionError_(503, f"COMMAND_INVALID - {name} during the handshake", index)
        if isinstance(method, spec.Connection.StartOk):
            self.send_method(0, spec.Connection.Tune(CHANNEL_MAX, FRAME_MAX, 0))
            self.state = TUNE_OK
        elif isinstance(method, spec.Connection.TuneOk):
            self.frame_max = min(method.frame_max or FRAME_MAX, FRAME_MAX)
            if self.frame_max < 4096:
                raise ConnectionError_(530, f"NOT_ALLOWED - frame_max {method.frame_max} below 4096", index)
            self.state = OPEN
        elif isinstance(method, spec.Connection.Open):
            self.send_method(0, spec.Connection.OpenOk())
            self.state, self.deadline = READY, None
        else:
            raise ConnectionError_(503, f"COMMAND_INVALID - {name} on channel {number}", index)

    def channel_method(self, ch: Channel, method: Any, index: int) -> None:
        broker = self.broker
        reply: Any = None
        if isinstance(method, spec.Channel.Close):
            ch.release()
            del self.channels[ch.number]
            reply = spec.Channel.CloseOk()
        elif isinstance(method, spec.Channel.Flow):
            reply = spec.Channel.FlowOk(method.active)
        elif isinstance(method, spec.Confirm.Select):
            if ch.tx is not None:
                raise ChannelError(406, "PRECONDITION_FAILED - a transactional channel cannot be put in confirm mode", index)
            ch.confirm = True
            reply = None if method.nowait else spec.Confirm.SelectOk()
        elif isinstance(method, spec.Tx.Select):
            if ch.confirm:
                raise ChannelError(406, "PRECONDITION_FAILED - a confirm channel cannot be made transactional", index)
            ch.tx = ch.tx or {}
            reply = spec.Tx.SelectOk()
        elif isinstance(method, (spec.Tx.Commit, spec.Tx.Rollback)):
            if ch.tx is None:
                raise ChannelError(406, "PRECONDITION_FAILED - channel is not transactional", index)
            if isinstance(method, spec.Tx.Commit):
                for queue, n in ch.tx.items():
                    queue.count += n
                    if queue.consumers:
                        broker.dirty.add(queue)
            ch.tx = {}
            reply = spec.Tx.CommitOk() if isinstance(method, spec.Tx.Commit) else spec.Tx.RollbackOk()
        elif isinstance(method, spec.Basic.Qos):
            ch.prefetch = method.prefetch_count
            reply = spec.Basic.QosOk()
        elif isinstance(method, spec.Basic.Consume):
            reply = self.consume(ch, method, index)
        elif isinstance(method, spec.Basic.Cancel):
            consumer = ch.consumers.pop(method.consumer_tag or "", None)
            if consumer is not None:
                consumer.active = False
                consumer.queue.consumers.remove(consumer)
            reply = None if method.nowait else spec.Basic.CancelOk(method.consumer_tag)
        elif isinstance(method, (spec.Basic.Ack, spec.Basic.Nack, spec.Basic.Reject)):
            requeue = None if isinstance(method, spec.Basic.Ack) else method.requeue
            ch.settle(method.delivery_tag or 0, getattr(method, "multiple", False), requeue, index)
        elif isinstance(method, (spec.Queue.Declare, spec.Queue.Purge, spec.Queue.Delete)):
            reply = self.queue_method(method, index)
        elif isinstance(method, (spec.Queue.Bind, spec.Queue.Unbind)):
            queue = broker.queue(method.queue, index)
            if method.exchange == "":
                raise ChannelError(403, "ACCESS_REFUSED - the default exchange takes no bindings", index)
            if method.exchange not in broker.exchanges:
                raise ChannelError(404, f"NOT_FOUND - no exchange '{method.exchange}'", index)
            bindings = broker.bindings.setdefault(method.exchange, [])
            if len(bindings) >= MAX_ENTITIES:
                raise ChannelError(406, f"PRECONDITION_FAILED - at most {MAX_ENTITIES} bindings an exchange", index)
            if (method.routing_key, queue) in bindings:
                bindings.remove((method.routing_key, queue))
            if isinstance(method, spec.Queue.Bind):
                bindings.append((method.routing_key, queue))
            broker.topology_changed()
            bind = isinstance(method, spec.Queue.Bind)
            reply = spec.Queue.BindOk() if bind else spec.Queue.UnbindOk()
            reply = None if getattr(method, "nowait", False) else reply
        elif isinstance(method, (spec.Exchange.Declare, spec.Exchange.Delete)):
            reply = self.exchange_method(method, index)
        else:
            name = getattr(method, "name", type(method).__name__)
            raise ConnectionError_(540, f"NOT_IMPLEMENTED - the null peer does not implement {name}", index)
        if reply is not None:
            self.send_method(ch.number, reply)

    def consume(self, ch: Channel, method: Any, index: int) -> Any:
        queue = self.broker.queue(method.queue, index)
        if method.no_ack:
            raise ConnectionError_(540, "NOT_IMPLEMENTED - the null peer delivers with manual acks only", index)
        tag = method.consumer_tag or f"null-ctag-{ch.number}-{len(ch.consumers) + 1}"
        if tag in ch.consumers:
            raise ConnectionError_(530, f"NOT_ALLOWED - consumer tag '{tag}' in use", index)
        if len(ch.consumers) >= MAX_CONSUMERS:
            raise ChannelError(406, f"PRECONDITION_FAILED - at most {MAX_CONSUMERS} consumers a channel", index)
        consumer = ch.consumers[tag] = Consumer(ch, tag, queue, ch.prefetch)
        queue.consumers.append(consumer)
        if not method.nowait:
            self.send_method(ch.number, spec.Basic.ConsumeOk(tag))
        self.broker.dirty.add(queue)  # deliveries after the consume-ok
        return None

    def queue_method(self, method: Any, index: int) -> Any:
        broker = self.broker
        if isinstance(method, spec.Queue.Declare):
            name = method.queue
            if method.passive:
                queue = broker.queue(name, index)
            else:
                if not name:
                    broker.names += 1
                    name = f"amq.gen-null-{broker.names}"
                if name not in broker.queues and len(broker.queues) >= MAX_ENTITIES:
                    raise ChannelError(406, f"PRECONDITION_FAILED - the null peer holds at most {MAX_ENTITIES} queues",
                                       index)
                queue = broker.queues.setdefault(name, Queue(name))
                broker.topology_changed()
            if method.nowait:
                return None
            return spec.Queue.DeclareOk(queue.name, queue.count, len(queue.consumers))
        queue = broker.queue(method.queue, index)
        count, queue.count = queue.count, 0
        if isinstance(method, spec.Queue.Purge):
            return None if method.nowait else spec.Queue.PurgeOk(count)
        del broker.queues[queue.name]
        for consumer in list(queue.consumers):
            consumer.active = False
            del consumer.channel.consumers[consumer.tag]
            cancel = spec.Basic.Cancel(consumer.tag, nowait=True)  # (consumer_cancel_notify)
            consumer.channel.conn.out.append(pamqp_frame.marshal(cancel, consumer.channel.number))
            broker.to_flush.add(consumer.channel.conn)
        queue.consumers.clear()
        for exchange, bindings in broker.bindings.items():
            broker.bindings[exchange] = [b for b in bindings if b[1] is not queue]
        broker.topology_changed()
        return None if method.nowait else spec.Queue.DeleteOk(count)

    def exchange_method(self, method: Any, index: int) -> Any:
        broker, name = self.broker, method.exchange
        if isinstance(method, spec.Exchange.Delete):
            if name not in broker.exchanges or name == "":
                raise ChannelError(404, f"NOT_FOUND - no exchange '{name}'", index)
            del broker.exchanges[name]
            broker.bindings.pop(name, None)
            broker.topology_changed()
            return None if method.nowait else spec.Exchange.DeleteOk()
        if method.passive:
            if name not in broker.exchanges:
                raise ChannelError(404, f"NOT_FOUND - no exchange '{name}'", index)
        elif name in broker.exchanges and broker.exchanges[name] != method.exchange_type:
            raise ChannelError(406, f"PRECONDITION_FAILED - exchange '{name}' is of type "
                               f"'{broker.exchanges[name]}'", index)
        elif method.exchange_type not in ("direct", "fanout"):
            raise ConnectionError_(540, f"NOT_IMPLEMENTED - exchange type '{method.exchange_type}' "
                                   "(the null peer routes direct and fanout only)", index)
        elif name not in broker.exchanges:
            if len(broker.exchanges) >= MAX_ENTITIES:
                raise ChannelError(406, f"PRECONDITION_FAILED - at most {MAX_ENTITIES} exchanges", index)
            broker.exchanges[name] = method.exchange_type
            broker.topology_changed()
        return None if method.nowait else spec.Exchange.DeclareOk()


def serve(port: int) -> None:
    """Serve on 127.0.0.1:``port`` until SIGTERM or until the parent process is gone."""
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    parent = os.getppid()
    broker = NullBroker()
    selector = selectors.DefaultSelector()
    listener = socket.create_server(("127.0.0.1", port), backlog=128)
    listener.setblocking(False)
    selector.register(listener, selectors.EVENT_READ, None)
    connections: set[Connection] = set()
    next_check = time.monotonic() + 1.0
    try:
        while True:
            for key, mask in selector.select(timeout=1.0):
                conn = key.data
                if conn is None:
                    try:
                        sock, _ = listener.accept()
                    except OSError:
                        continue
                    if len(connections) >= MAX_CONNECTIONS:
                        sock.close()
                        continue
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    connections.add(Connection(broker, sock, selector))
                elif mask & selectors.EVENT_READ:
                    try:
                        conn.on_readable()
                    except Exception:  # a bug here must cost this connection, not the server
                        traceback.print_exc()
                        conn.drop()
                elif mask & selectors.EVENT_WRITE:
                    broker.to_flush.add(conn)
            broker.dispatch()  # (consumers of queues a dropped connection gave back to)
            while broker.to_flush:
                broker.to_flush.pop().flush()
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 1.0
                for conn in [c for c in connections if c.state == CLOSED or (c.deadline and now > c.deadline)]:
                    conn.drop()
                    connections.discard(conn)
                if os.getppid() != parent:
                    return
    finally:
        for conn in connections:
            conn.drop()
        selector.close()
        listener.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.nullamqp", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1")
    serve(parser.parse_args(argv).port)


if __name__ == "__main__":
    main()
