"""Publisher confirms that wait for the disk, over real loopback HTTP.

The broker runs in memory, with a stand-in write-ahead log whose durability the test
reports by hand (``wal.make_durable(lsn)``, ``wal.fail(...)``: through the
callbacks the real WAL calls). So the test decides exactly when each persistent
publish becomes durable, and checks that acks wait for it, never overtake an earlier
tag, and coalesce correctly.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from tests.support.app import open_tcp_broker
from tests.support.channel import ChannelClient, Clients, wait_until
from tests.support.fakewal import FakeWAL, attach_fake_wal


@pytest.fixture
def app(broker_app: BrokerApp) -> BrokerApp:
    """The conftest's in-memory broker, with a stand-in log."""
    attach_fake_wal(broker_app.runtime)
    return broker_app


def wal(app: BrokerApp) -> FakeWAL:
    assert isinstance(app.runtime.wal, FakeWAL)
    return app.runtime.wal


def persistent(queue: str, body: str = "p") -> dict[str, Any]:
    return {"op": "publish", "routing_key": queue, "body": body}


def transient(queue: str, body: str = "t") -> dict[str, Any]:
    return {"op": "publish", "routing_key": queue, "body": body, "properties": {"delivery_mode": 1}}


def pending(app: BrokerApp, ch: ChannelClient) -> int:
    """Publishes of the channel waiting for their confirm, in the core."""
    assert ch.channel_id is not None
    return len(app.runtime.core.channels[ch.channel_id].confirms)


async def durable_queue(app: BrokerApp, ch: ChannelClient, name: str) -> None:
    await ch.send({"op": "declare_queue", "queue": name, "durable": True, "id": "dq"})
    await wait_until(lambda: name in app.runtime.core.queues)
    wal(app).make_durable()  # the declaration itself waits for the disk
    await ch.expect("ok", id="dq")


