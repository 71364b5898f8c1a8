"""Publishing and publisher confirms: numbering, ordering, durability waits, nacks,
returns, deduplication, overflow and TTL.

The harness (helpers.Harness.step) checks on every effect batch that confirms come in
tag order and that each tag is confirmed exactly once.
"""

from __future__ import annotations

import pytest

from broker.core import ChannelError, Confirm, Deliver, Return
from broker.core.records import RecordType, decode_seqs

from .helpers import Harness

TRANSIENT = {"delivery_mode": 1}


def confirm_effects(effects: list[object], ch: int) -> list[Confirm]:
    return [e for e in effects if isinstance(e, Confirm) and e.channel_id == ch]


def settled_seqs(h: Harness) -> list[int]:
    out: list[int] = []
    for _lsn, rtype, payload in h.records:
        if rtype == RecordType.SETTLE:
            out.extend(decode_seqs(payload)[1])
    return out


def test_tags_count_per_channel() -> None:
    h = Harness()
    h.queue("q", durable=False)
    a = h.channel()
    b = h.channel()
    assert [h.publish(a, "", "q") for _ in range(3)] == [1, 2, 3]
    assert [h.publish(b, "", "q") for _ in range(2)] == [1, 2]
    assert h.publish(a, "", "q") == 4
    h.step()
    assert sorted(h.confirms[a].outcome) == [1, 2, 3, 4]
    assert sorted(h.confirms[b].outcome) == [1, 2]
    assert all(v == (True, None) for v in h.confirms[a].outcome.values())


def test_publish_on_unknown_channel() -> None:
    h = Harness()
    with pytest.raises(ChannelError):
        h.b.publish(99, "", "q", b"x")


def test_run_of_acks_is_coalesced_into_multiple() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    for _ in range(5):
        h.publish(ch, "", "q")
    effects = h.step()
    assert confirm_effects(effects, ch) == [Confirm(ch, 5, True, True, None)]
    h.publish(ch, "", "q")
    assert confirm_effects(h.step(), ch) == [Confirm(ch, 6, False, True, None)]


def test_persistent_to_durable_waits_for_durable_lsn() -> None:
    h = Harness()
    h.queue("q")
    ch = h.channel()
    tag = h.publish(ch, "", "q", b"p")
    effects = h.step()
    assert confirm_effects(effects, ch) == []
    appends = [e for e in effects if type(e).__name__ == "AppendRecords"]
    assert len(appends) == 1
    lsn = appends[0].last_lsn
    h.b.durable(lsn - 1)
    assert confirm_effects(h.step(), ch) == []
    h.b.durable(lsn)
    assert confirm_effects(h.step(), ch) == [Confirm(ch, tag, False, True, None)]
    # durable() going backwards or repeating is harmless
    h.b.durable(lsn)
    h.b.durable(1)
    assert confirm_effects(h.step(), ch) == []


@pytest.mark.parametrize(
    ("queue_durable", "props"),
    [(True, TRANSIENT), (False, None), (False, TRANSIENT)],
)
def test_no_wait_without_a_record(queue_durable: bool, props: dict[str, int] | None) -> None:
    h = Harness()
    h.queue("q", durable=queue_durable)
    ch = h.channel()
    tag = h.publish(ch, "", "q", b"m", props)
    h.step()
    assert h.acked(ch, tag)
    assert [r for r in h.records if r[1] == RecordType.ENQUEUE] == []


def test_unroutable_is_acked_at_once() -> None:
    h = Harness()
    h.b.declare_exchange("x", "direct")
    ch = h.channel()
    tag = h.publish(ch, "x", "nowhere")
    effects = h.step()
    assert h.acked(ch, tag)
    assert h.of_type(Return, effects) == []


def test_mixed_waits_release_in_order() -> None:
    h = Harness()
    h.queue("d")  # durable
    h.queue("t", durable=False)
    ch = h.channel()
    plan = [("d", None), ("t", None), ("d", TRANSIENT), ("d", None), ("t", TRANSIENT), ("t", None)]
    for qname, props in plan:
        h.publish(ch, "", qname, b"m", props)
        h.step()
    # nothing may be confirmed: tag 1 waits, everything after it queues behind
    assert ch not in h.confirms or h.confirms[ch].last == 0
    first_lsn = next(lsn for lsn, rtype, _p in h.records if rtype == RecordType.ENQUEUE)
    h.b.durable(first_lsn)
    h.step()
    assert h.confirms[ch].last == 3  # tags 2 and 3 needed nothing; tag 4 waits on LSN 2
    h.b.durable(h.b.last_lsn)
    h.step()
    assert h.confirms[ch].last == 6
    assert all(v == (True, None) for v in h.confirms[ch].outcome.values())


