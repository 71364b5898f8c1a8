"""Flow control on ``POST /channel``, measured on the broker's own state.

* A consumer that stops reading: deliveries stop once the channel's byte credit is
  spent (the core's ``Channel.credit``); the rest stays ready in the queue; nothing
  is dropped, and everything flows again once the client reads.
* A publisher that never reads its confirms: the broker stops reading its request
  body once the channel's outbox is full (``OUTBOX_MAX_EVENTS`` events, or
  ``OUTBOX_MAX_BYTES`` of returns), so TCP backpressure blocks the client's send.

"Blocked" is observed with ``wait_all_tasks_blocked``: broker and client run in the
same trio run, so once every task waits, nobody is making progress.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from broker.api.channel import (
    OUTBOX_MAX_BYTES,
    OUTBOX_MAX_EVENTS,
    UNCONFIRMED_MAX_BYTES,
    ChannelSession,
)
from broker.app import BrokerApp
from broker.core import REST_CHANNEL, Deliver, Return
from broker.core.broker import DELIVERY_OVERHEAD_BYTES
from broker.http.writing import ResponseWriter
from broker.runtime import BrokerRuntime, RuntimeOptions
from tests.support.app import open_tcp_broker
from tests.support.channel import (
    ChannelClient,
    Clients,
    connect,
    open_channel,
    wait_until,
)
from tests.support.fakewal import attach_fake_wal

CREDIT = 256 * 1024  # the channel buffer (credit) configured for these tests
BODY = 16 * 1024


@pytest.fixture
def broker_options() -> RuntimeOptions:
    return RuntimeOptions(data_dir=None, channel_buffer_bytes=CREDIT)


@pytest.fixture
def app(broker_app: BrokerApp) -> BrokerApp:
    """The conftest's in-memory broker, with a small delivery credit."""
    return broker_app


async def settle(measure: Callable[[], object] = lambda: None) -> None:
    """Wait until every task is blocked and ``measure()`` stopped changing.

    One quiet moment is not proof of a standstill over TCP (a delayed ACK can stall
    both ends for tens of milliseconds), so wait until the measured broker state is
    the same across two quiet moments.
    """
    previous: object = object()
    for _ in range(1000):
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        current = measure()
        if current == previous:
            return
        previous = current
    raise AssertionError("the broker never stood still")


def session(app: BrokerApp, ch: ChannelClient) -> ChannelSession:
    assert ch.channel_id is not None
    sink = app.runtime.sinks[ch.channel_id]
    assert isinstance(sink, ChannelSession)
    return sink


async def slow_channel(clients: Clients, app: BrokerApp) -> ChannelClient:
    """A channel whose client reads nothing unless told, with a tiny receive window."""
    stream = clients.track(await connect(app.port, rcvbuf=4096))
    return await open_channel(stream)


async def publish_backlog(clients: Clients, queue: str, n: int, size: int = BODY) -> None:
    pub = await clients.channel()
    await pub.ok({"op": "declare_queue", "queue": queue})
    body = "x" * size
    for start in range(0, n, 50):
        await pub.send(
            *[{"op": "publish", "routing_key": queue, "body": f"{i:06d}{body}"} for i in range(start, min(n, start + 50))]
        )
    events = await pub.events_until(lambda e: e["ev"] == "ack" and e["delivery_tag"] == n)
    assert all(e["ev"] == "ack" for e in events)


async def read_backlog_in_order(ch: ChannelClient, n: int, *, ack_every: int) -> None:
    """Read the ``n`` deliveries of a ``publish_backlog``: each exactly once, whole, in
    order, never redelivered; ack them ``ack_every`` at a time (multiple)."""
    seen = 0
    while seen < n:
        event = await ch.next_event()
        if event["ev"] != "deliver":
            continue
        assert event["delivery_tag"] == seen + 1
        assert event["message"]["body"] == f"{seen:06d}" + "x" * BODY
        assert event["redelivered"] is False
        seen += 1
        if seen % ack_every == 0:
            await ch.send({"op": "ack", "delivery_tag": seen, "multiple": True})


# -- a consumer that stops reading -------------------------------------------------------


