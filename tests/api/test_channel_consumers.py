"""Consumers on ``POST /channel`` over real loopback HTTP: round-robin, prefetch
(per consumer and per channel), no_ack, ack/nack/reject with multiple and requeue,
requeue position, the redelivered flag, exclusive consumers and exclusive queues."""

from __future__ import annotations

from typing import Any

import trio.testing

from broker.app import BrokerApp
from tests.support.channel import ChannelClient, Clients, wait_until


def stats(app: BrokerApp, queue: str) -> tuple[int, int]:
    """(messages ready, messages unacked) of a queue, read from the core."""
    q = app.runtime.core.queues[queue]
    return q.ready_count(), q.unacked


def deliveries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["ev"] == "deliver"]


def bodies(events: list[dict[str, Any]]) -> list[str]:
    return [e["message"]["body"] for e in deliveries(events)]


async def setup_queue(ch: ChannelClient, queue: str, n: int, prefix: str = "m", **args: Any) -> None:
    await ch.ok({"op": "declare_queue", "queue": queue, **args})
    await ch.send(*[{"op": "publish", "routing_key": queue, "body": f"{prefix}{i}"} for i in range(n)])
    await ch.sync()


# -- round-robin and tags ------------------------------------------------------------------


async def test_round_robin_across_consumers_and_channels(app: BrokerApp, clients: Clients) -> None:
    a = await clients.channel()
    b = await clients.channel()
    await a.ok({"op": "declare_queue", "queue": "rr"})
    await a.ok({"op": "consume", "queue": "rr", "consumer_tag": "a1"})
    await a.ok({"op": "consume", "queue": "rr", "consumer_tag": "a2"})
    await b.ok({"op": "consume", "queue": "rr", "consumer_tag": "b1"})
    pub = await clients.channel()
    await pub.send(*[{"op": "publish", "routing_key": "rr", "body": f"m{i}"} for i in range(9)])
    await pub.sync()
    got_a = deliveries(await a.sync())
    got_b = deliveries(await b.sync())
    by_tag: dict[str, list[str]] = {"a1": [], "a2": [], "b1": []}
    for d in got_a + got_b:
        by_tag[d["consumer_tag"]].append(d["message"]["body"])
    assert by_tag == {"a1": ["m0", "m3", "m6"], "a2": ["m1", "m4", "m7"], "b1": ["m2", "m5", "m8"]}
    # delivery tags are one sequence per channel, whatever the consumer
    assert [d["delivery_tag"] for d in got_a] == [1, 2, 3, 4, 5, 6]
    assert [d["delivery_tag"] for d in got_b] == [1, 2, 3]
    assert all(d["redelivered"] is False for d in got_a + got_b)


async def test_consumer_tag_already_in_use_is_a_channel_error(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "q"})
    await ch.ok({"op": "consume", "queue": "q", "consumer_tag": "same"})
    reply = await ch.call({"op": "consume", "queue": "q", "consumer_tag": "same"})
    assert reply["ev"] == "error" and reply["error"] == "not_allowed"


async def test_server_generated_consumer_tags_are_distinct(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "q"})
    r1 = await ch.ok({"op": "consume", "queue": "q"})
    r2 = await ch.ok({"op": "consume", "queue": "q"})
    assert r1["consumer_tag"] and r2["consumer_tag"] and r1["consumer_tag"] != r2["consumer_tag"]


async def test_x_priority_serves_the_higher_consumer_while_it_has_room(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "prio"})
    await ch.ok({"op": "consume", "queue": "prio", "consumer_tag": "low", "prefetch": 10})
    await ch.ok({"op": "consume", "queue": "prio", "consumer_tag": "high", "prefetch": 2,
                 "arguments": {"x-priority": 5}})
    await ch.send(*[{"op": "publish", "routing_key": "prio", "body": f"m{i}"} for i in range(5)])
    got = deliveries(await ch.sync())
    assert [(d["consumer_tag"], d["message"]["body"]) for d in got] == [
        ("high", "m0"), ("high", "m1"), ("low", "m2"), ("low", "m3"), ("low", "m4")]
    other = await clients.channel()
    bad = await other.call({"op": "consume", "queue": "prio", "arguments": {"x-priority": "high"}})
    assert bad["ev"] == "error" and bad["error"] == "invalid_argument"


