"""Confirms held from outside (``Broker.hold_confirms``: a replicated queue waits for
its majority), per-queue refusal (``refuse_queue``: below a majority) and messages
handed over by another copy of a queue (``restore_message``)."""

from __future__ import annotations

from broker.core import Deliver
from broker.core.records import RecordType

from .helpers import Harness, ready_entries


def test_a_held_lsn_keeps_its_ack_and_every_later_one_until_released() -> None:
    h = Harness()
    h.queue("q")
    ch = h.channel()
    h.publish(ch, "", "q")
    h.step()
    held = h.b.last_lsn
    h.b.hold_confirms([held])
    h.publish(ch, "", "q")
    h.sync()
    assert h.confirm_of(ch, 1) is None and h.confirm_of(ch, 2) is None
    h.b.release_held_confirms([held])
    h.step()
    assert h.acked(ch, 1) and h.acked(ch, 2)


def test_a_held_lsn_nacked_from_outside() -> None:
    h = Harness()
    h.queue("q")
    ch = h.channel()
    h.publish(ch, "", "q")
    h.step()
    h.b.hold_confirms([h.b.last_lsn])
    h.sync()
    h.b.nack_held_confirms([h.b.last_lsn], "no quorum")
    h.step()
    assert h.confirm_of(ch, 1) == (False, "no quorum")


def test_a_resend_deduplicated_against_a_nacked_but_kept_publish_waits_for_its_fate() -> None:
    """A replicated queue below its majority nacks the waiting publishes but keeps
    their messages (they may still reach a majority): a resend with the same message
    id is answered by the deduplication window and must not be acked from the local
    disk alone (a chaos run lost such resends when the leader then stepped down)."""
    h = Harness(dedup_window_s=60)
    h.queue("q")
    ch = h.channel()
    h.publish(ch, "", "q", b"m", {"message_id": "m1"})
    h.step()
    lsn = h.b.last_lsn
    h.b.hold_confirms([lsn])
    h.sync()
    h.b.nack_held_confirms([lsn], "no quorum", keep_held=True)
    h.step()
    assert h.confirm_of(ch, 1) == (False, "no quorum")
    h.publish(ch, "", "q", b"m", {"message_id": "m1"})  # the resend: a duplicate
    h.sync()
    assert h.confirm_of(ch, 2) is None  # waits: the original has no majority yet
    assert h.ready_bodies("q") == [b"m"]
    h.b.nack_held_confirms([lsn], "no quorum: leadership lost")  # it never will
    h.step()
    assert h.confirm_of(ch, 2) == (False, "no quorum: leadership lost")
    # the other fate: a kept publish that reaches its majority acks its resend
    h.publish(ch, "", "q", b"n", {"message_id": "m2"})
    h.step()
    lsn2 = h.b.last_lsn
    h.b.hold_confirms([lsn2])
    h.sync()
    h.b.nack_held_confirms([lsn2], "no quorum", keep_held=True)
    h.publish(ch, "", "q", b"n", {"message_id": "m2"})
    h.sync()
    assert h.confirm_of(ch, 3) == (False, "no quorum") and h.confirm_of(ch, 4) is None
    h.b.release_held_confirms([lsn2])
    h.step()
    assert h.acked(ch, 4)


def test_a_refused_queue_nacks_while_others_keep_the_message() -> None:
    h = Harness()
    h.queue("q")
    h.queue("r")
    h.b.declare_exchange("fan", "fanout")
    h.b.bind("fan", "q", "")
    h.b.bind("fan", "r", "")
    h.b.refuse_queue("q", "no quorum")
    ch = h.channel()
    h.publish(ch, "fan", "")
    h.sync()
    assert h.confirm_of(ch, 1) == (False, "no quorum")
    assert h.ready_bodies("q") == [] and h.ready_bodies("r") == [b"x"]
    h.b.refuse_queue("q", None)
    h.publish(ch, "fan", "")
    h.sync()
    assert h.acked(ch, 2) and h.ready_bodies("q") == [b"x"]


def test_a_restored_message_is_logged_redelivered_and_deduplicated() -> None:
    h = Harness()
    h.queue("q")
    h.b.restore_message("q", "ex", "k", b"m", {"message_id": "id-1"}, h.wall.now, deliveries=2)
    h.sync()
    types = [rtype for _lsn, rtype, _p in h.records]
    assert RecordType.ENQUEUE in types and RecordType.DELIVERED in types and RecordType.DELIVERY_COUNTS in types
    ch = h.channel()
    h.b.consume(ch, "q")
    effects = h.step()
    (deliver,) = [e for e in effects if isinstance(e, Deliver)]
    assert deliver.redelivered and deliver.message.body == b"m"
    # the same message id published again through its exchange is a duplicate
    h.b.declare_exchange("ex", "direct")
    h.b.bind("ex", "q", "k")
    h.publish(ch, "ex", "k", b"m", {"message_id": "id-1"})
    h.sync()
    assert h.acked(ch, 1)
    assert h.b.stats["deduplicated"] == 1


