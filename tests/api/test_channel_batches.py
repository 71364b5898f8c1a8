"""Batches on a channel (docs/protocol.md, "Batches"): a client that asks for them
(``Ackbus-Features: batches``) gets many deliveries in one ``deliveries`` event and
may ack many tags in one op; one that does not gets today's one ``deliver`` a line."""

from __future__ import annotations

from typing import Any

from broker.api.channel.outbox import BATCH_MAX_BYTES
from broker.api.channel.session import ServedChannel
from broker.app import BrokerApp
from broker.core import Deliver
from broker.core.message import StoredMessage as Message
from tests.support.channel import ChannelClient, Clients, wait_until

BATCHES = [("Ackbus-Features", "batches")]


def unacked(app: BrokerApp, queue: str) -> int:
    return int(app.runtime.core.queues[queue].unacked)


async def fill(ch: ChannelClient, queue: str, n: int) -> None:
    await ch.ok({"op": "declare_queue", "queue": queue})
    await ch.send(*[{"op": "publish", "routing_key": queue, "body": f"m{i}"} for i in range(n)])
    await ch.send({"op": "publish", "routing_key": queue, "body_b64": "/w=="})  # not UTF-8
    await ch.sync()


async def rows_until(ch: ChannelClient, count: int) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    rows: list[list[Any]] = []
    events: list[dict[str, Any]] = []
    while len(rows) < count:
        event = await ch.next_event()
        events.append(event)
        if event["ev"] == "deliveries":
            rows.extend(event["d"])
    return rows, events


async def test_asked_for_batches_deliveries_come_many_to_an_event(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel(headers=BATCHES)
    assert ch.open_event is not None and ch.open_event["features"] == ["batches"]
    await fill(ch, "jobs", 20)
    await ch.ok({"op": "consume", "queue": "jobs", "consumer_tag": "c", "prefetch": 100})
    rows, events = await rows_until(ch, 21)
    assert not [e for e in events if e["ev"] == "deliver"]
    assert len([e for e in events if e["ev"] == "deliveries"]) < 21  # many to an event
    assert [row[1] for row in rows] == list(range(1, 22))
    first = rows[0]
    assert first[0] == "c" and first[2:6] == [False, 0, "", "jobs"] and first[7] == "m0"
    assert rows[-1][7] == {"b64": "/w=="}
    # many acks in one op, in any order
    await ch.send({"op": "ack", "delivery_tags": [21, *range(1, 11)]})
    await wait_until(lambda: unacked(app, "jobs") == 10)
    await ch.send({"op": "ack", "delivery_tags": list(range(11, 21))})
    await wait_until(lambda: unacked(app, "jobs") == 0)


async def test_a_redelivery_in_a_batch_carries_its_count(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel(headers=BATCHES)
    await fill(ch, "again", 1)
    await ch.ok({"op": "consume", "queue": "again", "consumer_tag": "c", "prefetch": 1})
    rows, _ = await rows_until(ch, 1)
    await ch.send({"op": "nack", "delivery_tag": rows[0][1], "requeue": True})
    rows, _ = await rows_until(ch, 1)
    _tag, _dtag, redelivered, count, _ex, _rk, properties, body = rows[0]
    assert (redelivered, count, body) == (True, 1, "m0")
    assert properties["headers"]["x-delivery-count"] == 1


async def test_without_asking_one_deliver_a_line(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    assert ch.open_event is not None and "features" not in ch.open_event
    await fill(ch, "plain", 5)
    await ch.ok({"op": "consume", "queue": "plain", "consumer_tag": "c", "prefetch": 100})
    events = await ch.events_until(lambda e: e["ev"] == "deliver" and e["message"].get("body_b64") == "/w==")
    assert [e["delivery_tag"] for e in events if e["ev"] == "deliver"] == list(range(1, 7))
    assert not [e for e in events if e["ev"] == "deliveries"]


async def test_a_delivery_tags_ack_with_delivery_tag_is_refused(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel(headers=BATCHES)
    await ch.send({"op": "ack", "delivery_tags": [1], "delivery_tag": 1, "id": 3})
    events = await ch.events_until(lambda e: e["ev"] == "error")
    assert events[-1]["error"] == "invalid_argument" and events[-1]["id"] == 3


class _Outbox:
    """What ``ServedChannel._take_outbox`` reads of a session."""

    def __init__(self, items: list[Any]) -> None:
        self.outbox, self.outbox_bytes, self.batch_deliveries = items, 0, True


def test_a_run_of_deliveries_is_split_and_keeps_its_place() -> None:
    import orjson

    def deliver(tag: int) -> Deliver:
        return Deliver(1, "c", tag, False, Message(tag, "", "q", b"x" * 60_000, None))

    items: list[Any] = [{"ev": "ok", "id": 1}, *[deliver(t) for t in range(1, 11)], {"ev": "ok", "id": 2}, deliver(11)]
    data, credit = ServedChannel._take_outbox(_Outbox(items))  # type: ignore[arg-type]
    events = [orjson.loads(line) for line in data.splitlines()]
    assert [e["ev"] for e in events][0] == "ok" and events[-2] == {"ev": "ok", "id": 2}
    runs = [[row[1] for row in e["d"]] for e in events if e["ev"] == "deliveries"]
    assert [tag for run in runs for tag in run] == list(range(1, 12))
    assert len(runs) > 2  # the ten 60 kB bodies are split past BATCH_MAX_BYTES
    assert all(len(line) < BATCH_MAX_BYTES + 70_000 for line in data.splitlines())
    assert credit > 11 * 60_000
