"""REST gets: leases, their expiry and settlement, and parked long-polls."""

from __future__ import annotations

from typing import Any

import pytest

from broker.core import InvalidArgument, NotFound, QueueReady, ResourceLocked
from broker.core.records import RecordType

from .helpers import Harness


def setup(n: int = 3, **kwargs: Any) -> Harness:
    h = Harness(**kwargs)
    h.queue("q")
    ch = h.channel()
    for i in range(n):
        h.publish(ch, "", "q", str(i).encode())
    h.sync()
    return h


def lease_state(h: Harness) -> tuple[object, ...]:
    rest = h.b.channels[0]
    return (
        h.info("q")["messages_ready"],
        h.info("q")["messages_unacked"],
        sorted(rest.deliveries),
        sorted((t, d.deadline) for t, d in rest.deliveries.items()),
        h.ready_bodies("q"),
    )


def test_get_returns_leases() -> None:
    h = setup()
    got = h.b.get("q", max_count=2, lease_s=30)
    assert len(got) == 2
    ids = [g[0] for g in got]
    assert len(set(ids)) == 2 and all(i.startswith("b0-0-") for i in ids)
    assert [g[1].entry.message.body for g in got] == [b"0", b"1"]
    assert [g[2] for g in got] == [False, False]
    assert h.info("q")["messages_ready"] == 1 and h.info("q")["messages_unacked"] == 2
    assert len(h.b.get("q", max_count=10)) == 1
    assert h.b.get("q", max_count=10) == []


def test_get_missing_or_exclusive_queue() -> None:
    h = Harness()
    with pytest.raises(NotFound):
        h.b.get("nope")
    ch = h.channel()
    h.b.declare_queue("ex", exclusive=True, channel_id=ch)
    with pytest.raises(ResourceLocked):
        h.b.get("ex")


@pytest.mark.parametrize("lease", [0, -1, 43200.5, 1e9])
def test_get_lease_bounds(lease: float) -> None:
    h = setup()
    with pytest.raises(InvalidArgument):
        h.b.get("q", lease_s=lease)
    assert h.info("q")["messages_ready"] == 3


def test_lease_expiry_requeues_redelivered() -> None:
    h = setup()
    (lid, _d, redelivered), = h.b.get("q", lease_s=10)
    assert not redelivered
    h.sleep(9.9)
    assert h.info("q")["messages_unacked"] == 1
    h.sleep(0.2)
    assert h.info("q")["messages_unacked"] == 0
    assert h.ready_bodies("q") == [b"0", b"1", b"2"]  # back at the head
    with pytest.raises(NotFound):
        h.b.ack_leases([lid])
    (lid2, d2, redelivered2), = h.b.get("q")
    assert d2.entry.message.body == b"0" and redelivered2 and lid2 != lid


def test_ack_leases() -> None:
    h = setup()
    got = h.b.get("q", max_count=3)
    assert h.b.ack_leases([got[0][0], got[2][0]]) == 2
    h.step()
    assert h.info("q")["messages"] == 1
    settles = [r for r in h.records if r[1] == RecordType.SETTLE]
    assert settles
    with pytest.raises(NotFound):
        h.b.ack_leases([got[0][0]])


def test_nack_leases_requeue_and_drop() -> None:
    h = setup()
    got = h.b.get("q", max_count=3)
    assert h.b.nack_leases([got[1][0]], requeue=True) == 1
    assert h.b.nack_leases([got[0][0]], requeue=False) == 1
    assert h.ready_bodies("q") == [b"1"]
    assert h.info("q")["messages"] == 2  # "1" ready, "2" leased
    (_lid, d, redelivered), = h.b.get("q")
    assert d.entry.message.body == b"1" and redelivered


def test_extend_leases() -> None:
    h = setup()
    got = h.b.get("q", max_count=2, lease_s=10)
    h.sleep(8)
    assert h.b.extend_leases([got[0][0]], 10) == 1
    h.sleep(5)  # 13 s: the unextended one expired, the extended one did not
    assert h.ready_bodies("q") == [b"1", b"2"]
    h.sleep(5.5)  # 18.5 s: past 8 + 10
    assert h.ready_bodies("q") == [b"0", b"1", b"2"]
    with pytest.raises(InvalidArgument):
        h.b.extend_leases([got[0][0]], 0)


BAD_LISTS: list[Any] = [
    [],
    "b0-0-1",
    None,
]