def test_held_deliveries_wait_for_their_bound_then_go_in_order() -> None:
    h = Harness()
    h.queue("q")
    ch = h.channel()
    for body in (b"a", b"b", b"c"):
        h.publish(ch, "", "q", body)
    h.sync()
    seqs = [e.message.seq for e in ready_entries(h.b, "q")]
    h.b.hold_deliveries("q", 0)
    consumer = h.channel()
    h.b.consume(consumer, "q")
    assert h.bodies(h.step(), consumer) == []
    assert h.b.get("q", 5, 30.0) == []  # REST gets wait too
    h.b.hold_deliveries("q", seqs[1])
    assert h.bodies(h.step(), consumer) == [b"a", b"b"]
    h.b.hold_deliveries("q", None)
    assert h.bodies(h.step(), consumer) == [b"c"]


def _held_both_ways(h: Harness) -> tuple[int, int]:
    """A publish to a queue here (its LSN held as a replicated queue's would be) that
    was also forwarded to one owner elsewhere (its tag held): (channel, LSN)."""
    h.queue("q")
    ch = h.channel()
    tag = h.publish(ch, "", "q")
    assert h.b.hold_confirm(ch, tag, 1) == tag
    h.step()
    lsn = h.b.last_lsn
    h.b.hold_confirms([lsn])
    h.sync()
    assert h.confirm_of(ch, 1) is None
    return ch, lsn


def test_a_confirm_held_by_lsn_and_by_tag_waits_for_both_in_either_order() -> None:
    h = Harness()
    ch, lsn = _held_both_ways(h)
    h.b.settle_held_confirm(ch, 1, True, None)  # the other owner acked
    h.step()
    assert h.confirm_of(ch, 1) is None  # the majority has not
    h.b.release_held_confirms([lsn])
    h.step()
    assert h.acked(ch, 1)

    h = Harness()
    ch, lsn = _held_both_ways(h)
    h.b.release_held_confirms([lsn])
    h.step()
    assert h.confirm_of(ch, 1) is None  # the other owner has not answered
    h.b.settle_held_confirm(ch, 1, True, None)
    h.step()
    assert h.acked(ch, 1)


def test_a_nack_from_either_hold_nacks_a_confirm_held_both_ways() -> None:
    h = Harness()
    ch, lsn = _held_both_ways(h)
    h.b.settle_held_confirm(ch, 1, False, "queue_unavailable: node 'b' is down")
    h.step()
    assert h.confirm_of(ch, 1) == (False, "queue_unavailable: node 'b' is down")
    h.b.release_held_confirms([lsn])  # late: changes nothing
    h.step()
    assert h.confirm_of(ch, 1) == (False, "queue_unavailable: node 'b' is down")

    h = Harness()
    ch, lsn = _held_both_ways(h)
    h.b.nack_held_confirms([lsn], "no quorum")
    h.step()
    assert h.confirm_of(ch, 1) is None  # still waits for the other owner's answer
    h.b.settle_held_confirm(ch, 1, True, None)
    h.step()
    assert h.confirm_of(ch, 1) == (False, "no quorum")


def test_a_queue_that_persists_every_message_logs_a_transient_publish_as_persistent() -> None:
    h = Harness()
    h.queue("q")
    h.queue("plain")
    ch = h.channel()
    h.publish(ch, "", "plain", b"t", {"delivery_mode": 1})
    h.sync()
    assert not [r for r in h.records if r[1] == RecordType.ENQUEUE]  # transient: not logged
    h.b.persist_messages("q")
    props = {"delivery_mode": 1}
    h.publish(ch, "", "q", b"t", props)
    h.sync()
    assert [r for r in h.records if r[1] == RecordType.ENQUEUE]
    assert props == {"delivery_mode": 1}  # the caller's properties are left alone
    assert h.acked(ch, 2)
    (entry,) = ready_entries(h.b, "q")
    assert entry.message.persistent and entry.message.properties["delivery_mode"] == 2
    h.b.persist_messages("q", False)
    h.publish(ch, "", "q", b"t", {"delivery_mode": 1})
    h.sync()
    assert len([r for r in h.records if r[1] == RecordType.ENQUEUE]) == 1


def test_a_restored_message_with_a_due_time_is_held_back_until_then() -> None:
    h = Harness()
    h.queue("q")
    h.b.restore_message("q", "", "q", b"later", None, h.wall.now, due=h.wall.now + 30)
    h.b.restore_message("q", "", "q", b"now", None, h.wall.now)
    h.sync()
    assert RecordType.MOVE in [rtype for _lsn, rtype, _p in h.records]  # the due time is logged
    ch = h.channel()
    h.b.consume(ch, "q")
    assert h.bodies(h.step(), ch) == [b"now"]
    assert h.bodies(h.sleep(29), ch) == []
    assert h.bodies(h.sleep(2), ch) == [b"later"]