# -- prefetch ------------------------------------------------------------------------------


async def test_per_consumer_prefetch_is_honoured_exactly(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "pf", 20)
    await ch.ok({"op": "consume", "queue": "pf", "prefetch": 3})
    got = deliveries(await ch.sync())
    assert [d["delivery_tag"] for d in got] == [1, 2, 3]
    assert stats(app, "pf") == (17, 3)
    # each single ack frees exactly one slot
    for expected_tag in range(4, 9):
        await ch.send({"op": "ack", "delivery_tag": expected_tag - 3})
        got = deliveries(await ch.sync())
        assert [d["delivery_tag"] for d in got] == [expected_tag]
        assert stats(app, "pf")[1] == 3
    # a multiple ack of all three frees three slots
    await ch.send({"op": "ack", "delivery_tag": 8, "multiple": True})
    got = deliveries(await ch.sync())
    assert [d["delivery_tag"] for d in got] == [9, 10, 11]
    assert stats(app, "pf") == (9, 3)


async def test_channel_wide_prefetch_bounds_all_consumers_together(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "g1", 10)
    await setup_queue(ch, "g2", 10)
    await ch.ok({"op": "qos", "prefetch": 5, "global": True})
    await ch.ok({"op": "consume", "queue": "g1", "prefetch": 3})
    await ch.ok({"op": "consume", "queue": "g2", "prefetch": 3})
    got = deliveries(await ch.sync())
    assert len(got) == 5
    assert stats(app, "g1")[1] == 3 and stats(app, "g2")[1] == 2  # per consumer ≤ 3
    await ch.send({"op": "ack", "delivery_tag": got[0]["delivery_tag"]})  # a g1 delivery
    more = deliveries(await ch.sync())
    assert len(more) == 1 and more[0]["routing_key"] == "g2"  # g1's consumer is at 3
    assert stats(app, "g1")[1] + stats(app, "g2")[1] == 5


async def test_qos_without_global_sets_the_default_for_later_consumers(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "d", 10)
    await ch.ok({"op": "qos", "prefetch": 2})
    await ch.ok({"op": "consume", "queue": "d"})
    assert len(deliveries(await ch.sync())) == 2
    await ch.ok({"op": "consume", "queue": "d", "prefetch": 0})  # explicit 0: unlimited
    assert len(deliveries(await ch.sync())) == 8


async def test_raising_the_channel_prefetch_resumes_deliveries(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "r", 10)
    await ch.ok({"op": "qos", "prefetch": 1, "global": True})
    await ch.ok({"op": "consume", "queue": "r"})
    assert len(deliveries(await ch.sync())) == 1
    await ch.ok({"op": "qos", "prefetch": 4, "global": True})
    assert len(deliveries(await ch.sync())) == 3


async def test_no_ack_consumer_gets_everything_and_leaves_nothing_unacked(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "na", 50)
    await ch.ok({"op": "qos", "prefetch": 1, "global": True})  # no effect on no_ack
    await ch.ok({"op": "consume", "queue": "na", "no_ack": True, "prefetch": 1})
    got = await ch.sync()
    assert bodies(got) == [f"m{i}" for i in range(50)]
    assert stats(app, "na") == (0, 0)
    err = await ch.call({"op": "ack", "delivery_tag": 1})
    assert err["ev"] == "error" and err["error"] == "unknown_delivery_tag"


# -- settling ------------------------------------------------------------------------------


async def test_ack_multiple_settles_every_tag_up_to_it(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "am", 6)
    await ch.ok({"op": "consume", "queue": "am"})
    await ch.sync()
    await ch.send({"op": "ack", "delivery_tag": 4, "multiple": True})
    await ch.sync()
    assert stats(app, "am") == (0, 2)
    # tag 0 with multiple: every outstanding delivery (AMQP basic.ack semantics)
    await ch.send({"op": "ack", "delivery_tag": 0, "multiple": True})
    await ch.sync()
    assert stats(app, "am") == (0, 0)
    err = await ch.call({"op": "ack", "delivery_tag": 2})  # already acked
    assert err["error"] == "unknown_delivery_tag"


