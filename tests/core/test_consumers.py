"""Consumers: dispatch, prefetch, settling, requeue order, channel close, cancel,
exclusivity, credit flow and ack timeouts."""

from __future__ import annotations

import pytest

from broker.core import (
    AccessRefused,
    AppendRecords,
    ChannelError,
    ConsumerCancelled,
    Deliver,
    DeliveryExpired,
    InvalidArgument,
    NotFound,
)
from broker.core.broker import DELIVERY_OVERHEAD_BYTES
from broker.core.records import RecordType, decode_seqs

from .helpers import MONO_START, Harness


def fill(h: Harness, queue: str, n: int, ch: int | None = None, size: int = 1) -> int:
    ch = ch if ch is not None else h.channel()
    for i in range(n):
        h.publish(ch, "", queue, str(i).encode().rjust(size, b"."))
    return ch


def snapshot_state(h: Harness, queue: str, ch: int) -> tuple[object, ...]:
    c = h.b.channels[ch]
    return (
        h.info(queue)["messages_ready"],
        h.info(queue)["messages_unacked"],
        sorted(c.deliveries),
        c.unacked,
        tuple(sorted((t, x.unacked) for t, x in c.consumers.items())),
        h.ready_bodies(queue),
    )


def test_round_robin() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    tags = [h.b.consume(ch, "q", consumer_tag=f"c{i}") for i in range(3)]
    fill(h, "q", 9)
    got = h.delivers(h.step())
    assert [d.consumer_tag for d in got] == tags * 3
    assert [d.message.body for d in got] == [str(i).encode() for i in range(9)]
    assert [d.delivery_tag for d in got] == list(range(1, 10))
    assert not any(d.redelivered for d in got)


def test_round_robin_continues_across_batches() -> None:
    h = Harness()
    h.queue("q", durable=False)
    a, b = h.channel(), h.channel()
    h.b.consume(a, "q", consumer_tag="A")
    h.b.consume(b, "q", consumer_tag="B")
    order = []
    for i in range(6):
        h.publish(a, "", "q", bytes([i]))
        order += [d.consumer_tag for d in h.delivers(h.step())]
    assert order == ["A", "B"] * 3


def test_per_consumer_prefetch_exact() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 10)
    h.b.consume(ch, "q", consumer_tag="p3", prefetch=3)
    got = h.delivers(h.step())
    assert len(got) == 3
    assert h.info("q")["messages_unacked"] == 3
    assert h.delivers(h.step()) == []
    h.b.ack(ch, got[0].delivery_tag)
    more = h.delivers(h.step())
    assert len(more) == 1
    h.b.ack(ch, more[0].delivery_tag, multiple=True)  # acks 1..4 that are still open
    assert len(h.delivers(h.step())) == 3
    assert h.info("q")["messages_unacked"] == 3
    assert h.info("q")["messages_ready"] == 3


def test_prefetch_mixed_consumers() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    h.b.consume(ch, "q", consumer_tag="one", prefetch=1)
    h.b.consume(ch, "q", consumer_tag="inf", prefetch=0)
    fill(h, "q", 6, ch)
    got = h.delivers(h.step())
    assert [d.consumer_tag for d in got] == ["one", "inf", "inf", "inf", "inf", "inf"]


def test_channel_wide_prefetch() -> None:
    h = Harness()
    h.queue("q1", durable=False)
    h.queue("q2", durable=False)
    ch = h.channel()
    h.b.qos(ch, 3, global_=True)
    h.b.consume(ch, "q1", consumer_tag="a")
    h.b.consume(ch, "q2", consumer_tag="b", prefetch=2)
    fill(h, "q1", 5, ch)
    fill(h, "q2", 5, ch)
    got = h.delivers(h.step())
    assert len(got) == 3
    assert h.b.channels[ch].unacked == 3
    # acking one frees exactly one slot, whichever queue it came from
    h.b.ack(ch, got[0].delivery_tag)
    more = h.delivers(h.step())
    assert len(more) == 1
    assert h.b.channels[ch].unacked == 3
    served = {d.consumer_tag for d in got + more}
    assert served == {"a", "b"}
    # raising the limit releases more immediately
    h.b.qos(ch, 6, global_=True)
    assert len(h.delivers(h.step())) == 3
    h.b.qos(ch, 0, global_=True)  # no channel limit; b still has its own
    rest = h.delivers(h.step())
    assert sum(1 for d in rest if d.consumer_tag == "b") <= 2


