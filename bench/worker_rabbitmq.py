"""The RabbitMQ side of every workload, with pika.

pika is the fastest Python client we have for RabbitMQ (aio-pika, built on aiormq, is
slower). Declarations go over a short ``BlockingConnection``; the timed part uses
``BlockingConnection`` where one call at a time is the workload (one-at-a-time
publish: ``basic_publish`` in confirm mode returns once the broker confirmed) and pika's
callback-driven ``SelectConnection`` where many operations are in flight (pipelined
publish with a confirm window, consumers), because BlockingConnection can only wait for
one confirm at a time.

Every message is persistent (``delivery_mode`` 2) to a durable classic queue.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pika
import pika.channel
import pika.frame
import pika.spec

from bench.workercommon import (
    body_of,
    emit_result,
    latency_summary,
    read_spec,
    signal_ready,
    stamp_of,
    stamped_body,
    wait_go,
)

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _params(spec: dict[str, Any]) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(host="127.0.0.1", port=spec["port"], heartbeat=0)


def _declare(spec: dict[str, Any]) -> None:
    queues = spec.get("queues", ())
    fanout = spec.get("fanout")
    if not queues and not fanout:
        return
    conn = pika.BlockingConnection(_params(spec))
    try:
        ch = conn.channel()
        arguments = spec.get("queue_arguments") or {}
        for queue in queues:
            ch.queue_declare(queue, durable=True, arguments=arguments.get(queue))
        if fanout:
            ch.exchange_declare(fanout, "fanout", durable=True)
            for queue in queues:
                ch.queue_bind(queue, fanout, "")
    finally:
        conn.close()


class ConfirmTracker:
    """Which publish tags are still unconfirmed. RabbitMQ may confirm out of order
    and coalesces acks with ``multiple``; tags are 1, 2, 3 … per channel."""

    def __init__(self) -> None:
        self.published = 0
        self.nacked = 0
        self._outstanding: set[int] = set()
        self._lowest = 1

    @property
    def unconfirmed(self) -> int:
        return len(self._outstanding)

    def sent(self) -> None:
        self.published += 1
        self._outstanding.add(self.published)

    def settle(self, frame: pika.frame.Method) -> None:
        method = frame.method
        tag, multiple = method.delivery_tag, method.multiple
        if multiple:
            settled = [t for t in range(self._lowest, tag + 1) if t in self._outstanding]
        else:
            settled = [tag] if tag in self._outstanding else []
        if isinstance(method, pika.spec.Basic.Nack):
            self.nacked += len(settled)
        self._outstanding.difference_update(settled)
        while self._lowest <= self.published and self._lowest not in self._outstanding:
            self._lowest += 1


class _SelectClient:
    """A SelectConnection with one channel; subclasses implement ``on_channel``."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.error: str | None = None
        self.conn = pika.SelectConnection(
            _params(spec),
            on_open_callback=lambda conn: conn.channel(on_open_callback=self._on_channel),
            on_open_error_callback=self._on_open_error,
            on_close_callback=lambda conn, reason: conn.ioloop.stop(),
        )
        self.ch: pika.channel.Channel | None = None
        self._closing = False

    def _on_open_error(self, conn: Any, error: BaseException) -> None:
        self.error = f"connection failed: {error!r}"
        conn.ioloop.stop()

    def _on_channel(self, ch: pika.channel.Channel) -> None:
        self.ch = ch
        ch.add_on_close_callback(self._on_channel_closed)
        self.on_channel(ch)

    def _on_channel_closed(self, ch: Any, reason: BaseException) -> None:
        if not self._closing:
            self.error = f"channel closed: {reason!r}"
            self.close()

    def on_channel(self, ch: pika.channel.Channel) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self.conn.close()

    def run(self) -> None:
        self.conn.ioloop.start()
        if self.error:
            raise RuntimeError(self.error)