async def test_nack_without_requeue_drops_and_reject_requeues(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "nr", 5)
    await ch.ok({"op": "consume", "queue": "nr", "consumer_tag": "c", "prefetch": 5})
    await ch.sync()
    await ch.ok({"op": "cancel", "consumer_tag": "c"})  # unacked stay with the channel
    await ch.send({"op": "nack", "delivery_tag": 3, "multiple": True, "requeue": False})
    await ch.send({"op": "reject", "delivery_tag": 5})  # requeue defaults to true
    await ch.send({"op": "reject", "delivery_tag": 4, "requeue": False})
    await ch.sync()
    assert stats(app, "nr") == (1, 0)
    await ch.ok({"op": "consume", "queue": "nr", "no_ack": True})
    again = deliveries(await ch.sync())
    assert [(d["message"]["body"], d["redelivered"]) for d in again] == [("m4", True)]


async def test_nack_multiple_requeue_returns_all_to_the_front(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "nm", 6)
    await ch.ok({"op": "consume", "queue": "nm", "consumer_tag": "c", "prefetch": 3})
    await ch.sync()
    await ch.ok({"op": "cancel", "consumer_tag": "c"})
    await ch.send({"op": "nack", "delivery_tag": 3, "multiple": True})
    await ch.sync()
    assert stats(app, "nm") == (6, 0)
    await ch.ok({"op": "consume", "queue": "nm", "no_ack": True})
    again = deliveries(await ch.sync())
    assert [(d["message"]["body"], d["redelivered"]) for d in again] == [
        ("m0", True), ("m1", True), ("m2", True), ("m3", False), ("m4", False), ("m5", False)
    ]


async def test_requeued_messages_return_to_their_original_position(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "pos", 6)
    await ch.ok({"op": "consume", "queue": "pos", "consumer_tag": "c", "prefetch": 3})
    first = deliveries(await ch.sync())
    assert bodies(first) == ["m0", "m1", "m2"]
    await ch.ok({"op": "cancel", "consumer_tag": "c"})
    # requeue in reverse order: the queue still puts them back where they were
    await ch.send({"op": "nack", "delivery_tag": 3})
    await ch.send({"op": "nack", "delivery_tag": 1})
    await ch.sync()
    await ch.ok({"op": "consume", "queue": "pos", "consumer_tag": "d"})
    again = deliveries(await ch.sync())
    assert [(d["message"]["body"], d["redelivered"]) for d in again] == [
        ("m0", True), ("m2", True), ("m3", False), ("m4", False), ("m5", False)
    ]
    # m1 (tag 2) is still unacked on this channel after the cancel, and still ackable
    await ch.send({"op": "ack", "delivery_tag": 2})
    await ch.sync()
    assert stats(app, "pos") == (0, 5)


async def test_requeue_position_with_a_live_consumer(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "live", 5)
    await ch.ok({"op": "consume", "queue": "live", "prefetch": 2})
    assert bodies(await ch.sync()) == ["m0", "m1"]
    await ch.send({"op": "reject", "delivery_tag": 2})  # m1 back before m2
    got = deliveries(await ch.sync())
    assert [(d["message"]["body"], d["redelivered"], d["delivery_tag"]) for d in got] == [("m1", True, 3)]


async def test_redelivered_flag_across_channels(app: BrokerApp, clients: Clients) -> None:
    a = await clients.channel()
    await setup_queue(a, "rd", 2)
    await a.ok({"op": "consume", "queue": "rd", "prefetch": 1})
    assert [d["redelivered"] for d in deliveries(await a.sync())] == [False]
    await a.send({"op": "close"})
    assert [e["ev"] for e in await a.remaining_events()] == ["close_ok"]
    b = await clients.channel()
    await b.ok({"op": "consume", "queue": "rd", "no_ack": True})
    got = deliveries(await b.sync())
    assert [(d["message"]["body"], d["redelivered"]) for d in got] == [("m0", True), ("m1", False)]