def test_qos_default_prefetch_for_new_consumers() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 10)
    h.b.qos(ch, 2)
    h.b.consume(ch, "q", consumer_tag="x")
    assert len(h.delivers(h.step())) == 2
    h.b.consume(ch, "q", consumer_tag="y", prefetch=1)
    assert len(h.delivers(h.step())) == 1


@pytest.mark.parametrize("bad", [-1, 65536, True, 1.5, "3"])
def test_invalid_prefetch(bad: object) -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    with pytest.raises(InvalidArgument):
        h.b.consume(ch, "q", prefetch=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        h.b.qos(ch, bad)  # type: ignore[arg-type]
    assert h.b.channels[ch].consumers == {} and h.b.queues["q"].consumers == []


def test_no_ack_consumer() -> None:
    h = Harness()
    h.queue("q")
    ch = fill(h, "q", 5)
    h.b.consume(ch, "q", no_ack=True, prefetch=1)  # prefetch does not limit no-ack
    got = h.delivers(h.step())
    assert len(got) == 5
    assert h.info("q")["messages"] == 0
    assert h.b.channels[ch].deliveries == {}
    settled = [s for _l, rt, p in h.records if rt == RecordType.SETTLE for s in decode_seqs(p)[1]]
    assert sorted(settled) == [1, 2, 3, 4, 5]
    assert not [r for r in h.records if r[1] == RecordType.DELIVERED]
    with pytest.raises(ChannelError):
        h.b.ack(ch, got[0].delivery_tag)


# ----------------------------------------------------------------- settling


def test_ack_nack_reject_variants() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 6)
    h.b.consume(ch, "q", consumer_tag="c")
    d = h.delivers(h.step())
    tags = [x.delivery_tag for x in d]
    assert h.b.ack(ch, tags[1], multiple=True) == 2  # 1, 2
    assert h.b.reject(ch, tags[2], requeue=False) == 1  # dropped
    assert h.b.nack(ch, tags[4], multiple=True, requeue=False) == 2  # 4, 5 dropped
    assert h.b.reject(ch, tags[5], requeue=True) == 1
    redo = h.delivers(h.step())
    assert [(x.message.body, x.redelivered) for x in redo] == [(b"5", True)]
    assert h.info("q")["messages"] == 1


def test_multiple_with_tag_zero_settles_everything() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 4)
    h.b.consume(ch, "q")
    h.step()
    assert h.b.ack(ch, 0, multiple=True) == 4
    assert h.b.ack(ch, 0, multiple=True) == 0
    assert h.info("q")["messages"] == 0


def test_requeue_returns_to_original_position() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 5)
    c = h.b.consume(ch, "q", prefetch=2)
    d = h.delivers(h.step())
    assert [x.message.body for x in d] == [b"0", b"1"]
    h.b.cancel(ch, c)
    h.b.nack(ch, d[1].delivery_tag, requeue=True)
    h.b.nack(ch, d[0].delivery_tag, requeue=True)
    assert h.ready_bodies("q") == [b"0", b"1", b"2", b"3", b"4"]
    h.b.consume(ch, "q")
    again = h.delivers(h.step())
    assert [(x.message.body, x.redelivered) for x in again] == [
        (b"0", True), (b"1", True), (b"2", False), (b"3", False), (b"4", False)
    ]


def test_requeue_between_newer_messages() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 3)
    c = h.b.consume(ch, "q")
    d = h.delivers(h.step())
    h.b.cancel(ch, c)
    h.b.ack(ch, d[0].delivery_tag)
    h.b.nack(ch, d[2].delivery_tag)  # "2" comes back
    fill(h, "q", 2, ch)  # "0", "1" again (new messages)
    h.b.nack(ch, d[1].delivery_tag)  # "1" (old) comes back before "2"
    assert h.ready_bodies("q") == [b"1", b"2", b"0", b"1"]
    assert [e.delivered for e in [x for _s, x in sorted(h.b.queues["q"].lanes[0].requeued, key=lambda p: p[0])]] == [
        True, True
    ]