async def test_consumer_that_stops_reading_pauses_deliveries_with_bounded_buffer(
    app: BrokerApp, clients: Clients
) -> None:
    n = 1500  # 24 MB: far more than the credit plus every kernel buffer on the way
    await publish_backlog(clients, "slow", n)
    core = app.runtime.core
    queue = core.queues["slow"]
    ch = await slow_channel(clients, app)
    await ch.send({"op": "consume", "queue": "slow", "prefetch": 0})  # unlimited prefetch
    await settle(lambda: queue.delivered)

    cch = core.channels[ch.channel_id]
    per_message = BODY + 6 + DELIVERY_OVERHEAD_BYTES
    # Deliveries stopped because the credit is spent ...
    assert cch.credit <= 0
    # ... and what the broker holds for this channel (delivered, not yet written to
    # the socket) is bounded by the credit: CREDIT - credit bytes, at most one
    # message past the limit.
    assert CREDIT - cch.credit <= CREDIT + per_message
    sink = session(app, ch)
    queued = sum(len(e.message.body) for e in sink.outbox if type(e) is Deliver)
    assert queued <= CREDIT + per_message
    # Most of the backlog is still ready in the queue, not in broker buffers.
    delivered = queue.unacked
    assert queue.ready_count() == n - delivered
    assert queue.ready_count() > n // 2
    # Stable: nothing moves while the client does not read.
    await settle(lambda: queue.delivered)
    assert queue.unacked == delivered
    assert core.channels[ch.channel_id].credit == cch.credit

    # Paused, not dropped: read and ack everything; every message arrives once, in order.
    await read_backlog_in_order(ch, n, ack_every=100)
    await ch.send({"op": "ack", "delivery_tag": 0, "multiple": True})
    assert [e for e in await ch.sync() if e["ev"] == "deliver"] == []
    assert (queue.ready_count(), queue.unacked) == (0, 0)