class PipelinedPublisher(_SelectClient):
    """Keep up to ``window`` publishes unconfirmed; stop at ``count`` or ``duration_s``;
    then wait for every confirm."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.body = body_of(spec["size"])
        self.exchange, self.key = spec.get("exchange", ""), spec["routing_key"]
        self.window = spec["window"]
        self.count = spec.get("count") or math.inf
        self.duration_s = spec.get("duration_s", math.inf)
        self.tracker = ConfirmTracker()
        self.stopping = False
        self.start = self.end = 0.0
        # with "priorities": N, message i carries priority i % N
        levels = spec.get("priorities") or 0
        self.props = [pika.BasicProperties(delivery_mode=2, priority=i) for i in range(levels)] or [PERSISTENT]

    def on_channel(self, ch: pika.channel.Channel) -> None:
        ch.confirm_delivery(self._on_confirm, callback=self._on_select_ok)

    def _on_select_ok(self, frame: Any) -> None:
        signal_ready()
        wait_go()
        self.start = time.perf_counter()
        self.deadline = self.start + self.duration_s
        self._fill()

    def _fill(self) -> None:
        assert self.ch is not None
        tracker, publish = self.tracker, self.ch.basic_publish
        props, levels = self.props, len(self.props)
        while not self.stopping and tracker.unconfirmed < self.window:
            publish(self.exchange, self.key, self.body, props[tracker.published % levels])
            tracker.sent()
            if tracker.published >= self.count or time.perf_counter() >= self.deadline:
                self.stopping = True
        if self.stopping and tracker.unconfirmed == 0 and not self.end:
            self.end = time.perf_counter()
            self.close()

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        self.tracker.settle(frame)
        self._fill()

    def result(self) -> dict[str, Any]:
        return {
            "count": self.tracker.published - self.tracker.nacked,
            "nacked": self.tracker.nacked,
            "elapsed_s": self.end - self.start,
        }


class MultiChannelPublisher(_SelectClient):
    """``channels`` channels on one connection, each keeping up to ``window`` publishes
    unconfirmed (a :class:`ConfirmTracker` each), all driven by the one ioloop; stop at
    ``count`` (over all channels) or ``duration_s``, then wait for every confirm."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.body = body_of(spec["size"])
        self.exchange, self.key = spec.get("exchange", ""), spec["routing_key"]
        self.window = spec["window"]
        self.k = spec["channels"]
        self.count = spec.get("count") or math.inf
        self.duration_s = spec.get("duration_s", math.inf)
        self.lanes: list[tuple[pika.channel.Channel, ConfirmTracker]] = []
        self.selected = self.published = 0
        self.stopping = False
        self.start = self.end = 0.0

    def on_channel(self, ch: pika.channel.Channel) -> None:
        # the first channel, opened by _SelectClient; open the others from here
        self._add_lane(ch)
        for _ in range(self.k - 1):
            self.conn.channel(on_open_callback=self._on_more)

    def _on_more(self, ch: pika.channel.Channel) -> None:
        ch.add_on_close_callback(self._on_channel_closed)
        self._add_lane(ch)

    def _add_lane(self, ch: pika.channel.Channel) -> None:
        lane = (ch, ConfirmTracker())
        self.lanes.append(lane)
        ch.confirm_delivery(lambda frame: self._on_confirm(lane, frame), callback=self._on_select_ok)

    def _on_select_ok(self, frame: Any) -> None:
        self.selected += 1
        if self.selected < self.k:
            return
        signal_ready()
        wait_go()
        self.start = time.perf_counter()
        self.deadline = self.start + self.duration_s
        for lane in self.lanes:
            self._fill(lane)

    def _fill(self, lane: tuple[pika.channel.Channel, ConfirmTracker]) -> None:
        ch, tracker = lane
        while not self.stopping and tracker.unconfirmed < self.window:
            ch.basic_publish(self.exchange, self.key, self.body, PERSISTENT)
            tracker.sent()
            self.published += 1
            if self.published >= self.count or time.perf_counter() >= self.deadline:
                self.stopping = True
        if self.stopping and not self.end and all(t.unconfirmed == 0 for _, t in self.lanes):
            self.end = time.perf_counter()
            self.close()

    def _on_confirm(self, lane: tuple[pika.channel.Channel, ConfirmTracker], frame: pika.frame.Method) -> None:
        lane[1].settle(frame)
        self._fill(lane)

    def result(self) -> dict[str, Any]:
        nacked = sum(t.nacked for _, t in self.lanes)
        return {"count": self.published - nacked, "nacked": nacked, "elapsed_s": self.end - self.start,
                "channels": self.k}