@pytest.mark.parametrize("op", ["ack", "nack", "reject", "ack-multiple", "nack-multiple", "touch"])
@pytest.mark.parametrize("tag", [99, -1, True, "1", None])
def test_unknown_tag_is_channel_error_without_change(op: str, tag: object) -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 4)
    h.b.consume(ch, "q", consumer_tag="c", prefetch=2)
    h.step()
    before = snapshot_state(h, "q", ch)
    with pytest.raises(ChannelError) as ei:
        if op == "ack":
            h.b.ack(ch, tag)  # type: ignore[arg-type]
        elif op == "nack":
            h.b.nack(ch, tag)  # type: ignore[arg-type]
        elif op == "reject":
            h.b.reject(ch, tag, requeue=False)  # type: ignore[arg-type]
        elif op == "ack-multiple":
            h.b.ack(ch, tag, multiple=True)  # type: ignore[arg-type]
        elif op == "nack-multiple":
            h.b.nack(ch, tag, multiple=True)  # type: ignore[arg-type]
        else:
            h.b.touch(ch, tag)  # type: ignore[arg-type]
    assert ei.value.code in ("unknown_delivery_tag", "invalid_argument")
    assert h.delivers(h.step()) == []
    assert snapshot_state(h, "q", ch) == before


def test_a_batch_of_only_acks_and_delivery_marks_is_lazy() -> None:
    """The log may sync acks later (the design's "consumer acks may be synced lazily"),
    but never a batch that also holds a record somebody waits for."""
    h = Harness()
    h.queue("q")
    ch = h.channel()
    consumer = h.b.consume(ch, "q")
    h.publish(ch, "", "q", b"m1")
    (batch,) = h.of_type(AppendRecords, h.sync())  # ENQUEUE and DELIVERED together
    assert not batch.lazy
    h.b.ack(ch, 1, False)
    h.publish(ch, "", "q", b"m2")
    (batch,) = h.of_type(AppendRecords, h.sync())  # the ack rides with a publish
    assert not batch.lazy
    assert [rtype for rtype, _ in batch.records][0] == RecordType.ENQUEUE
    h.b.ack(ch, 2, False)
    (batch,) = h.of_type(AppendRecords, h.sync())
    assert batch.lazy
    assert [rtype for rtype, _ in batch.records] == [RecordType.SETTLE]
    h.b.cancel(ch, consumer)
    h.publish(ch, "", "q", b"m3")
    h.sync()
    h.b.get("q", 1, lease_s=30)
    (batch,) = h.of_type(AppendRecords, h.sync())  # a lease's delivery mark alone
    assert batch.lazy
    assert [rtype for rtype, _ in batch.records] == [RecordType.DELIVERED]


def test_double_ack_is_channel_error() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 1)
    h.b.consume(ch, "q")
    (d,) = h.delivers(h.step())
    h.b.ack(ch, d.delivery_tag)
    with pytest.raises(ChannelError):
        h.b.ack(ch, d.delivery_tag)
    with pytest.raises(ChannelError):
        h.b.ack(ch + 1, 1)  # channel not open


def test_tags_are_per_channel() -> None:
    h = Harness()
    h.queue("q", durable=False)
    a, b = h.channel(), h.channel()
    h.b.consume(a, "q")
    h.b.consume(b, "q")
    fill(h, "q", 4)
    got = h.delivers(h.step())
    assert sorted((d.channel_id, d.delivery_tag) for d in got) == [(a, 1), (a, 2), (b, 1), (b, 2)]
    with pytest.raises(ChannelError):
        h.b.ack(a, 3)


# ------------------------------------------------------------ close, cancel