async def test_cancel_stops_deliveries_and_unacked_stay_ackable(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "cx", 2)
    ok = await ch.ok({"op": "consume", "queue": "cx", "prefetch": 1})
    assert len(deliveries(await ch.sync())) == 1
    reply = await ch.ok({"op": "cancel", "consumer_tag": ok["consumer_tag"]})
    assert reply["ev"] == "cancel_ok" and reply["consumer_tag"] == ok["consumer_tag"]
    await ch.send({"op": "ack", "delivery_tag": 1})
    assert deliveries(await ch.sync()) == []  # the freed slot does not deliver
    assert stats(app, "cx") == (1, 0)
    assert app.runtime.core.queues["cx"].consumers == []


async def test_queue_deleted_under_a_consumer_sends_cancel(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "gone"})
    await ch.ok({"op": "consume", "queue": "gone", "consumer_tag": "c"})
    other = await clients.channel()
    await other.ok({"op": "delete_queue", "queue": "gone"})
    event = (await ch.sync())[0]
    assert event["ev"] == "cancel" and event["consumer_tag"] == "c" and event["reason"]
    await ch.ok({"op": "declare_queue", "queue": "fine"})  # the channel lives on


async def test_cancel_of_an_unknown_or_broker_cancelled_consumer_is_not_an_error(
    app: BrokerApp, clients: Clients
) -> None:
    # AMQP: basic.cancel of an unknown tag is ignored (cancel-ok), so a client racing
    # the broker's own cancel (queue deleted) does not lose its channel.
    ch = await clients.channel()
    reply = await ch.ok({"op": "cancel", "consumer_tag": "never-existed"})
    assert reply["ev"] == "cancel_ok" and reply["consumer_tag"] == "never-existed"
    await ch.ok({"op": "declare_queue", "queue": "short"})
    await ch.ok({"op": "consume", "queue": "short", "consumer_tag": "c"})
    other = await clients.channel()
    await other.ok({"op": "delete_queue", "queue": "short"})
    reply = await ch.ok({"op": "cancel", "consumer_tag": "c"})
    assert [e["ev"] for e in await ch.sync()] == ["cancel"]
    assert reply["ev"] == "cancel_ok"


async def test_auto_delete_queue_goes_with_its_last_consumer(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "ad", "auto_delete": True})
    await ch.ok({"op": "consume", "queue": "ad", "consumer_tag": "1"})
    await ch.ok({"op": "consume", "queue": "ad", "consumer_tag": "2"})
    await ch.ok({"op": "cancel", "consumer_tag": "1"})
    assert "ad" in app.runtime.core.queues
    await ch.ok({"op": "cancel", "consumer_tag": "2"})
    assert "ad" not in app.runtime.core.queues


# -- exclusivity ---------------------------------------------------------------------------


async def test_exclusive_consumer_refuses_other_consumers(app: BrokerApp, clients: Clients) -> None:
    a = await clients.channel()
    await setup_queue(a, "xc", 3)
    await a.ok({"op": "consume", "queue": "xc", "exclusive": True, "consumer_tag": "only"})
    b = await clients.channel()
    err = await b.call({"op": "consume", "queue": "xc"})
    assert err["ev"] == "error" and err["error"] == "access_refused"
    assert [e["ev"] for e in await b.remaining_events()] == []  # b is closed
    # the same channel cannot add a second consumer either
    err = await a.call({"op": "consume", "queue": "xc", "consumer_tag": "second"})
    assert err["error"] == "access_refused"


async def test_exclusive_consume_needs_a_queue_without_consumers(app: BrokerApp, clients: Clients) -> None:
    a = await clients.channel()
    await a.ok({"op": "declare_queue", "queue": "xs"})
    await a.ok({"op": "consume", "queue": "xs", "consumer_tag": "shared"})
    b = await clients.channel()
    err = await b.call({"op": "consume", "queue": "xs", "exclusive": True})
    assert err["error"] == "access_refused"
    await a.ok({"op": "cancel", "consumer_tag": "shared"})
    c = await clients.channel()
    await c.ok({"op": "consume", "queue": "xs", "exclusive": True})


async def test_exclusive_consumer_released_when_its_channel_ends(app: BrokerApp, clients: Clients) -> None:
    a = await clients.channel()
    await a.ok({"op": "declare_queue", "queue": "xr"})
    await a.ok({"op": "consume", "queue": "xr", "exclusive": True})
    await a.send({"op": "close"})
    await a.remaining_events()
    await trio.testing.wait_all_tasks_blocked()
    b = await clients.channel()
    await b.ok({"op": "consume", "queue": "xr", "exclusive": True})


