"""How a channel ends, over real loopback HTTP: ``close``, end of the request body,
client disconnect (a killed socket mid-stream), a channel error, broker shutdown.
Every way returns the channel's unacked deliveries to their queues and cancels its
consumers exactly once, and leaves the other channels working."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from tests.support.channel import (
    ChannelClient,
    ChannelEnded,
    Clients,
    connect,
    open_channel,
    wait_until,
)

N = 200


@pytest.fixture
def closes(app: BrokerApp, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[int]]:
    """How many times each channel was closed in the core while it was open."""
    core = app.runtime.core
    counts: Counter[int] = Counter()
    original = core.close_channel

    def spy(channel_id: int, reason: str = "channel closed") -> None:
        if channel_id in core.channels:
            counts[channel_id] += 1
        original(channel_id, reason)

    monkeypatch.setattr(core, "close_channel", spy)
    yield counts


def deliveries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["ev"] == "deliver"]


async def fill(clients: Clients, queue: str, n: int = N, size: int = 10) -> None:
    pub = await clients.channel()
    await pub.ok({"op": "declare_queue", "queue": queue})
    pad = "." * size
    await pub.send(*[{"op": "publish", "routing_key": queue, "body": f"{i:05d}{pad}"} for i in range(n)])
    await pub.send({"op": "close"})
    events = await pub.remaining_events()
    assert events[-1]["ev"] == "close_ok"
    await pub.aclose()


async def drain(clients: Clients, queue: str) -> list[tuple[str, bool]]:
    """Consume everything ready in ``queue`` (no_ack): (body, redelivered) pairs."""
    ch = await clients.channel()
    await ch.ok({"op": "consume", "queue": queue, "no_ack": True})
    got = deliveries(await ch.sync())
    await ch.send({"op": "close"})
    await ch.remaining_events()
    await ch.aclose()
    return [(d["message"]["body"], d["redelivered"]) for d in got]


async def consumer_with_unacked(clients: Clients, queue: str, prefetch: int) -> tuple[ChannelClient, list[int]]:
    ch = await clients.channel()
    await ch.ok({"op": "consume", "queue": queue, "prefetch": prefetch, "consumer_tag": "victim"})
    got = deliveries(await ch.sync())
    assert len(got) == prefetch
    return ch, [d["delivery_tag"] for d in got]


def assert_channel_gone(app: BrokerApp, ch: ChannelClient, queue: str) -> None:
    core = app.runtime.core
    assert ch.channel_id not in core.channels
    assert ch.channel_id not in app.runtime.sinks
    q = core.queues[queue]
    assert q.unacked == 0
    assert all(c.channel.id != ch.channel_id for c in q.consumers)


async def assert_everything_back_once(clients: Clients, queue: str, acked: int, unacked: int) -> None:
    """The queue holds exactly the messages not acked, each once, in order; the ones
    that were unacked come back marked redelivered."""
    got = await drain(clients, queue)
    assert [b[:5] for b, _ in got] == [f"{i:05d}" for i in range(acked, N)]
    assert [r for _, r in got] == [True] * unacked + [False] * (N - acked - unacked)


# -- close op ------------------------------------------------------------------------------


async def test_close_requeues_unacked_and_cancels_consumers(
    app: BrokerApp, clients: Clients, closes: Counter[int]
) -> None:
    await fill(clients, "cq")
    ch, tags = await consumer_with_unacked(clients, "cq", 10)
    await ch.send({"op": "ack", "delivery_tag": tags[1], "multiple": True})  # 2 acked
    await ch.send({"op": "close", "id": "bye"})
    events = await ch.remaining_events()
    # the two freed prefetch slots were refilled before the close
    assert [e["ev"] for e in events] == ["deliver", "deliver", "close_ok"]
    assert events[-1] == {"ev": "close_ok", "id": "bye"}
    await trio.testing.wait_all_tasks_blocked()
    assert_channel_gone(app, ch, "cq")
    assert closes[ch.channel_id] == 1
    await assert_everything_back_once(clients, "cq", acked=2, unacked=10)


async def test_nothing_is_delivered_after_close_ok(app: BrokerApp, clients: Clients) -> None:
    # Many ready messages and an unlimited consumer: deliveries are flowing when the
    # close op arrives, but none may follow close_ok (they would be requeued anyway).
    await fill(clients, "busy", n=N, size=30000)  # 6 MB: more than the credit
    ch = await clients.channel()
    await ch.send({"op": "consume", "queue": "busy", "prefetch": 0}, {"op": "close"})
    events = await ch.remaining_events()
    assert events[0]["ev"] == "consume_ok"
    assert events[-1]["ev"] == "close_ok"
    assert all(e["ev"] == "deliver" for e in events[1:-1])
    await trio.testing.wait_all_tasks_blocked()
    assert_channel_gone(app, ch, "busy")
    q = app.runtime.core.queues["busy"]
    assert q.ready_count() == N


# -- end of the request body ---------------------------------------------------------------


async def test_end_of_body_with_a_consumer_keeps_delivering_until_disconnect(
    app: BrokerApp, clients: Clients, closes: Counter[int]
) -> None:
    await fill(clients, "eob", n=5)
    ch = await clients.channel()
    await ch.send({"op": "consume", "queue": "eob", "consumer_tag": "tail", "prefetch": 2})
    await ch.end_body()
    events = [await ch.next_event() for _ in range(3)]
    assert [e["ev"] for e in events] == ["consume_ok", "deliver", "deliver"]
    # still open: new messages for a no_ack consumer would keep flowing; here the
    # prefetch is spent (no acks can arrive), so the channel just waits
    await trio.testing.wait_all_tasks_blocked()
    assert ch.channel_id in app.runtime.core.channels
    await ch.aclose()
    await wait_until(lambda: ch.channel_id not in app.runtime.core.channels)
    assert_channel_gone(app, ch, "eob")
    assert closes[ch.channel_id] == 1
    got = await drain(clients, "eob")
    assert [r for _, r in got] == [True, True, False, False, False]


async def test_end_of_body_no_ack_consumer_receives_later_publishes(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send(
        {"op": "declare_queue", "queue": "follow"},
        {"op": "consume", "queue": "follow", "no_ack": True},
    )
    await ch.end_body()
    await ch.expect("ok")
    await ch.expect("consume_ok")
    pub = await clients.channel()
    for i in range(3):
        await pub.send({"op": "publish", "routing_key": "follow", "body": f"late{i}"})
        event = await ch.expect("deliver")
        assert event["message"]["body"] == f"late{i}"


# -- client disconnect ---------------------------------------------------------------------


async def test_killed_socket_mid_stream_requeues_everything_once(
    app: BrokerApp, clients: Clients, closes: Counter[int]
) -> None:
    await fill(clients, "kill")
    ch, tags = await consumer_with_unacked(clients, "kill", 25)
    await ch.send({"op": "ack", "delivery_tag": tags[4], "multiple": True})  # 5 acked
    assert len(deliveries(await ch.sync())) == 5  # ... and refilled: 25 unacked
    # publishes in flight too, and the response mid-stream
    await ch.send(*[{"op": "publish", "routing_key": "elsewhere", "body": "x"} for _ in range(50)])
    await ch.abort()  # RST
    await wait_until(lambda: ch.channel_id not in app.runtime.core.channels)
    assert_channel_gone(app, ch, "kill")
    assert closes[ch.channel_id] == 1
    await assert_everything_back_once(clients, "kill", acked=5, unacked=25)


async def test_half_closed_body_is_a_disconnect(app: BrokerApp, clients: Clients, closes: Counter[int]) -> None:
    await fill(clients, "fin")
    ch, _ = await consumer_with_unacked(clients, "fin", 3)
    stream = ch.http.stream
    assert isinstance(stream, trio.SocketStream)
    await stream.send_eof()  # FIN without the terminating chunk: the body is cut short
    with pytest.raises(ChannelEnded):
        while True:
            await ch.next_event()
    await wait_until(lambda: ch.channel_id not in app.runtime.core.channels)
    assert_channel_gone(app, ch, "fin")
    assert closes[ch.channel_id] == 1
    await assert_everything_back_once(clients, "fin", acked=0, unacked=3)


async def test_disconnect_while_the_broker_is_blocked_writing(
    app: BrokerApp, clients: Clients, closes: Counter[int]
) -> None:
    # The client never reads: the broker's writes block on a full socket. Killing the
    # socket must still end the channel and requeue.
    await fill(clients, "stuck", n=N, size=30000)
    ch = await open_channel(clients.track(await connect(app.port, rcvbuf=4096)))
    await ch.send({"op": "consume", "queue": "stuck", "prefetch": 0})
    await trio.testing.wait_all_tasks_blocked(cushion=0.05)
    q = app.runtime.core.queues["stuck"]
    assert q.unacked > 0 and q.ready_count() > 0  # paused, not finished
    await ch.abort()
    await wait_until(lambda: ch.channel_id not in app.runtime.core.channels)
    assert_channel_gone(app, ch, "stuck")
    assert closes[ch.channel_id] == 1
    assert q.ready_count() == N


# -- channel errors ------------------------------------------------------------------------


async def test_channel_error_requeues_and_leaves_other_channels_working(
    app: BrokerApp, clients: Clients, closes: Counter[int]
) -> None:
    await fill(clients, "err")
    bystander = await clients.channel()
    await bystander.ok({"op": "declare_queue", "queue": "side"})
    await bystander.ok({"op": "consume", "queue": "side", "consumer_tag": "side", "prefetch": 1})
    ch, tags = await consumer_with_unacked(clients, "err", 10)
    await ch.send({"op": "ack", "delivery_tag": 10_000, "id": "oops"})
    events = await ch.remaining_events()
    assert events[-1]["ev"] == "error" and events[-1]["error"] == "unknown_delivery_tag"
    assert events[-1]["id"] == "oops" and "10000" in events[-1]["message"]
    assert not deliveries(events)  # nothing after the error, nothing before it either
    await trio.testing.wait_all_tasks_blocked()
    assert_channel_gone(app, ch, "err")
    assert closes[ch.channel_id] == 1
    # the bystander publishes, consumes and acks as before
    await bystander.send({"op": "publish", "routing_key": "side", "body": "still here"})
    got = deliveries(await bystander.sync())
    assert [d["message"]["body"] for d in got] == ["still here"]
    await bystander.send({"op": "ack", "delivery_tag": got[0]["delivery_tag"]})
    assert (await bystander.sync()) == []
    # a new channel takes over the requeued deliveries, in their original order
    await assert_everything_back_once(clients, "err", acked=0, unacked=10)


async def test_consuming_a_missing_queue_is_a_channel_error(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send({"op": "consume", "queue": "nope", "id": 1})
    events = await ch.remaining_events()
    assert events == [{"ev": "error", "id": 1, "error": "not_found", "message": events[0]["message"]}]
    other = await clients.channel()
    await other.ok({"op": "declare_queue", "queue": "nope"})
    await other.ok({"op": "consume", "queue": "nope"})


async def test_nothing_is_delivered_after_an_error(app: BrokerApp, clients: Clients) -> None:
    await fill(clients, "flow", n=N, size=30000)
    ch = await clients.channel()
    await ch.send({"op": "consume", "queue": "flow", "prefetch": 0}, {"op": "bogus"})
    events = await ch.remaining_events()
    assert events[-1]["ev"] == "error"
    assert all(e["ev"] in ("consume_ok", "deliver") for e in events[:-1])
    await trio.testing.wait_all_tasks_blocked()
    assert_channel_gone(app, ch, "flow")
    assert app.runtime.core.queues["flow"].ready_count() == N


async def test_delivery_tags_belong_to_their_channel(app: BrokerApp, clients: Clients) -> None:
    await fill(clients, "own", n=3)
    a, tags = await consumer_with_unacked(clients, "own", 1)
    b = await clients.channel()
    err = await b.call({"op": "ack", "delivery_tag": tags[0]})
    assert err["ev"] == "error" and err["error"] == "unknown_delivery_tag"
    await a.send({"op": "ack", "delivery_tag": tags[0]})
    assert [d["delivery_tag"] for d in deliveries(await a.sync())] == [tags[0] + 1]
    q = app.runtime.core.queues["own"]
    assert (q.ready_count(), q.unacked) == (1, 1)


# -- broker shutdown -----------------------------------------------------------------------


async def test_broker_shutdown_sends_closing_and_requeues(clients: Clients, app: BrokerApp) -> None:
    await fill(clients, "sd", n=10)
    ch, _ = await consumer_with_unacked(clients, "sd", 4)
    core = app.runtime.core
    async with trio.open_nursery() as nursery:
        nursery.start_soon(app.shutdown, 5.0)
        event = await ch.next_event()
        assert event["ev"] == "closing" and event["reason"]
        rest = await ch.remaining_events()
        assert not deliveries(rest)
        await ch.aclose()  # else the server lingers for our unfinished body
    assert ch.channel_id not in core.channels
    q = core.queues["sd"]
    assert q.ready_count() == 10 and q.unacked == 0