def test_close_channel_requeues_each_unacked_once() -> None:
    h = Harness()
    h.queue("q", durable=False)
    h.queue("r", durable=False)
    pub = h.channel()
    fill(h, "q", 5, pub)
    fill(h, "r", 2, pub)
    ch = h.channel()
    h.b.consume(ch, "q", consumer_tag="cq", prefetch=3)
    h.b.consume(ch, "r", consumer_tag="cr")
    d = h.delivers(h.step())
    assert len(d) == 5
    dq = [x for x in d if x.consumer_tag == "cq"]
    assert [x.message.body for x in dq] == [b"0", b"1", b"2"]
    h.b.ack(ch, dq[0].delivery_tag)
    h.b.close_channel(ch)
    h.b.close_channel(ch)  # idempotent
    assert ch not in h.b.channels
    assert h.b.queues["q"].consumers == [] and h.b.queues["r"].consumers == []
    assert h.info("q")["messages_ready"] == 4
    assert h.info("q")["messages_unacked"] == 0
    assert h.info("r")["messages_ready"] == 2
    other = h.channel()
    h.b.consume(other, "q")
    again = h.delivers(h.step())
    assert [(x.message.body, x.redelivered) for x in again] == [
        (b"1", True), (b"2", True), (b"3", False), (b"4", False)
    ]
    with pytest.raises(ChannelError):
        h.b.ack(ch, d[1].delivery_tag)


def test_close_channel_wakes_other_consumers() -> None:
    h = Harness()
    h.queue("q", durable=False)
    a, b = h.channel(), h.channel()
    h.b.consume(a, "q", consumer_tag="a")
    fill(h, "q", 2, a)
    assert len(h.delivers(h.step(), a)) == 2
    h.b.consume(b, "q", consumer_tag="b")
    assert h.delivers(h.step()) == []
    h.b.close_channel(a)
    got = h.delivers(h.step())
    assert [(x.channel_id, x.redelivered) for x in got] == [(b, True), (b, True)]


def test_cancel() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 4)
    tag = h.b.consume(ch, "q", prefetch=2)
    d = h.delivers(h.step())
    h.b.cancel(ch, tag)
    with pytest.raises(NotFound):
        h.b.cancel(ch, tag)
    # deliveries stay with the channel and can be settled; nothing more is delivered
    h.b.ack(ch, d[0].delivery_tag)
    assert h.delivers(h.step()) == []
    assert h.info("q")["messages_unacked"] == 1
    assert h.info("q")["consumers"] == 0
    # the tag may be reused
    assert h.b.consume(ch, "q", consumer_tag=tag, prefetch=1) == tag
    got = h.delivers(h.step())
    assert len(got) == 1  # the old consumer's open delivery does not count against it
    assert h.info("q")["messages_unacked"] == 2
    h.b.ack(ch, d[1].delivery_tag)
    assert h.delivers(h.step()) == []  # still at its own limit


def test_duplicate_consumer_tag() -> None:
    h = Harness()
    h.queue("q", durable=False)
    h.queue("r", durable=False)
    ch = h.channel()
    h.b.consume(ch, "q", consumer_tag="same")
    with pytest.raises(ChannelError) as ei:
        h.b.consume(ch, "r", consumer_tag="same")
    assert ei.value.code == "not_allowed"
    assert h.b.queues["r"].consumers == []
    other = h.channel()
    assert h.b.consume(other, "q", consumer_tag="same") == "same"  # per channel


def test_generated_consumer_tags_are_unique() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    tags = {h.b.consume(ch, "q") for _ in range(5)}
    assert len(tags) == 5 and all(t.startswith("ctag-b0-") for t in tags)


def test_consume_unknown_queue_or_channel() -> None:
    h = Harness()
    ch = h.channel()
    with pytest.raises(NotFound):
        h.b.consume(ch, "nope")
    h.queue("q", durable=False)
    with pytest.raises(ChannelError):
        h.b.consume(77, "q")


def test_exclusive_consumer_rules() -> None:
    h = Harness()
    h.queue("q", durable=False)
    a, b = h.channel(), h.channel()
    h.b.consume(a, "q", consumer_tag="normal")
    with pytest.raises(AccessRefused):
        h.b.consume(b, "q", exclusive=True)
    h.b.cancel(a, "normal")
    h.b.consume(a, "q", consumer_tag="ex", exclusive=True)
    with pytest.raises(AccessRefused):
        h.b.consume(b, "q")
    with pytest.raises(AccessRefused):
        h.b.consume(a, "q", consumer_tag="second")
    assert [c.tag for c in h.b.queues["q"].consumers] == ["ex"]
    h.b.close_channel(a)
    h.b.consume(b, "q", consumer_tag="after")
    h.b.consume(b, "q", consumer_tag="after2")