class Consumer(_SelectClient):
    """Consume ``count`` messages with manual acks, one ``basic.ack`` per message."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.received = self.deliveries = 0
        self.start = self.end = 0.0

    def on_channel(self, ch: pika.channel.Channel) -> None:
        ch.basic_qos(prefetch_count=self.spec["prefetch"], callback=self._on_qos)

    def _on_qos(self, frame: Any) -> None:
        assert self.ch is not None
        signal_ready()
        wait_go()
        self.start = time.perf_counter()
        self.ch.basic_consume(self.spec["queue"], self._on_message)

    def _on_message(self, ch: Any, method: Any, properties: Any, body: bytes) -> None:
        # the same settling as the ackbus worker: ack; or nack every Nth first delivery
        # back to the queue (``nack_every``); or reject everything (``reject_all``)
        self.deliveries += 1
        nack_every = self.spec.get("nack_every") or 0
        if self.spec.get("reject_all"):
            ch.basic_reject(method.delivery_tag, requeue=False)
        elif nack_every and not method.redelivered and self.deliveries % nack_every == 0:
            ch.basic_nack(method.delivery_tag, requeue=True)
            return
        else:
            ch.basic_ack(method.delivery_tag)
        self.received += 1
        if self.received == self.spec["count"]:
            self.end = time.perf_counter()
            self.close()

    def result(self) -> dict[str, Any]:
        return {"count": self.received, "elapsed_s": self.end - self.start}


class LatencyConsumer(_SelectClient):
    """Receive stamped messages; latency = now - the publisher's stamp."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.received = 0
        self.latencies: list[float] = []

    def on_channel(self, ch: pika.channel.Channel) -> None:
        ch.basic_qos(prefetch_count=self.spec["prefetch"], callback=self._on_qos)

    def _on_qos(self, frame: Any) -> None:
        assert self.ch is not None
        self.ch.basic_consume(self.spec["queue"], self._on_message, callback=self._on_consume_ok)

    def _on_consume_ok(self, frame: Any) -> None:
        signal_ready()
        wait_go()
        self.conn.ioloop.call_later(self.spec["timeout_s"], self.close)

    def _on_message(self, ch: Any, method: Any, properties: Any, body: bytes) -> None:
        now = time.monotonic_ns()
        sent_ns, seq = stamp_of(body)
        if seq >= self.spec["warmup_count"]:
            self.latencies.append((now - sent_ns) / 1e9)
        ch.basic_ack(method.delivery_tag)
        self.received += 1
        if seq >= self.spec["total"] - 1:
            self.close()

    def result(self) -> dict[str, Any]:
        return {"received": self.received, **latency_summary(self.latencies)}