async def test_deliveries_the_socket_takes_only_in_part_arrive_whole_and_in_order(
    app: BrokerApp, clients: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pump writes queued events at once when the connection is idle
    (``Response.send_nowait``); against a full socket buffer part of a chunk stays
    behind, and must go out before anything else, with its credit held until then."""
    left_over: list[bool] = []
    write_nowait = ResponseWriter.write_nowait

    def spy(self: ResponseWriter, framed: bytes) -> bool:
        left = write_nowait(self, framed)
        left_over.append(left)
        return left

    monkeypatch.setattr(ResponseWriter, "write_nowait", spy)
    n = 300
    await publish_backlog(clients, "part", n)
    queue = app.runtime.core.queues["part"]
    ch = await slow_channel(clients, app)
    await ch.send({"op": "consume", "queue": "part", "prefetch": 0})
    await settle(lambda: queue.delivered)
    assert True in left_over  # the socket filled up mid-chunk
    assert queue.ready_count() > 0  # and deliveries paused
    await read_backlog_in_order(ch, n, ack_every=50)
    assert [e for e in await ch.sync() if e["ev"] == "deliver"] == []
    assert (queue.ready_count(), queue.unacked) == (0, 0)
    assert False in left_over  # most writes are taken whole


async def test_stuck_consumer_does_not_hold_back_other_consumers(app: BrokerApp, clients: Clients) -> None:
    n = 1000
    await publish_backlog(clients, "shared", n)
    queue = app.runtime.core.queues["shared"]
    stuck = await slow_channel(clients, app)
    await stuck.send({"op": "consume", "queue": "shared", "no_ack": True})
    await settle(lambda: queue.delivered)
    taken_by_stuck = queue.delivered
    assert queue.ready_count() == n - taken_by_stuck > 0
    # A second consumer that reads gets everything the stuck one cannot take.
    fast = await clients.channel()
    await fast.send({"op": "consume", "queue": "shared", "no_ack": True})
    got = 0
    while got < n - taken_by_stuck:
        if (await fast.next_event())["ev"] == "deliver":
            got += 1
    await settle(lambda: queue.delivered)
    assert queue.ready_count() == 0
    assert queue.delivered == n  # nothing was delivered twice or dropped


# -- a publisher that never reads its confirms -------------------------------------------


class Flood:
    """Publishes ``total`` ops in chunks of ``per_chunk`` without reading anything."""

    def __init__(self, ch: ChannelClient, op: dict[str, Any], total: int, per_chunk: int) -> None:
        self.ch = ch
        self.line = orjson.dumps(op) + b"\n"
        self.total = total
        self.per_chunk = per_chunk
        self.sent = 0
        self.done = False

    async def run(self) -> None:
        while self.sent < self.total:
            k = min(self.per_chunk, self.total - self.sent)
            await self.ch.send_raw(self.line * k)
            self.sent += k
        self.done = True


async def test_publisher_not_reading_confirms_is_slowed_by_tcp_backpressure(
    app: BrokerApp, clients: Clients
) -> None:
    # Publishes to a missing exchange: each one is answered by its own nack (nacks
    # are never coalesced), and nothing is stored, so the outbox is the only thing
    # that could grow.
    ch = await slow_channel(clients, app)
    op = {"op": "publish", "exchange": "nowhere", "routing_key": "k", "body": "flood"}
    flood = Flood(ch, op, total=2_000_000, per_chunk=500)
    core = app.runtime.core
    async with trio.open_nursery() as nursery:
        nursery.start_soon(flood.run)
        await settle(lambda: (flood.sent, core.channels[ch.channel_id].publish_seq))
        assert not flood.done  # the client's send is blocked ...
        sink = session(app, ch)
        taken = core.channels[ch.channel_id].publish_seq
        # ... because the broker stopped reading once its outbox was full: bounded
        # by OUTBOX_MAX_EVENTS plus one received chunk's worth of ops.
        per_read = app.server.limits.read_chunk_bytes // len(flood.line) + 1
        assert OUTBOX_MAX_EVENTS < len(sink.outbox) <= OUTBOX_MAX_EVENTS + per_read
        assert len(core.channels[ch.channel_id].confirms) == 0  # all confirms are out
        assert taken < flood.total
        # Stable while the client does not read.
        await settle(lambda: (flood.sent, core.channels[ch.channel_id].publish_seq))
        assert core.channels[ch.channel_id].publish_seq == taken
        assert not flood.done

        # Reading resumes the flow: confirms arrive in order, one per publish.
        for tag in range(1, 3 * OUTBOX_MAX_EVENTS):
            event = await ch.next_event()
            assert (event["ev"], event["delivery_tag"], event["multiple"]) == ("nack", tag, False)
        await settle(lambda: core.channels[ch.channel_id].publish_seq)
        assert core.channels[ch.channel_id].publish_seq > taken
        nursery.cancel_scope.cancel()


async def test_returns_are_bounded_by_bytes_not_only_by_count(app: BrokerApp, clients: Clients) -> None:
    # Mandatory unroutable publishes: each return carries the whole message, so a
    # count bound alone (OUTBOX_MAX_EVENTS) would let the outbox hold ~128 MB here.
    ch = await slow_channel(clients, app)
    op = {"op": "publish", "routing_key": "unroutable", "mandatory": True, "body": "r" * BODY}
    flood = Flood(ch, op, total=200_000, per_chunk=1)
    core = app.runtime.core
    async with trio.open_nursery() as nursery:
        nursery.start_soon(flood.run)
        await settle(lambda: (flood.sent, core.channels[ch.channel_id].publish_seq))
        assert not flood.done
        sink = session(app, ch)
        returned = sum(len(e.message.body) for e in sink.outbox if type(e) is Return)
        per_read = app.server.limits.read_chunk_bytes + len(flood.line)
        assert returned <= OUTBOX_MAX_BYTES + per_read
        assert sink.outbox_bytes <= OUTBOX_MAX_BYTES + per_read + BODY
        taken = core.channels[ch.channel_id].publish_seq
        assert taken < 2 * (OUTBOX_MAX_BYTES // BODY) + 4096  # far below the count bound
        # Reading resumes the flow: each publish gets its return, then its ack.
        tag = 0
        while tag < taken + 10:
            event = await ch.next_event()
            if event["ev"] == "return":
                tag += 1
                assert event["delivery_tag"] == tag
            else:
                assert event["ev"] == "ack" and event["delivery_tag"] == tag
        nursery.cancel_scope.cancel()


async def test_publisher_outrunning_the_disk_is_slowed_by_tcp_backpressure() -> None:
    # Persistent publishes whose records never become durable (a stalled disk): the
    # confirms cannot be sent, so the outbox stays empty -- the bound on unconfirmed
    # publishes is what stops the broker from reading (and buffering) more.
    async with open_tcp_broker() as app, Clients(app.port) as clients:
        wal = attach_fake_wal(app.runtime)
        core = app.runtime.core
        ch = await clients.channel()
        await ch.send({"op": "declare_queue", "queue": "disk", "id": "d"})
        await wait_until(lambda: "disk" in core.queues)
        wal.make_durable()
        await ch.expect("ok", id="d")
        op = {"op": "publish", "routing_key": "disk", "body": "d" * BODY}
        flood = Flood(ch, op, total=100_000, per_chunk=4)  # 1.6 GB if nothing stopped it
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood.run)
            await settle(lambda: (flood.sent, core.channels[ch.channel_id].publish_seq))
            assert not flood.done
            sink = session(app, ch)
            taken = core.channels[ch.channel_id].publish_seq
            per_read = app.server.limits.read_chunk_bytes + len(flood.line)
            assert UNCONFIRMED_MAX_BYTES < sink.unconfirmed_bytes <= UNCONFIRMED_MAX_BYTES + per_read
            assert len(core.channels[ch.channel_id].confirms) == taken  # none confirmed
            assert taken * BODY <= UNCONFIRMED_MAX_BYTES + per_read
            # The disk catches up: confirms go out and the broker reads on.
            wal.make_durable()
            await settle(lambda: (flood.sent, core.channels[ch.channel_id].publish_seq))
            assert core.channels[ch.channel_id].publish_seq > taken
            assert sink.unconfirmed_bytes <= UNCONFIRMED_MAX_BYTES + per_read
            event = await ch.next_event()
            assert event["ev"] == "ack" and event["delivery_tag"] >= taken
            nursery.cancel_scope.cancel()


class PartialSocketResponse:
    """A response whose socket takes part of every ``send_nowait``; the rest goes out
    with ``flush()``, which waits until the test says so."""

    def __init__(self) -> None:
        self.left_over = False
        self.finished = False
        self.drained = trio.Event()
        self.chunks: list[bytes] = []

    def can_send_nowait(self) -> bool:
        return not self.left_over

    def send_nowait(self, data: bytes) -> bool:
        self.chunks.append(data)
        self.left_over = True
        return True

    async def flush(self) -> None:
        await self.drained.wait()
        self.left_over = False

    async def send(self, data: bytes) -> None:
        self.chunks.append(data)


async def test_credit_of_deliveries_left_over_is_given_back_only_once_they_are_sent(
    app: BrokerApp,
) -> None:
    runtime: BrokerRuntime = app.runtime
    core = runtime.core
    core.declare_queue("held", durable=False)
    channel_id = core.open_channel()
    response = PartialSocketResponse()
    sink = ChannelSession(runtime, channel_id, response)
    runtime.sinks[channel_id] = sink
    core.consume(channel_id, "held", prefetch=0)
    for i in range(3):
        core.publish(REST_CHANNEL, "", "held", b"m%d" % i, None)
    runtime.pump()  # the deliveries leave in the pump, the socket takes part
    assert len(response.chunks) == 1 and response.left_over
    spent = CREDIT - core.channels[channel_id].credit
    assert spent == sum(len(b"m0") + DELIVERY_OVERHEAD_BYTES for _ in range(3))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sink.serve_writer)
        await trio.testing.wait_all_tasks_blocked()
        assert CREDIT - core.channels[channel_id].credit == spent  # still held
        core.publish(REST_CHANNEL, "", "held", b"m3", None)
        runtime.pump()  # nothing may overtake the left-over bytes: it waits
        assert len(response.chunks) == 1 and len(sink.outbox) == 1
        response.drained.set()
        await trio.testing.wait_all_tasks_blocked()
        assert len(response.chunks) == 2 and not sink.outbox
        assert core.channels[channel_id].credit == CREDIT  # all of it back
        sink.finished = True
        sink._wakeup.set()