def test_queue_deletion_cancels_consumers() -> None:
    h = Harness()
    h.queue("q", durable=False)
    a, b = h.channel(), h.channel()
    h.b.consume(a, "q", consumer_tag="x")
    h.b.consume(b, "q", consumer_tag="y")
    h.b.delete_queue("q")
    cancelled = h.of_type(ConsumerCancelled, h.step())
    assert sorted((c.channel_id, c.consumer_tag) for c in cancelled) == [(a, "x"), (b, "y")]
    assert all(c.reason for c in cancelled)
    assert h.b.channels[a].consumers == {} and h.b.channels[b].consumers == {}


# -------------------------------------------------------------- credit flow


def test_credit_stops_and_resumes_deliveries() -> None:
    per = 100 + DELIVERY_OVERHEAD_BYTES
    h = Harness(channel_credit_bytes=3 * per)
    h.queue("q", durable=False)
    ch = fill(h, "q", 10, size=100)
    h.b.consume(ch, "q", no_ack=True)
    first = h.delivers(h.step())
    assert len(first) == 3
    assert h.b.channels[ch].credit == 0
    assert h.delivers(h.step()) == []
    h.b.grant_credit(ch, per)
    assert len(h.delivers(h.step())) == 1
    h.b.grant_credit(ch, 10 * per)  # capped at the configured credit
    assert h.b.channels[ch].credit == 3 * per
    assert len(h.delivers(h.step())) == 3
    h.b.grant_credit(ch, 1)  # a little credit lets one (over-sized) delivery through
    assert len(h.delivers(h.step())) == 1
    assert h.b.channels[ch].credit < 0
    h.b.grant_credit(ch, 1)
    assert h.delivers(h.step()) == []
    h.b.grant_credit(12345, 1)  # unknown channel: ignored


def test_credit_blocks_only_its_channel() -> None:
    per = 10 + DELIVERY_OVERHEAD_BYTES
    h = Harness(channel_credit_bytes=per)
    h.queue("q", durable=False)
    slow, fast = h.channel(), h.channel()
    h.b.consume(slow, "q", consumer_tag="slow")
    h.b.consume(fast, "q", consumer_tag="fast")
    fill(h, "q", 3, size=10)
    got = h.delivers(h.step())
    assert [d.consumer_tag for d in got] == ["slow", "fast"]
    h.b.grant_credit(fast, per)
    assert [d.consumer_tag for d in h.delivers(h.step())] == ["fast"]


# -------------------------------------------------------------- ack timeout


def test_ack_timeout_requeues_and_late_ack_fails() -> None:
    h = Harness(consumer_timeout_s=30)
    h.queue("q", durable=False)
    ch = fill(h, "q", 2)
    h.b.consume(ch, "q", consumer_tag="slow", prefetch=1)
    (d,) = h.delivers(h.step())
    assert h.b.next_deadline() == pytest.approx(h.mono.now + 30)
    effects = h.sleep(29.9)
    assert h.of_type(DeliveryExpired, effects) == []
    effects = h.sleep(0.1)
    assert h.of_type(DeliveryExpired, effects) == [DeliveryExpired(ch, "slow", d.delivery_tag)]
    # it went back and (prefetch freed) is delivered again, redelivered
    again = h.delivers(effects)
    assert [(x.message.body, x.redelivered) for x in again] == [(b"0", True)]
    with pytest.raises(ChannelError) as ei:
        h.b.ack(ch, d.delivery_tag)
    assert ei.value.code == "delivery_expired"
    with pytest.raises(ChannelError) as ei:
        h.b.nack(ch, d.delivery_tag, multiple=True)
    assert ei.value.code == "delivery_expired"
    h.b.ack(ch, again[0].delivery_tag)
    assert h.info("q")["messages"] == 1