class PacedPublisher(_SelectClient):
    """Publish ``total`` stamped messages at a fixed rate with confirms in flight.

    Message i is due at start + i/rate; every due message goes out, then a timer
    fires when the next is due. The stamp is taken just before ``basic_publish``.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.tracker = ConfirmTracker()
        self.seq = 0
        self.start_ns = 0
        self.elapsed = 0.0

    def on_channel(self, ch: pika.channel.Channel) -> None:
        ch.confirm_delivery(self._on_confirm, callback=self._on_select_ok)

    def _on_select_ok(self, frame: Any) -> None:
        signal_ready()
        wait_go()
        self.start_ns = time.monotonic_ns()
        self._tick()

    def _tick(self) -> None:
        assert self.ch is not None
        spec = self.spec
        interval_ns = 1e9 / spec["rate"]
        now = time.monotonic_ns()
        while self.seq < spec["total"] and self.start_ns + self.seq * interval_ns <= now:
            self.ch.basic_publish("", spec["routing_key"], stamped_body(spec["size"], self.seq), PERSISTENT)
            self.tracker.sent()
            self.seq += 1
            now = time.monotonic_ns()
        if self.seq < spec["total"]:
            delay = (self.start_ns + self.seq * interval_ns - time.monotonic_ns()) / 1e9
            self.conn.ioloop.call_later(max(0.0, delay), self._tick)
        else:
            self.elapsed = (time.monotonic_ns() - self.start_ns) / 1e9
            self._maybe_done()

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        self.tracker.settle(frame)
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.seq >= self.spec["total"] and self.tracker.unconfirmed == 0:
            self.close()

    def result(self) -> dict[str, Any]:
        return {"count": self.seq, "nacked": self.tracker.nacked, "rate": self.seq / self.elapsed}


def publish_seq(spec: dict[str, Any]) -> dict[str, Any]:
    """One publish at a time: in confirm mode BlockingConnection's ``basic_publish``
    returns once the broker confirmed (it raises on a nack)."""
    body = body_of(spec["size"])
    exchange, key = spec.get("exchange", ""), spec["routing_key"]
    conn = pika.BlockingConnection(_params(spec))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        signal_ready()
        wait_go()
        warm_until = time.perf_counter() + spec["warmup_s"]
        while time.perf_counter() < warm_until:
            ch.basic_publish(exchange, key, body, PERSISTENT)
        latencies: list[float] = []
        start = time.perf_counter()
        deadline = start + spec["duration_s"]
        end = start
        while end < deadline:
            t = time.perf_counter()
            ch.basic_publish(exchange, key, body, PERSISTENT)
            end = time.perf_counter()
            latencies.append(end - t)
    finally:
        conn.close()
    return {"count": len(latencies), "elapsed_s": end - start, **latency_summary(latencies)}


def tx_publish(spec: dict[str, Any]) -> dict[str, Any]:
    """Transactions of ``per_tx`` publishes, one after another (``tx.select`` once, then
    publishes and ``tx.commit``, which returns once the broker committed)."""
    body = body_of(spec["size"])
    key, per_tx = spec["routing_key"], spec["per_tx"]
    conn = pika.BlockingConnection(_params(spec))
    try:
        ch = conn.channel()
        ch.tx_select()
        signal_ready()
        wait_go()
        commits = 0
        start = time.perf_counter()
        deadline = start + spec["duration_s"]
        end = start
        while end < deadline:
            for _ in range(per_tx):
                ch.basic_publish("", key, body, PERSISTENT)
            ch.tx_commit()
            commits += 1
            end = time.perf_counter()
    finally:
        conn.close()
    return {"commits": commits, "count": commits * per_tx, "elapsed_s": end - start}


def _run(cls: type[_SelectClient]) -> Any:
    def op(spec: dict[str, Any]) -> dict[str, Any]:
        worker = cls(spec)
        worker.run()
        return worker.result()  # type: ignore[attr-defined, no-any-return]

    return op


OPS = {
    "publish_seq": publish_seq,
    # with "channels": k > 1, k channels on one connection publish at once
    "publish_pipelined": lambda spec: _run(MultiChannelPublisher if (spec.get("channels") or 1) > 1
                                           else PipelinedPublisher)(spec),
    "consume": _run(Consumer),
    "e2e_consume": _run(LatencyConsumer),
    "e2e_publish": _run(PacedPublisher),
    "tx_publish": tx_publish,
}


def main() -> None:
    spec = read_spec()
    _declare(spec)
    emit_result(OPS[spec["op"]](spec))


if __name__ == "__main__":
    main()
