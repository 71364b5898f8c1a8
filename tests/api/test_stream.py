"""``GET /queues/{name}/stream``: streaming consume for curl and browsers. NDJSON or
SSE; ``ack=auto`` or ``ack=lease`` (leases settled through the REST lease calls,
bounded by ``prefetch``, returned to the queue when the stream ends)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from tests.support.app import MemoryBroker, open_memory_broker, open_tcp_broker
from tests.support.channel import (
    ChannelEnded,
    Clients,
    StreamClient,
    connect,
    open_stream,
    wait_until,
)


async def publish(clients: Clients, queue: str, bodies: list[str], declare: bool = True) -> None:
    ch = await clients.channel()
    if declare:
        await ch.ok({"op": "declare_queue", "queue": queue})
    if bodies:
        await ch.send(*[{"op": "publish", "routing_key": queue, "body": b} for b in bodies])
        await ch.events_until(lambda e: e["ev"] == "ack" and e["delivery_tag"] == len(bodies))
    await ch.aclose()


async def items(stream: StreamClient, n: int) -> list[dict[str, Any]]:
    return [await stream.next_item() for _ in range(n)]


def qstats(app: BrokerApp, queue: str) -> tuple[int, int, int]:
    q = app.runtime.core.queues[queue]
    return q.ready_count(), q.unacked, len(q.consumers)


# -- NDJSON / SSE --------------------------------------------------------------------------


async def test_ndjson_stream_with_auto_ack(app: BrokerApp, clients: Clients) -> None:
    await publish(clients, "s", ["a", "b"])
    stream = await clients.stream("s")
    assert stream.status == 200
    assert stream.headers["content-type"] == "application/x-ndjson"
    got = await items(stream, 2)
    assert got[0] == {
        "body": "a", "properties": {}, "exchange": "", "routing_key": "s", "redelivered": False,
        "delivery_count": 0,
    }
    assert [g["body"] for g in got] == ["a", "b"]
    # messages published later arrive as they come
    await publish(clients, "s", ["c"], declare=False)
    assert (await stream.next_item())["body"] == "c"
    await trio.testing.wait_all_tasks_blocked()
    assert qstats(app, "s") == (0, 0, 1)  # auto: acked once handed to the stream


async def test_binary_bodies_travel_as_base64(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "bin"})
    await ch.send({"op": "publish", "routing_key": "bin", "body_b64": "/wA="})
    stream = await clients.stream("bin")
    item = await stream.next_item()
    assert item["body_b64"] == "/wA=" and "body" not in item


async def test_sse_stream(app: BrokerApp, clients: Clients) -> None:
    await publish(clients, "sse", ["x", "y"])
    stream = await clients.stream("sse", accept="text/event-stream")
    assert stream.headers["content-type"] == "text/event-stream"
    assert stream.headers["cache-control"] == "no-cache"
    name, data = await stream.next_sse()
    assert name is None and data is not None and data["body"] == "x"
    name, data = await stream.next_sse()
    assert data is not None and data["body"] == "y" and data["routing_key"] == "sse"


async def test_missing_queue_is_a_404_before_streaming(app: BrokerApp, clients: Clients) -> None:
    stream = await clients.stream("nope")
    assert stream.status == 404
    assert b"not_found" in await stream.read_rest()


@pytest.mark.parametrize("query", ["ack=maybe", "prefetch=-1", "prefetch=many", "lease=0"])
async def test_bad_parameters_are_400(app: BrokerApp, clients: Clients, query: str) -> None:
    await publish(clients, "p", [])
    stream = await clients.stream("p", query)
    assert stream.status == 400, await stream.read_rest()


async def test_queue_deleted_ends_the_stream_with_closing(app: BrokerApp, clients: Clients) -> None:
    await publish(clients, "del", [])
    stream = await clients.stream("del")
    ch = await clients.channel()
    await ch.ok({"op": "delete_queue", "queue": "del"})
    event = await stream.next_item()
    assert event["ev"] == "closing" and event["reason"]
    with pytest.raises(ChannelEnded):
        await stream.next_item()


async def test_sse_closing_event_on_queue_deletion(app: BrokerApp, clients: Clients) -> None:
    await publish(clients, "del2", [])
    stream = await clients.stream("del2", accept="text/event-stream")
    ch = await clients.channel()
    await ch.ok({"op": "delete_queue", "queue": "del2"})
    name, data = await stream.next_sse()
    assert name == "closing" and data is not None and data["reason"]


async def test_several_streams_share_a_queue_round_robin(app: BrokerApp, clients: Clients) -> None:
    await publish(clients, "rr", [])
    s1 = await clients.stream("rr")
    s2 = await clients.stream("rr")
    await trio.testing.wait_all_tasks_blocked()
    await publish(clients, "rr", [f"m{i}" for i in range(6)], declare=False)
    got1 = [i["body"] for i in await items(s1, 3)]
    got2 = [i["body"] for i in await items(s2, 3)]
    assert sorted(got1 + got2) == [f"m{i}" for i in range(6)]
    assert got1 in (["m0", "m2", "m4"], ["m1", "m3", "m5"])


# -- leases --------------------------------------------------------------------------------


async def test_lease_mode_prefetch_bounds_outstanding_leases(app: BrokerApp, clients: Clients) -> None:
    await publish(clients, "lq", [f"m{i}" for i in range(5)])
    stream = await clients.stream("lq", "ack=lease&prefetch=2")
    first = await items(stream, 2)
    assert [i["body"] for i in first] == ["m0", "m1"]
    assert all(isinstance(i["lease_id"], str) for i in first)
    await trio.testing.wait_all_tasks_blocked()
    assert qstats(app, "lq") == (3, 2, 1)
    status, body = await clients.rest("POST", "/queues/lq/ack", {"lease_ids": [first[0]["lease_id"]]})
    assert (status, body) == (200, {"acked": 1})
    third = await stream.next_item()
    assert third["body"] == "m2"
    await trio.testing.wait_all_tasks_blocked()
    assert qstats(app, "lq") == (2, 2, 1)
    # nack with requeue: back at its place, redelivered
    status, body = await clients.rest("POST", "/queues/lq/nack", {"lease_ids": [first[1]["lease_id"]]})
    assert (status, body) == (200, {"nacked": 1})
    again = await stream.next_item()
    assert (again["body"], again["redelivered"]) == ("m1", True)
    # a settled lease is gone
    status, body = await clients.rest("POST", "/queues/lq/ack", {"lease_ids": [first[0]["lease_id"]]})
    assert status == 404


async def test_leases_of_a_stream_that_disconnects_return_to_the_queue(app: BrokerApp, clients: Clients) -> None:
    await publish(clients, "lost", [f"m{i}" for i in range(4)])
    stream = await clients.stream("lost", "ack=lease&prefetch=3")
    got = await items(stream, 3)
    await clients.rest("POST", "/queues/lost/ack", {"lease_ids": [got[0]["lease_id"]]})
    assert (await stream.next_item())["body"] == "m3"  # the freed slot is refilled
    await stream.abort()
    await wait_until(lambda: qstats(app, "lost") == (3, 0, 0))
    status, _ = await clients.rest("POST", "/queues/lost/ack", {"lease_ids": [got[1]["lease_id"]]})
    assert status == 404  # the stream's leases ended with it
    after = await clients.stream("lost", "ack=lease")
    again = await items(after, 3)
    assert [(i["body"], i["redelivered"]) for i in again] == [("m1", True), ("m2", True), ("m3", True)]


async def test_leases_extend(app: BrokerApp, clients: Clients) -> None:
    await publish(clients, "ext", ["m"])
    stream = await clients.stream("ext", "ack=lease&lease=30")
    item = await stream.next_item()
    status, body = await clients.rest("POST", "/queues/ext/extend", {"lease_ids": [item["lease_id"]], "lease": 60})
    assert status == 200 and body["extended"] == 1


async def test_auto_mode_stream_that_stops_reading_is_bounded_by_credit(clients: Clients) -> None:
    credit = 128 * 1024
    async with open_tcp_broker(channel_buffer_bytes=credit) as app, Clients(app.port) as c:
        body = "z" * 16000
        await publish(c, "big", [f"{i:05d}{body}" for i in range(1000)])  # 16 MB
        stream = await open_stream(c.track(await connect(app.port, rcvbuf=4096)), "big")
        q = app.runtime.core.queues["big"]
        previous = -1
        while q.delivered != previous:  # until deliveries stand still
            previous = q.delivered
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert q.ready_count() == 1000 - q.delivered > 500
        # reading resumes the flow; every message arrives once, in order
        for i in range(1000):
            assert (await stream.next_item())["body"][:5] == f"{i:05d}"


async def test_auto_mode_acks_only_what_was_written(clients: Clients) -> None:
    # ack=auto: "done once written to the stream". Messages the broker holds for a
    # client that stopped reading are not acked yet, and go back to the queue
    # (redelivered) when that client disconnects.
    async with open_tcp_broker() as app, Clients(app.port) as c:
        body = "w" * 30000
        await publish(c, "w", [f"{i:05d}{body}" for i in range(400)])  # 12 MB
        stream = await open_stream(c.track(await connect(app.port, rcvbuf=4096)), "w", "prefetch=0")
        q = app.runtime.core.queues["w"]
        previous = None
        while (q.delivered, q.acked) != previous:  # until the writer is stuck
            previous = (q.delivered, q.acked)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        held = q.unacked
        assert held > 0  # buffered or being written: not acked
        assert q.acked + held + q.ready_count() == 400
        written = q.acked
        await stream.abort()
        await wait_until(lambda: q.consumers == [])
        assert (q.unacked, q.ready_count()) == (0, 400 - written)
        after = await c.stream("w")
        again = await items(after, held + 1)
        assert [i["body"][:5] for i in again] == [f"{i:05d}" for i in range(written, written + held + 1)]
        assert [i["redelivered"] for i in again] == [True] * held + [False]


# -- lease timeouts and heartbeats (virtual time) ------------------------------------------


@pytest.fixture
async def memory_broker() -> AsyncIterator[MemoryBroker]:
    async with open_memory_broker() as broker:
        yield broker


async def test_unsettled_lease_returns_after_the_lease_time(
    memory_broker: MemoryBroker, autojump_clock: Any
) -> None:
    async def conn() -> trio.abc.Stream:
        return memory_broker.connect()

    async with Clients(connect_fn=conn) as c:
        await publish(c, "lt", ["m0", "m1"])
        stream = await c.stream("lt", "ack=lease&prefetch=1&lease=10")
        start = trio.current_time()
        first = await stream.next_item()
        assert (first["body"], first["redelivered"]) == ("m0", False)
        again = await stream.next_item()  # virtual time runs to the lease's end
        assert (again["body"], again["redelivered"]) == ("m0", True)
        assert trio.current_time() - start == pytest.approx(10.0)
        status, _ = await c.rest("POST", "/queues/lt/ack", {"lease_ids": [first["lease_id"]]})
        assert status == 404
        status, _ = await c.rest("POST", "/queues/lt/ack", {"lease_ids": [again["lease_id"]]})
        assert status == 200


async def test_sse_heartbeat_keeps_idle_streams_alive(memory_broker: MemoryBroker, autojump_clock: Any) -> None:
    async def conn() -> trio.abc.Stream:
        return memory_broker.connect()

    async with Clients(connect_fn=conn) as c:
        await publish(c, "hb", [])
        stream = await c.stream("hb", accept="text/event-stream")
        start = trio.current_time()
        line = await stream.http.read_line()
        assert line == b": heartbeat\n"
        assert trio.current_time() - start == pytest.approx(15.0)


async def test_broker_shutdown_sends_closing_to_streams(app: BrokerApp, clients: Clients) -> None:
    await publish(clients, "bye", ["m0", "m1"])
    stream = await clients.stream("bye", "ack=lease&prefetch=1")
    await stream.next_item()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(app.shutdown, 5.0)
        event = await stream.next_item()
        assert event["ev"] == "closing"
        with pytest.raises(ChannelEnded):
            await stream.next_item()
    q = app.runtime.core.queues["bye"]
    assert (q.ready_count(), q.unacked) == (2, 0)