def test_a_delivery_of_a_deleted_queue_never_times_out_and_its_settle_does_nothing() -> None:
    # (its queue deleted, or gone from this core with a cluster node's leadership):
    # nothing can go back, so its ack timeout must not end the client's channel
    h = Harness(consumer_timeout_s=30)
    h.queue("q", durable=False)
    h.queue("other", durable=False)
    ch = fill(h, "q", 1)
    fill(h, "other", 1, ch=ch)
    h.b.consume(ch, "q", consumer_tag="gone", prefetch=1)
    h.b.consume(ch, "other", consumer_tag="live", prefetch=1)
    by_tag = {d.consumer_tag: d for d in h.delivers(h.step())}
    gone, live = by_tag["gone"], by_tag["live"]
    h.b.delete_queue("q")
    effects = h.sleep(31)
    assert h.of_type(DeliveryExpired, effects) == [DeliveryExpired(ch, "live", live.delivery_tag)]
    assert h.b.ack(ch, gone.delivery_tag) == 1  # no error: it simply goes
    assert h.b.next_deadline() == pytest.approx(h.mono.now + 30)  # the live one's redelivery


def test_touch_postpones_deadline() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 1)
    h.b.consume(ch, "q", consumer_tag="c", ack_timeout_s=10)
    (d,) = h.delivers(h.step())
    h.sleep(8)
    h.b.touch(ch, d.delivery_tag)
    assert h.of_type(DeliveryExpired, h.sleep(8)) == []  # 16 s after delivery
    effects = h.sleep(2.5)  # 10.5 s after the touch
    assert h.of_type(DeliveryExpired, effects) == [DeliveryExpired(ch, "c", d.delivery_tag)]
    assert [(x.delivery_tag, x.redelivered) for x in h.delivers(effects)] == [(d.delivery_tag + 1, True)]


def test_queue_consumer_timeout_argument() -> None:
    h = Harness(consumer_timeout_s=1000)
    h.queue("q", durable=False, arguments={"x-consumer-timeout": 5000})
    ch = fill(h, "q", 1)
    h.b.consume(ch, "q")
    h.step()
    assert len(h.of_type(DeliveryExpired, h.sleep(5))) == 1


def test_expiry_of_cancelled_consumer_delivery() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 1)
    tag = h.b.consume(ch, "q", ack_timeout_s=1)
    h.step()
    h.b.cancel(ch, tag)
    effects = h.sleep(2)
    assert len(h.of_type(DeliveryExpired, effects)) == 1
    assert h.info("q")["messages_ready"] == 1 and h.info("q")["messages_unacked"] == 0
    assert h.b.channels[ch].unacked == 0


def test_stale_timers_are_skipped() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 1)
    h.b.consume(ch, "q", ack_timeout_s=5)
    (d,) = h.delivers(h.step())
    h.b.ack(ch, d.delivery_tag)
    assert h.b.next_deadline() is None
    assert h.of_type(DeliveryExpired, h.sleep(10)) == []


def test_lease_mode_consumer() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 3)
    h.b.consume(ch, "q", consumer_tag="stream", lease_s=10, prefetch=2)
    d = h.delivers(h.step())
    assert [x.lease_id is not None for x in d] == [True, True]
    assert h.b.ack_leases([d[0].lease_id]) == 1
    more = h.delivers(h.step())
    assert len(more) == 1
    # expiry of a lease-mode delivery: requeued, no DeliveryExpired event
    effects = h.sleep(11)
    assert h.of_type(DeliveryExpired, effects) == []
    again = h.delivers(effects)
    assert sorted(x.message.body for x in again) == [b"1", b"2"]
    assert all(x.redelivered for x in again)
    with pytest.raises(NotFound):
        h.b.ack_leases([d[1].lease_id])


def test_plain_delivery_is_not_a_lease() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 1)
    h.b.consume(ch, "q")
    (d,) = h.delivers(h.step())
    assert d.lease_id is None
    with pytest.raises(NotFound):
        h.b.ack_leases([f"b0-{ch}-{d.delivery_tag}"])
    assert h.info("q")["messages_unacked"] == 1