def test_waiting_confirms_per_channel_are_independent() -> None:
    h = Harness()
    h.queue("d")
    h.queue("t", durable=False)
    a = h.channel()
    b = h.channel()
    h.publish(a, "", "d")
    h.publish(b, "", "t")
    h.step()
    assert h.acked(b, 1)
    assert h.confirm_of(a, 1) is None
    h.sync()
    assert h.acked(a, 1)


def test_deliveries_do_not_wait_for_durability() -> None:
    h = Harness()
    h.queue("q")
    ch = h.channel()
    h.b.consume(ch, "q")
    tag = h.publish(ch, "", "q", b"early")
    effects = h.step()
    assert [d.message.body for d in h.delivers(effects)] == [b"early"]
    assert h.confirm_of(ch, tag) is None


# --------------------------------------------------------------- returns, nacks


def test_mandatory_unroutable_returns_before_confirm() -> None:
    h = Harness()
    h.queue("q")
    ch = h.channel()
    t1 = h.publish(ch, "", "q", b"ok", mandatory=True)
    t2 = h.publish(ch, "amq.direct", "nobody", b"lost", {"message_id": "m"}, mandatory=True)
    t3 = h.publish(ch, "amq.direct", "nobody", b"quiet")  # not mandatory: no return
    effects = h.sync()
    returns = h.of_type(Return, effects)
    assert [(r.delivery_tag, r.reply_code, r.reason, r.message.body) for r in returns] == [
        (t2, 312, "NO_ROUTE", b"lost")
    ]
    assert returns[0].message.routing_key == "nobody" and returns[0].message.exchange == "amq.direct"
    idx_return = effects.index(returns[0])
    idx_confirm = next(i for i, e in enumerate(effects) if isinstance(e, Confirm) and e.delivery_tag >= t2)
    assert idx_return < idx_confirm
    assert h.acked(ch, t1) and h.acked(ch, t2) and h.acked(ch, t3)
    assert h.b.stats["returned"] == 1


def test_a_returned_publish_is_not_remembered_for_dedup() -> None:
    """A mandatory publish handed back (no queue yet) was not taken: its resend, once a
    queue is bound, must land, not be swallowed as a duplicate (a chaos run lost
    confirmed publishes this way)."""
    h = Harness(dedup_window_s=60)
    ch = h.channel()
    props = {"message_id": "m1"}
    t1 = h.publish(ch, "", "late", b"x", props, mandatory=True)
    effects = h.sync()
    assert [r.delivery_tag for r in h.of_type(Return, effects)] == [t1]
    h.queue("late")
    t2 = h.publish(ch, "", "late", b"x", props, mandatory=True)
    effects = h.sync()
    assert h.of_type(Return, effects) == [] and h.acked(ch, t2)
    assert h.ready_bodies("late") == [b"x"]
    # an unroutable publish that is not mandatory was taken (and dropped): its resend is one
    h.publish(ch, "", "nowhere", b"y", {"message_id": "m2"})
    h.sync()
    h.queue("nowhere")
    h.publish(ch, "", "nowhere", b"y", {"message_id": "m2"})
    h.sync()
    assert h.ready_bodies("nowhere") == []


def test_unknown_exchange_is_nacked_with_reason() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    h.publish(ch, "", "q")
    t = h.publish(ch, "no-such-exchange", "k")
    h.publish(ch, "", "q")
    effects = h.step()
    assert confirm_effects(effects, ch) == [
        Confirm(ch, 1, False, True, None),
        Confirm(ch, 2, False, False, "not_found: no exchange 'no-such-exchange'"),
        Confirm(ch, 3, False, True, None),
    ]
    assert h.nacked(ch, t)
    assert h.b.stats["nacked"] == 1


def test_nack_waits_behind_earlier_ack() -> None:
    h = Harness()
    h.queue("d")
    ch = h.channel()
    h.publish(ch, "", "d")
    h.publish(ch, "nope", "k")
    h.step()
    assert h.confirms.get(ch) is None  # the nack for tag 2 must not overtake tag 1
    h.sync()
    assert h.acked(ch, 1) and h.nacked(ch, 2)


def test_closed_channel_gets_no_confirms() -> None:
    h = Harness()
    h.queue("d")
    ch = h.channel()
    h.publish(ch, "", "d")
    h.step()
    h.b.close_channel(ch)
    effects = h.sync()
    assert confirm_effects(effects, ch) == []
    assert h.info("d")["messages_ready"] == 1  # the message itself was taken


