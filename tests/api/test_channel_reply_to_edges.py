"""Direct reply-to on an HTTP channel (broker/api/channel/replyto.py, the typed
path's hand-over in chunk.py, the core's directreply.py): its edge cases (the main
cases are test_channel_reply_to.py). An in-process broker over ``trio.testing``
memory streams."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.support.app import MemoryBroker
from tests.support.channel import Clients
from tests.support.memory_fixtures import broker, clients  # noqa: F401 (fixtures)

REPLY_TO = "amq.rabbitmq.reply-to"
Event = dict[str, Any]


async def test_one_chunk_mixing_typed_publishes_and_requests_keeps_order_and_ids(
    broker: MemoryBroker, clients: Clients
) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()
        await ch.ok({"op": "consume", "queue": REPLY_TO, "no_ack": True})
        await ch.ok({"op": "declare_queue", "queue": "rpc"})
        address = broker.runtime.core.views.reply_address(ch.channel_id)
        await ch.send(
            {"op": "publish", "routing_key": "rpc", "body": "1"},
            {"op": "publish", "routing_key": "rpc", "body": "2", "properties": {"reply_to": REPLY_TO}, "id": 7},
            {"op": "publish", "routing_key": "rpc", "body": "3", "properties": {"reply_to": "elsewhere"}},
            {"op": "publish", "routing_key": "rpc", "body": "4", "properties": {"reply_to": REPLY_TO}},
            {"op": "publish", "routing_key": "rpc", "body": "5"},
        )
        events = await ch.events_until(lambda e: e["ev"] == "ack" and e["delivery_tag"] == 5)
        acks = [e for e in events if e["ev"] == "ack"]
        tags = sorted(t for e in acks for t in ([e["delivery_tag"]] if not e["multiple"] else range(1, e["delivery_tag"] + 1)))
        assert set(tags) == {1, 2, 3, 4, 5}, events
        assert not [e for e in events if e["ev"] == "error"], events
        got = []
        for _ in range(5):
            g = await ch.ok({"op": "get", "queue": "rpc", "no_ack": True})
            got.append((g["message"]["body"], (g["message"].get("properties") or {}).get("reply_to")))
        assert got == [("1", None), ("2", address), ("3", "elsewhere"), ("4", address), ("5", None)]


@pytest.mark.parametrize("value", [3, ["x"], {"a": 1}])
async def test_reply_to_of_another_type_is_invalid_argument(clients: Clients, value: Any) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()
        await ch.ok({"op": "consume", "queue": REPLY_TO, "no_ack": True})
        await ch.send({"op": "publish", "routing_key": "rpc", "body": "x", "properties": {"reply_to": value}, "id": 3})
        error = (await ch.remaining_events())[-1]
        assert (error["ev"], error["id"], error["error"]) == ("error", 3, "invalid_argument"), error


async def test_reply_to_null_is_no_reply_to(broker: MemoryBroker, clients: Clients) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()  # (no reply consumer: null is not a request)
        await ch.ok({"op": "declare_queue", "queue": "rpc"})
        await ch.send({"op": "publish", "routing_key": "rpc", "body": "x", "properties": {"reply_to": None}})
        got = await ch.ok({"op": "get", "queue": "rpc", "no_ack": True})
        assert "reply_to" not in (got["message"].get("properties") or {})


async def test_a_rolled_back_request_is_never_seen(broker: MemoryBroker, clients: Clients) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()
        await ch.ok({"op": "consume", "queue": REPLY_TO, "no_ack": True})
        await ch.ok({"op": "declare_queue", "queue": "rpc"})
        await ch.ok({"op": "tx_select"})
        await ch.send({"op": "publish", "routing_key": "rpc", "body": "x", "properties": {"reply_to": REPLY_TO}})
        await ch.ok({"op": "tx_rollback"})
        await ch.ok({"op": "tx_commit"})
        assert broker.runtime.core.queues["rpc"].ready_count() == 0


async def test_a_queue_consumer_cannot_take_the_reply_consumers_tag(broker: MemoryBroker, clients: Clients) -> None:
    """Each tag names one consumer on a channel: the reply consumer's included (the
    other order, a reply consumer with a queue consumer's tag, is refused already)."""
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()
        await ch.ok({"op": "consume", "queue": REPLY_TO, "consumer_tag": "t", "no_ack": True})
        await ch.ok({"op": "declare_queue", "queue": "q"})
        error = await ch.call({"op": "consume", "queue": "q", "consumer_tag": "t"})
        assert (error["ev"], error["error"]) == ("error", "not_allowed"), error


async def test_cancel_of_the_ended_reply_consumer_and_of_unknown_tags_is_ok(broker: MemoryBroker, clients: Clients) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()
        await ch.ok({"op": "consume", "queue": REPLY_TO, "consumer_tag": "r", "no_ack": True})
        for tag in ("r", "r", "nobody"):
            ok = await ch.call({"op": "cancel", "consumer_tag": tag})
            assert (ok["ev"], ok["consumer_tag"]) == ("cancel_ok", tag)
        assert broker.runtime.core.views.reply_address(ch.channel_id) is None


async def test_the_channels_end_with_replies_in_flight_drops_them(broker: MemoryBroker, clients: Clients) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()
        await ch.ok({"op": "consume", "queue": REPLY_TO, "no_ack": True})
        address = broker.runtime.core.views.reply_address(ch.channel_id)
        assert address is not None
        responder = await clients.channel()
        await responder.send(*({"op": "publish", "routing_key": address, "body": f"r{n}"} for n in range(50)))
        await ch.abort()
        await responder.send(*({"op": "publish", "routing_key": address, "body": "late", "mandatory": True}
                               for _ in range(5)))
        events = await responder.events_until(
            lambda e: e["ev"] == "ack" and e["delivery_tag"] == 55
        )
        assert not [e for e in events if e["ev"] == "error"]
        ok = await responder.ok({"op": "declare_queue", "queue": "alive"})
        assert ok["created"] is True


async def test_a_reply_consumers_prefetch_and_exclusive_mean_nothing_but_are_type_checked(
    broker: MemoryBroker, clients: Clients
) -> None:
    with trio.fail_after(10):  # (an answer that never comes fails, not hangs)
        ch = await clients.channel()
        error = await ch.call({"op": "consume", "queue": REPLY_TO, "no_ack": True, "prefetch": "1"})
        assert (error["ev"], error["error"]) == ("error", "invalid_argument"), error
        ch = await clients.channel()
        ok = await ch.ok({"op": "consume", "queue": REPLY_TO, "no_ack": True, "prefetch": 1, "exclusive": True})
        address = broker.runtime.core.views.reply_address(ch.channel_id)
        assert address is not None and ok["active"] is True
        # a second requester may take the pseudo-queue too: exclusive means nothing here
        other = await clients.channel()
        await other.ok({"op": "consume", "queue": REPLY_TO, "no_ack": True, "exclusive": True})
        responder = await clients.channel()
        await responder.send(*({"op": "publish", "routing_key": address, "body": f"r{n}"} for n in range(5)))
        got = []
        while len(got) < 5:  # past the prefetch of 1: replies are no-ack, never held back
            ev = await ch.next_event()
            if ev["ev"] == "deliver":
                got.append(ev["message"]["body"])
        assert got == [f"r{n}" for n in range(5)]