def test_dispatch_skips_expired_messages() -> None:
    h = Harness()
    h.queue("q", durable=False, arguments={"x-message-ttl": 1000})
    ch = fill(h, "q", 3)
    h.wall.now += 2
    h.publish(ch, "", "q", b"fresh")
    h.b.consume(ch, "q")
    assert [d.message.body for d in h.delivers(h.step())] == [b"fresh"]
    assert isinstance(h.delivers()[0], Deliver)


def test_channel_prefetch_does_not_starve_no_ack_consumer() -> None:
    h = Harness()
    h.queue("q", durable=False)
    h.queue("r", durable=False)
    ch = h.channel()
    h.b.qos(ch, 1, global_=True)
    h.b.consume(ch, "q", consumer_tag="manual")
    fill(h, "q", 1, ch)
    assert len(h.delivers(h.step())) == 1  # the channel is now at its limit
    h.b.consume(ch, "r", consumer_tag="auto", no_ack=True)
    fill(h, "r", 3, ch)
    got = h.delivers(h.step())
    assert [d.consumer_tag for d in got] == ["auto"] * 3


def test_next_deadline_follows_touch_and_settle() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = fill(h, "q", 2)
    h.b.consume(ch, "q", ack_timeout_s=10)
    d1, d2 = h.delivers(h.step())
    start = h.mono.now
    assert h.b.next_deadline() == start + 10
    h.mono.now += 3
    h.b.touch(ch, d1.delivery_tag)
    h.b.ack(ch, d2.delivery_tag)
    assert h.b.next_deadline() == start + 13
    h.b.ack(ch, d1.delivery_tag)
    assert h.b.next_deadline() is None


def test_settled_deliveries_do_not_pile_up_timers() -> None:
    """Timers of settled deliveries must not accumulate for the whole ack timeout:
    at a high delivery rate with a 30-minute timeout that is unbounded memory."""
    h = Harness(channel_credit_bytes=1 << 40)
    h.queue("q", durable=False)
    ch = h.channel()
    h.b.consume(ch, "q", prefetch=1)
    slow = h.channel()
    h.b.declare_queue("held", durable=False)
    h.publish(slow, "", "held")
    h.b.consume(slow, "held", consumer_tag="held-c")  # one delivery stays unacked: its timer heads the heap
    h.step()
    for i in range(20_000):
        h.mono.now += 0.001
        h.publish(ch, "", "q")
        for e in h.b.take_effects():
            if isinstance(e, Deliver):
                h.b.ack(ch, e.delivery_tag)
        if i % 1000 == 0:
            h.b.next_deadline()  # what an IO loop would call
    assert len(h.b._timers) < 5000
    # the live deadline survived the rebuilds, and expires on time
    assert h.b.next_deadline() == MONO_START + 1800
    h.mono.now = MONO_START + 1799.9
    h.b.advance()
    assert h.of_type(DeliveryExpired, h.step()) == []
    h.mono.now = MONO_START + 1800
    h.b.advance()
    assert h.of_type(DeliveryExpired, h.step()) == [DeliveryExpired(slow, "held-c", 1)]


def test_rebuilding_the_timer_heap_keeps_queue_and_lock_timers() -> None:
    """The rebuild above starts from the live deliveries; the heap also holds the
    entries of queues (a delayed message here) and of coordination (a lock's
    expiry), which must survive it and still fire on time."""
    h = Harness(channel_credit_bytes=1 << 40)
    h.queue("q", durable=False)
    h.queue("later", durable=False)
    ch = h.channel()
    h.b.consume(ch, "q", prefetch=1)
    h.b.publish(ch, "", "later", b"held", delay_s=60)
    info, _ = h.b.lock_acquire(ch, "lk", "me", 60, 0)
    assert info is not None and info["held"]
    h.step()
    for _ in range(5000):  # several rebuilds (each at twice the live size, 1024 at least)
        h.publish(ch, "", "q")
        for e in h.b.take_effects():
            if isinstance(e, Deliver):
                h.b.ack(ch, e.delivery_tag)
    assert h.info("later")["messages_delayed"] == 1
    h.sleep(61)
    assert h.info("later")["messages_ready"] == 1
    assert h.b.lock_info("lk")["held"] is False