# ------------------------------------------------------------- storage failure


def test_storage_failure_nacks_and_removes() -> None:
    h = Harness()
    h.queue("d")
    h.queue("t", durable=False)
    h.b.bind("amq.fanout", "d")
    h.b.bind("amq.fanout", "t")
    ch = h.channel()
    t_ok = h.publish(ch, "", "d", b"ok", {"message_id": "ok"})
    h.step()
    ok_lsn = h.b.last_lsn
    t_fail = h.publish(ch, "amq.fanout", "", b"fail", {"message_id": "m1"})
    t_after = h.publish(ch, "", "t", b"transient-queue")  # needs nothing
    h.step()
    h.b.durable(ok_lsn)
    h.b.storage_failed(ok_lsn + 1, h.b.last_lsn, "disk full")
    effects = h.step()
    assert h.acked(ch, t_ok)
    out = h.confirm_of(ch, t_fail)
    assert out is not None and out[0] is False and "disk full" in (out[1] or "")
    assert h.acked(ch, t_after)
    assert confirm_effects(effects, ch)[-1].delivery_tag == t_after
    # the failed message left both queues (also the non-durable one)
    assert h.ready_bodies("d") == [b"ok"]
    assert h.ready_bodies("t") == [b"transient-queue"]
    # later persistent publishes to durable queues are refused ...
    t_refused = h.publish(ch, "", "d", b"p")
    # ... transient ones and non-durable queues still work
    t_transient = h.publish(ch, "", "d", b"tr", TRANSIENT)
    t_nondurable = h.publish(ch, "", "t", b"nd")
    h.step()
    assert h.nacked(ch, t_refused)
    assert h.acked(ch, t_transient) and h.acked(ch, t_nondurable)
    assert h.ready_bodies("d") == [b"ok", b"tr"]
    # dedup forgot the failed id: the resend is taken
    h.b.storage_recovered()
    t_resend = h.publish(ch, "amq.fanout", "", b"fail", {"message_id": "m1"})
    t_dup_ok = h.publish(ch, "", "d", b"ok", {"message_id": "ok"})  # still deduplicated
    h.sync()
    assert h.acked(ch, t_resend) and h.acked(ch, t_dup_ok)
    assert h.ready_bodies("d") == [b"ok", b"tr", b"fail"]
    assert h.ready_bodies("t") == [b"transient-queue", b"nd", b"fail"]


def test_storage_failure_nacks_waiting_duplicates_too() -> None:
    h = Harness()
    h.queue("d")
    ch = h.channel()
    h.publish(ch, "", "d", b"1", {"message_id": "x"})
    h.publish(ch, "", "d", b"1", {"message_id": "x"})  # duplicate waits on the same LSN
    h.step()
    h.b.storage_failed(1, h.b.last_lsn, "io error")
    h.step()
    assert h.nacked(ch, 1) and h.nacked(ch, 2)
    assert h.info("d")["messages_ready"] == 0


# ----------------------------------------------------------------- dedup


def test_dedup_within_window_and_after() -> None:
    h = Harness(dedup_window_s=60)
    h.queue("q")
    ch = h.channel()
    props = {"message_id": "abc"}
    t1 = h.publish(ch, "", "q", b"1", props)
    t2 = h.publish(ch, "", "q", b"1", props)
    h.step()
    assert h.confirms.get(ch) is None  # the duplicate waits for the original's LSN too
    h.sync()
    assert h.acked(ch, t1) and h.acked(ch, t2)
    assert h.info("q")["messages_ready"] == 1
    assert h.b.stats["deduplicated"] == 1
    h.wall.now += 59
    t3 = h.publish(ch, "", "q", b"1", props)
    h.sync()
    assert h.acked(ch, t3) and h.info("q")["messages_ready"] == 1
    h.wall.now += 2  # 61 s after the first publish
    t4 = h.publish(ch, "", "q", b"1", props)
    h.sync()
    assert h.acked(ch, t4) and h.info("q")["messages_ready"] == 2


def test_dedup_is_per_exchange_and_needs_message_id() -> None:
    h = Harness()
    h.queue("q")
    h.b.bind("amq.direct", "q", "q")
    ch = h.channel()
    h.publish(ch, "", "q", b"1", {"message_id": "same"})
    h.publish(ch, "amq.direct", "q", b"2", {"message_id": "same"})
    h.publish(ch, "", "q", b"3")
    h.publish(ch, "", "q", b"4")
    h.sync()
    assert h.ready_bodies("q") == [b"1", b"2", b"3", b"4"]