async def test_acks_wait_for_the_disk_and_never_overtake(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await durable_queue(app, ch, "d")
    await ch.send(persistent("d", "1"), persistent("d", "2"))
    # replies are not held up by confirms that wait for the disk
    assert await ch.sync() == []
    first_lsn = wal(app).last_lsn - 1
    await ch.send(transient("d", "3"), {"op": "publish", "routing_key": "nowhere", "body": "4"})
    await ch.send(persistent("d", "5"))
    assert await ch.sync() == []
    wal(app).make_durable(first_lsn)  # tag 1 only
    assert await ch.sync() == [{"ev": "ack", "delivery_tag": 1, "multiple": False}]
    wal(app).make_durable(first_lsn + 1)  # tag 2; 3 and 4 needed no disk but waited for 2
    assert await ch.sync() == [{"ev": "ack", "delivery_tag": 4, "multiple": True}]
    wal(app).make_durable()
    assert await ch.sync() == [{"ev": "ack", "delivery_tag": 5, "multiple": False}]


async def test_the_log_may_sync_a_consumers_acks_lazily_but_not_a_publish(
    app: BrokerApp, clients: Clients
) -> None:
    """The runtime hands the core's ``lazy`` mark to the log: an ack's batch may wait
    for a later fsync (nobody waits on it), a publish's batch never."""
    ch = await clients.channel()
    await durable_queue(app, ch, "lz")
    await ch.send({"op": "consume", "queue": "lz", "id": "c"})
    await ch.expect("consume_ok", id="c")
    before = len(wal(app).appends)
    await ch.send(persistent("lz", "m"))
    (delivery,) = await ch.sync()  # a delivery does not wait for the disk
    assert delivery["ev"] == "deliver"
    assert [lazy for _first, _last, lazy in wal(app).appends[before:]] == [False]
    wal(app).make_durable()
    assert [e["ev"] for e in await ch.sync()] == ["ack"]
    await ch.send({"op": "ack", "delivery_tag": delivery["delivery_tag"]})
    await ch.sync()
    assert [lazy for _first, _last, lazy in wal(app).appends[before:]] == [False, True]


async def test_many_in_flight_settled_once_in_ragged_durable_steps(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await durable_queue(app, ch, "many")
    base = wal(app).last_lsn
    total = 1000
    await ch.send(*[persistent("many", str(i)) for i in range(total)])
    await ch.sync()
    settled: list[int] = []
    last = 0
    for step in (1, 2, 5, 13, 100, 379, total):  # durable up to publish #step
        wal(app).make_durable(base + step)
        for ev in await ch.sync():
            assert ev["ev"] == "ack" and ev["delivery_tag"] == step
            assert ev["multiple"] == (step - last > 1)
            settled.extend(range(last + 1, ev["delivery_tag"] + 1))
            last = ev["delivery_tag"]
    assert settled == list(range(1, total + 1))


async def test_storage_failure_nacks_exactly_the_failed_publishes(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await durable_queue(app, ch, "sf")
    base = wal(app).last_lsn
    await ch.send(*[persistent("sf", str(i)) for i in range(4)])
    await ch.sync()
    wal(app).make_durable(base + 1)
    wal(app).fail(OSError(28, "No space left on device"), through=base + 3)
    wal(app).make_durable(base + 4)
    events = await ch.sync()
    assert [(e["ev"], e["delivery_tag"], e["multiple"]) for e in events] == [
        ("ack", 1, False), ("nack", 2, False), ("nack", 3, False), ("ack", 4, False)
    ]
    assert all("storage failure" in e["reason"] for e in events if e["ev"] == "nack")
    assert app.runtime.core.queues["sf"].ready_count() == 2  # the nacked ones were taken back
    # while storage is failing, persistent publishes are nacked at once
    await ch.send(persistent("sf", "refused"))
    nack = (await ch.sync())[0]
    assert nack["ev"] == "nack" and nack["delivery_tag"] == 5 and "storage" in nack["reason"]


async def test_close_waits_for_pending_confirms(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await durable_queue(app, ch, "cl")
    await ch.send(persistent("cl"), persistent("cl"), {"op": "close"})
    await wait_until(lambda: pending(app, ch) == 2)
    await trio.testing.wait_all_tasks_blocked()
    assert not ch.http.ended  # close_ok waits for the acks
    wal(app).make_durable()
    assert await ch.remaining_events() == [
        {"ev": "ack", "delivery_tag": 2, "multiple": True}, {"ev": "close_ok"}
    ]


async def test_end_of_body_waits_for_pending_confirms(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await durable_queue(app, ch, "eob")
    await ch.send(persistent("eob"))
    await ch.end_body()
    await wait_until(lambda: pending(app, ch) == 1)
    wal(app).make_durable()
    assert await ch.remaining_events() == [
        {"ev": "ack", "delivery_tag": 1, "multiple": False}, {"ev": "close_ok"}
    ]


async def test_confirms_of_publishes_before_an_error_come_before_it(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await durable_queue(app, ch, "er")
    await ch.send(persistent("er"), persistent("er"), {"op": "nack", "delivery_tag": 1})
    await wait_until(lambda: pending(app, ch) == 2)
    await trio.testing.wait_all_tasks_blocked()
    assert not ch.http.ended
    wal(app).make_durable()
    events = await ch.remaining_events()
    assert events[0] == {"ev": "ack", "delivery_tag": 2, "multiple": True}
    assert events[1]["ev"] == "error" and events[1]["error"] == "unknown_delivery_tag"


async def test_disconnect_with_pending_confirms(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await durable_queue(app, ch, "gone")
    await ch.send(persistent("gone"), persistent("gone"))
    await ch.sync()
    await ch.abort()
    await wait_until(lambda: ch.channel_id not in app.runtime.core.channels)
    wal(app).make_durable()  # nobody left to tell: no harm done
    # the messages were routed; a client resend with the same message_id would be
    # deduplicated (docs/protocol.md, "Confirm guarantees")
    assert app.runtime.core.queues["gone"].ready_count() == 2
    other = await clients.channel()
    await other.ok({"op": "declare_queue", "queue": "gone", "passive": True})


async def test_confirms_with_the_real_log(tmp_path: Any) -> None:
    # The same guarantees with the write-ahead log on disk (group commit): many
    # publishes in flight, every tag confirmed once and in order, after an fsync.
    async with open_tcp_broker(data_dir=tmp_path) as app, Clients(app.port) as clients:
        ch = await clients.channel()
        await ch.ok({"op": "declare_queue", "queue": "disk"})
        total = 2000
        for start in range(0, total, 100):
            await ch.send(*[persistent("disk", f"{i}") for i in range(start, start + 100)])
        last = 0
        while last < total:
            ev = await ch.next_event()
            assert ev["ev"] == "ack", ev
            assert ev["delivery_tag"] > last
            assert ev["multiple"] or ev["delivery_tag"] == last + 1
            last = ev["delivery_tag"]
        stats = app.runtime.wal.statistics()
        assert stats.fsyncs >= 1
        assert app.runtime.core.durable_lsn == app.runtime.core.last_lsn
        assert app.runtime.core.queues["disk"].ready_count() == total