async def test_exclusive_queue_is_owned_by_its_channel(app: BrokerApp, clients: Clients) -> None:
    owner = await clients.channel()
    r = await owner.ok({"op": "declare_queue", "queue": "mine", "exclusive": True})
    assert r["created"] is True
    await owner.send({"op": "publish", "routing_key": "mine", "body": "own"})
    for op in (
        {"op": "declare_queue", "queue": "mine", "exclusive": True},
        {"op": "declare_queue", "queue": "mine", "passive": True},
        {"op": "consume", "queue": "mine"},
        {"op": "purge_queue", "queue": "mine"},
        {"op": "delete_queue", "queue": "mine"},
    ):
        other = await clients.channel()
        err = await other.call(op)
        assert err["ev"] == "error" and err["error"] == "resource_locked", (op, err)
    status, body = await clients.rest("GET", "/queues/mine")
    assert status == 200 and body["exclusive"] is True
    # anyone may publish to it (AMQP): routing is not ownership
    other = await clients.channel()
    await other.send({"op": "publish", "routing_key": "mine", "body": "from other"})
    await other.expect("ack", delivery_tag=1)
    await owner.ok({"op": "consume", "queue": "mine", "no_ack": True})
    assert bodies(await owner.sync()) == ["own", "from other"]


async def test_exclusive_queue_is_deleted_when_its_channel_ends(app: BrokerApp, clients: Clients) -> None:
    owner = await clients.channel()
    await owner.ok({"op": "declare_queue", "queue": "temp", "exclusive": True})
    await owner.ok({"op": "bind", "exchange": "amq.fanout", "queue": "temp"})
    await owner.send({"op": "close"})
    await owner.remaining_events()
    await trio.testing.wait_all_tasks_blocked()
    assert "temp" not in app.runtime.core.queues
    status, body = await clients.rest("GET", "/queues/temp")
    assert status == 404
    # its bindings went with it
    status, body = await clients.rest("GET", "/bindings")
    assert status == 200
    assert "temp" not in str(body["bindings"])
    # and the name is free for someone else
    other = await clients.channel()
    r = await other.ok({"op": "declare_queue", "queue": "temp"})
    assert r["created"] is True


async def test_exclusive_queue_deleted_when_owner_disconnects(app: BrokerApp, clients: Clients) -> None:
    owner = await clients.channel()
    await owner.ok({"op": "declare_queue", "queue": "ephemeral", "exclusive": True})
    await owner.abort()
    await wait_until(lambda: "ephemeral" not in app.runtime.core.queues)


# -- get (AMQP's basic.get) ------------------------------------------------------------------


async def test_get_takes_one_message_to_settle_by_tag_or_answers_get_empty(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await setup_queue(ch, "g", 3)
    got = await ch.ok({"op": "get", "queue": "g"})
    assert got["ev"] == "get_ok" and got["message"]["body"] == "m0" and got["message_count"] == 2, got
    assert got["delivery_tag"] == 1 and got["redelivered"] is False and got["routing_key"] == "g"
    assert stats(app, "g") == (2, 1)  # unacked until settled, like a consumer's delivery
    await ch.send({"op": "ack", "delivery_tag": got["delivery_tag"]})
    await ch.sync()
    assert stats(app, "g") == (2, 0)
    got = await ch.ok({"op": "get", "queue": "g", "no_ack": True})
    assert got["message"]["body"] == "m1" and stats(app, "g") == (1, 0)
    got = await ch.ok({"op": "get", "queue": "g"})
    await ch.send({"op": "nack", "delivery_tag": got["delivery_tag"], "requeue": True})
    await ch.sync()
    again = await ch.ok({"op": "get", "queue": "g"})
    assert again["message"]["body"] == "m2" and again["redelivered"] is True, again
    assert (await ch.ok({"op": "get", "queue": "g"}))["ev"] == "get_empty"
    refused = await ch.call({"op": "get", "queue": "nowhere"})
    assert refused["ev"] == "error" and refused["error"] == "not_found", refused