@pytest.mark.parametrize("bad", BAD_LISTS)
def test_lease_list_must_be_non_empty_list(bad: Any) -> None:
    h = setup()
    h.b.get("q")
    before = lease_state(h)
    for call in (h.b.ack_leases, h.b.nack_leases, lambda ids: h.b.extend_leases(ids, 5)):
        with pytest.raises(InvalidArgument):
            call(bad)
    assert lease_state(h) == before


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ("b0-0-99", NotFound),
        ("other-0-1", NotFound),
        ("b0-5-1", NotFound),
        ("garbage", NotFound),
        ("b0-0-x", NotFound),
        ("b0-0-²", NotFound),
        ("", NotFound),
        (7, InvalidArgument),
        (None, InvalidArgument),
        (["b0-0-1"], InvalidArgument),
        ({"id": 1}, InvalidArgument),
        ("DUP", InvalidArgument),  # the first valid id listed twice
        ("ALIAS", NotFound),  # the first valid id spelled differently ("01")
    ],
)
@pytest.mark.parametrize("op", ["ack", "nack", "nack-drop", "extend"])
def test_bad_lease_ids_change_nothing(extra: Any, error: type[Exception], op: str) -> None:
    h = setup()
    got = h.b.get("q", max_count=2)
    valid = [g[0] for g in got]
    if extra == "DUP":
        extra = valid[0]
    elif extra == "ALIAS":
        boot, ch, tag = valid[0].split("-")
        extra = f"{boot}-{ch}-0{tag}"
    h.sleep(1)
    before = lease_state(h)
    ids = [valid[0], extra, valid[1]]
    with pytest.raises(error):
        if op == "ack":
            h.b.ack_leases(ids)
        elif op == "nack":
            h.b.nack_leases(ids)
        elif op == "nack-drop":
            h.b.nack_leases(ids, requeue=False)
        else:
            h.b.extend_leases(ids, 100)
    assert lease_state(h) == before
    # the valid ones still work afterwards
    assert h.b.ack_leases(valid) == 2


def test_parked_getter_woken_by_publish() -> None:
    h = Harness()
    h.queue("q", durable=False)
    h.b.park_getter("q")
    ch = h.channel()
    h.publish(ch, "", "q")
    assert h.of_type(QueueReady, h.step()) == [QueueReady("q")]
    h.b.unpark_getter("q")
    h.publish(ch, "", "q")
    assert h.of_type(QueueReady, h.step()) == []
    h.b.unpark_getter("q")  # extra unpark is harmless
    h.b.unpark_getter("nope")
    with pytest.raises(NotFound):
        h.b.park_getter("nope")


def test_parked_getter_woken_by_requeue() -> None:
    h = setup(1)
    (lid, _d, _r), = h.b.get("q", lease_s=5)
    h.b.park_getter("q")
    h.step()
    assert h.of_type(QueueReady, h.sleep(6)) == [QueueReady("q")]
    (lid, _d, _r), = h.b.get("q")
    h.b.nack_leases([lid])
    assert h.of_type(QueueReady, h.step()) == [QueueReady("q")]


def test_no_wakeup_when_consumers_take_it() -> None:
    h = Harness()
    h.queue("q", durable=False)
    h.b.park_getter("q")
    ch = h.channel()
    h.b.consume(ch, "q")
    h.publish(ch, "", "q")
    effects = h.step()
    assert h.of_type(QueueReady, effects) == []
    assert len(h.delivers(effects)) == 1


def test_lease_of_deleted_queue_can_be_settled() -> None:
    h = setup(2)
    got = h.b.get("q", max_count=2)
    h.b.delete_queue("q")
    assert h.b.ack_leases([got[0][0]]) == 1
    assert h.b.nack_leases([got[1][0]]) == 1  # nowhere to go back to: dropped
    h.queue("q")
    assert h.info("q")["messages"] == 0
    assert h.b.channels[0].unacked == 0


def test_get_skips_expired_and_logs_delivery() -> None:
    h = Harness()
    h.queue("q", arguments={"x-message-ttl": 1000})
    ch = h.channel()
    h.publish(ch, "", "q", b"old")
    h.wall.now += 2
    h.publish(ch, "", "q", b"new")
    h.sync()
    got = h.b.get("q", max_count=5)
    assert [g[1].entry.message.body for g in got] == [b"new"]
    h.step()
    types = [r[1] for r in h.records]
    assert RecordType.DELIVERED in types and RecordType.SETTLE in types


def test_rest_lease_touch_uses_default_lease() -> None:
    h = setup(1, default_lease_s=20)
    (lid, d, _r), = h.b.get("q", lease_s=5)
    h.sleep(4)
    h.b.touch(0, d.tag)  # the REST channel's deliveries are leases
    h.sleep(19)
    assert h.info("q")["messages_unacked"] == 1
    h.sleep(2)
    assert h.info("q")["messages_unacked"] == 0


def test_parked_getter_woken_when_consumers_are_full() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    h.b.consume(ch, "q", prefetch=1)
    h.publish(ch, "", "q")
    h.step()
    h.b.park_getter("q")
    h.publish(ch, "", "q")
    effects = h.step()
    assert h.delivers(effects) == []
    assert [e.queue for e in h.of_type(QueueReady, effects)] == ["q"]


def test_parked_getter_woken_when_queue_deleted() -> None:
    h = Harness()
    h.queue("q", durable=False)
    h.b.park_getter("q")
    h.b.delete_queue("q")
    assert [e.queue for e in h.of_type(QueueReady, h.step())] == ["q"]