def test_dedup_disabled_with_zero_window() -> None:
    h = Harness(dedup_window_s=0)
    h.queue("q", durable=False)
    ch = h.channel()
    h.publish(ch, "", "q", b"1", {"message_id": "m"})
    h.publish(ch, "", "q", b"1", {"message_id": "m"})
    h.step()
    assert h.info("q")["messages_ready"] == 2


def test_nacked_publish_is_not_remembered_for_dedup() -> None:
    """A nack tells the client to resend; the resend must not be swallowed as a duplicate."""
    h = Harness()
    h.queue("q", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch = h.channel()
    h.publish(ch, "", "q", b"first")
    t_full = h.publish(ch, "", "q", b"second", {"message_id": "m2"})
    h.sync()
    assert h.nacked(ch, t_full)
    ctag = h.b.consume(ch, "q")
    d = h.delivers(h.step())
    h.b.ack(ch, d[0].delivery_tag)
    h.b.cancel(ch, ctag)
    t_resend = h.publish(ch, "", "q", b"second", {"message_id": "m2"})
    h.sync()
    assert h.acked(ch, t_resend)
    assert h.ready_bodies("q") == [b"second"]


# -------------------------------------------------------------- overflow


def test_reject_publish_overflow() -> None:
    h = Harness()
    h.queue("small", arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    h.queue("big")
    h.b.bind("amq.fanout", "small")
    h.b.bind("amq.fanout", "big")
    ch = h.channel()
    tags = [h.publish(ch, "amq.fanout", "", bytes([i])) for i in range(3)]
    h.sync()
    assert h.acked(ch, tags[0]) and h.acked(ch, tags[1])
    out = h.confirm_of(ch, tags[2])
    assert out is not None and out[0] is False and "small" in (out[1] or "")
    assert h.ready_bodies("small") == [b"\x00", b"\x01"]
    assert h.ready_bodies("big") == [b"\x00", b"\x01", b"\x02"]  # queues with room keep it
    # unacked messages do not count against the limit
    c = h.b.consume(ch, "small")
    got = h.delivers(h.step())
    assert len(got) == 2
    h.b.cancel(ch, c)
    t = h.publish(ch, "", "small", b"fits")
    h.sync()
    assert h.acked(ch, t)


def test_drop_head_overflow() -> None:
    h = Harness()
    h.queue("q", arguments={"x-max-length": 2})
    ch = h.channel()
    for i in range(5):
        h.publish(ch, "", "q", bytes([i]))
    h.sync()
    assert all(h.acked(ch, t) for t in range(1, 6))
    assert h.ready_bodies("q") == [b"\x03", b"\x04"]
    assert sorted(settled_seqs(h)) == [1, 2, 3]  # dropped messages leave the log too


def test_drop_head_drops_requeued_head_first() -> None:
    h = Harness()
    h.queue("q", arguments={"x-max-length": 2})
    ch = h.channel()
    h.publish(ch, "", "q", b"a")
    h.publish(ch, "", "q", b"b")
    c = h.b.consume(ch, "q", prefetch=1)
    d = h.delivers(h.step())
    assert [x.message.body for x in d] == [b"a"]
    h.b.cancel(ch, c)
    h.b.nack(ch, d[0].delivery_tag, requeue=True)
    h.step()
    assert h.ready_bodies("q") == [b"a", b"b"]
    h.publish(ch, "", "q", b"c")
    h.step()
    assert h.ready_bodies("q") == [b"b", b"c"]


def test_max_length_zero_drops_everything() -> None:
    h = Harness()
    h.queue("q", arguments={"x-max-length": 0})
    ch = h.channel()
    h.publish(ch, "", "q")
    h.sync()
    assert h.acked(ch, 1)
    assert h.info("q")["messages"] == 0


# -------------------------------------------------------------------- TTL


def test_queue_ttl_drops_on_dequeue() -> None:
    h = Harness()
    h.queue("q", arguments={"x-message-ttl": 5000})
    ch = h.channel()
    h.publish(ch, "", "q", b"old")
    h.wall.now += 3
    h.publish(ch, "", "q", b"young")
    h.wall.now += 2.5  # old is 5.5 s old, young 2.5 s
    h.sync()
    c = h.b.consume(ch, "q")
    assert h.bodies(h.step()) == [b"young"]
    h.b.cancel(ch, c)
    assert settled_seqs(h) == [1]


def test_message_expiration_property() -> None:
    h = Harness()
    h.queue("q", arguments={"x-message-ttl": 10_000})
    ch = h.channel()
    h.publish(ch, "", "q", b"short", {"expiration": 1000})
    h.publish(ch, "", "q", b"long", {"expiration": 60_000})  # the queue TTL is shorter
    h.publish(ch, "", "q", b"none")
    h.wall.now += 2
    got = h.b.get("q", max_count=10)
    assert [g[1].entry.message.body for g in got] == [b"long", b"none"]
    h.b.nack_leases([g[0] for g in got])
    h.wall.now += 9
    assert h.b.get("q", max_count=10) == []
    h.step()
    assert h.info("q")["messages"] == 0


def test_expired_requeued_message_is_dropped() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    h.publish(ch, "", "q", b"m", {"expiration": 1000})
    (got,) = h.b.get("q")
    lid = got[0]
    h.wall.now += 5
    h.b.nack_leases([lid])
    assert h.b.get("q") == []


def test_returned_message_carries_its_data() -> None:
    h = Harness()
    ch = h.channel()
    props = {"content_type": "text/plain", "headers": {"a": 1}}
    h.publish(ch, "amq.topic", "x.y", b"body", props, mandatory=True)
    effects = h.step()
    (ret,) = h.of_type(Return, effects)
    assert ret.message.properties == props and ret.message.body == b"body"
    assert not h.of_type(Deliver, effects)


def test_rest_channel_publishes_and_stats() -> None:
    h = Harness()
    h.queue("q")
    t1 = h.publish(0, "", "q", b"rest")
    t2 = h.publish(0, "", "q", b"rest2", TRANSIENT)
    h.sync()
    assert (t1, t2) == (1, 2) and h.acked(0, 1) and h.acked(0, 2)
    h.b.close_channel(0)  # the REST channel cannot be closed
    assert 0 in h.b.channels
    totals = h.b.totals()
    assert totals["messages_ready"] == 2 and totals["channels"] == 0 and totals["queues"] == 1
    ch = h.channel()
    h.b.consume(ch, "q")
    (d1, d2) = h.delivers(h.step())
    h.b.ack(ch, d1.delivery_tag)
    h.b.nack(ch, d2.delivery_tag)
    h.step()
    stats = h.info("q")["message_stats"]
    assert stats == {"published": 2, "delivered": 3, "acked": 1, "redelivered": 1, "dead_lettered": {}}
    assert h.b.stats["published"] == 2 and h.b.stats["acked"] == 1 and h.b.stats["delivered"] == 3


def test_a_held_confirm_waits_for_its_answers_and_keeps_tag_order() -> None:
    """A cluster forwards a publish to its queues' owners: its confirm waits for their
    answers (``hold_confirm``), later tags wait behind it, a nack among the answers
    makes it a nack."""
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    assert h.publish(ch, "", "q") == 1
    held = h.b.hold_confirm(ch, 1, 2)  # also forwarded to two owners
    assert held == 1
    elsewhere = h.b.hold_confirm(ch, None, 1)  # reaches no queue here: a new tag
    assert elsewhere == 2
    assert h.publish(ch, "", "q") == 3
    assert confirm_effects(h.step(), ch) == []  # tag 1 waits, and 2 and 3 behind it
    h.b.settle_held_confirm(ch, 1, True, None)
    assert confirm_effects(h.step(), ch) == []
    h.b.settle_held_confirm(ch, 1, True, None)
    assert confirm_effects(h.step(), ch) == [Confirm(ch, 1, False, True, None)]
    h.b.settle_held_confirm(ch, 2, False, "queue_unavailable: node 'b' is down")
    assert confirm_effects(h.step(), ch) == [
        Confirm(ch, 2, False, False, "queue_unavailable: node 'b' is down"),
        Confirm(ch, 3, False, True, None),
    ]
    h.b.settle_held_confirm(ch, 2, True, None)  # a late answer changes nothing
    assert confirm_effects(h.step(), ch) == []


def test_a_held_confirm_of_a_closed_channel_is_forgotten() -> None:
    h = Harness()
    ch = h.channel()
    tag = h.b.hold_confirm(ch, None, 1)
    assert tag == 1
    h.b.close_channel(ch)
    h.step()
    h.b.settle_held_confirm(ch, 1, True, None)  # no error: the channel is gone
    assert confirm_effects(h.step(), ch) == []


def test_a_transaction_holds_no_forwarded_confirm() -> None:
    """A transactional channel's publishes are the transaction's: nothing is held for
    answers from elsewhere (a cluster does not forward them)."""
    h = Harness()
    ch = h.channel()
    h.b.tx_select(ch)
    assert h.b.hold_confirm(ch, None, 1) is None
    tag, _routed = h.b.publish(ch, "", "q", b"x")
    assert h.b.hold_confirm(ch, tag, 1) is None
