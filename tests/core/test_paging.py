"""Paging: a durable queue's backlog beyond its in-memory head is kept as an index of
LSNs and read back from the log when its turn comes (core/paging.py)."""

from __future__ import annotations

from array import array

import pytest

from broker.core import MessageLost
from broker.core.paging import CHUNK_MESSAGES, PagedRefs, locator, on_disk_mask
from broker.core.records import (
    RecordType,
    decode_enqueue,
    decode_refs,
    decode_seqs,
    encode_refs,
    ref_lsns,
)

from .durable_view import durable_view, fresh_broker, replay_into
from .helpers import Harness, ready_entries

# ------------------------------------------------------------------ PagedRefs


def test_paged_refs_fifo_across_chunks() -> None:
    p = PagedRefs()
    n = CHUNK_MESSAGES * 2 + 5
    for i in range(n):
        p.append(i, locator(1000 + i, i % 3 == 0))
    assert len(p) == n
    got = p.take(3) + p.take(CHUNK_MESSAGES) + p.take(n)
    assert got == [(i, ((1000 + i) << 1) | (i % 3 == 0)) for i in range(n)]
    assert len(p) == 0 and not p and p.take(5) == []
    p.append(7, locator(9, False))  # usable again after running empty
    assert list(p) == [(7, 18)]


def test_paged_refs_cut_is_unaffected_by_later_changes() -> None:
    p = PagedRefs()
    for i in range(10):
        p.append(i, locator(i, False))
    p.take(4)
    cut = p.cut()
    p.take(3)
    for i in range(10, 20):
        p.append(i, locator(i, False))
    seen = [seq for chunk, start, stop in cut for seq in chunk[start:stop:2]]
    assert seen == list(range(4, 10))


def test_paged_refs_clear_returns_seqs() -> None:
    p = PagedRefs()
    for i in range(5):
        p.append(i, locator(i, False))
    p.take(2)
    assert p.clear() == [2, 3, 4] and len(p) == 0


def test_refs_record_round_trip_and_malformed() -> None:
    pairs = array("q", [5, locator(40, True), 6, locator(41, False)])
    qid, back = decode_refs(encode_refs(3, pairs))
    assert qid == 3 and back == pairs
    assert list(ref_lsns(RecordType.QUEUE_REFS, encode_refs(3, pairs))) == [40, 41]
    with pytest.raises(ValueError):
        decode_refs(encode_refs(3, pairs)[:-1])
    with pytest.raises(ValueError):
        decode_refs(b"\x00")


# ------------------------------------------------------------------ broker


def paging_harness(memory: int = 2, *, repair: bool = False) -> Harness:
    h = Harness(memory_messages_per_queue=memory, repair=repair)
    h.queue("q")
    h.step()
    return h


def publish_n(h: Harness, n: int, start: int = 0, props: dict | None = None) -> None:
    ch = h.channel()
    for i in range(start, start + n):
        h.publish(ch, "", "q", b"m%d" % i, props)


def test_backlog_beyond_the_head_is_paged_out_once_durable() -> None:
    h = paging_harness()
    publish_n(h, 10)
    h.step()
    q = h.b.queues["q"]
    assert len(q.lanes[0].ready) == 2 and len(q.lanes[0].tail) == 8 and not q.lanes[0].paged  # records not yet written
    h.b.durable(h.b.last_lsn)
    assert len(q.lanes[0].ready) == 2 and len(q.lanes[0].paged) == 8 and not q.lanes[0].tail
    assert q.ready_count() == 10 and h.info("q")["messages_ready"] == 10
    # each paged-out message is indexed by its ENQUEUE record's LSN
    for seq, loc in q.lanes[0].paged:
        rtype, payload = h.log[loc >> 1]
        assert rtype == RecordType.ENQUEUE
    # later publishes join the tail and are paged out in turn
    publish_n(h, 3, 10)
    h.sync()
    assert len(q.lanes[0].paged) == 11 and not q.lanes[0].tail


def test_consumer_gets_paged_out_messages_in_order_with_bodies() -> None:
    h = paging_harness()
    publish_n(h, 25)
    h.sync()
    ch = h.channel()
    h.b.consume(ch, "q", prefetch=0, no_ack=True)
    assert h.bodies(h.step()) == [b"m%d" % i for i in range(25)]
    assert h.b.queues["q"].ready_count() == 0


def test_unwritten_and_transient_messages_stay_in_memory() -> None:
    h = paging_harness()
    publish_n(h, 4)
    h.sync()
    publish_n(h, 2, 4, {"delivery_mode": 1})  # transient: no record to read back
    publish_n(h, 3, 6)
    h.sync()
    q = h.b.queues["q"]
    assert len(q.lanes[0].paged) == 2 and len(q.lanes[0].tail) == 5  # paging stops at the transient one
    ch = h.channel()
    h.b.consume(ch, "q", prefetch=0, no_ack=True)
    assert h.bodies(h.step()) == [b"m%d" % i for i in range(9)]


def test_unreadable_record_is_reported_lost_and_settled() -> None:
    # Only with --repair: without it the message is kept (tests/core/test_read_failures.py)
    h = paging_harness(repair=True)
    publish_n(h, 6)
    h.sync()
    q = h.b.queues["q"]
    (seq, loc), *_ = list(q.lanes[0].paged)
    del h.log[loc >> 1]  # as if its segment were damaged
    ch = h.channel()
    h.b.consume(ch, "q", prefetch=0, no_ack=True)
    effects = h.step()
    assert h.bodies(effects) == [b"m%d" % i for i in range(6) if i != 2]
    (lost,) = h.of_type(MessageLost, effects)
    assert (lost.queue, lost.seq, lost.lsn) == ("q", seq, loc >> 1) and "not in the log" in lost.reason
    settled = [s for _l, t, p in h.records if t == RecordType.SETTLE for s in decode_seqs(p)[1]]
    assert seq in settled  # it does not come back after a restart either


def test_record_of_another_message_is_not_delivered_in_its_place() -> None:
    # (with --repair it is given up; without, kept and retried: see below)
    h = paging_harness(repair=True)
    publish_n(h, 4)
    h.sync()
    q = h.b.queues["q"]
    (seq_a, loc_a), (seq_b, loc_b) = list(q.lanes[0].paged)
    h.log[loc_a >> 1] = h.log[loc_b >> 1]
    ch = h.channel()
    h.b.consume(ch, "q", prefetch=0, no_ack=True)
    effects = h.step()
    assert h.bodies(effects) == [b"m0", b"m1", b"m3"]
    (lost,) = h.of_type(MessageLost, effects)
    assert lost.seq == seq_a and f"holds message {seq_b}" in lost.reason


def test_drop_head_and_purge_settle_paged_out_messages_without_reading_them() -> None:
    h = Harness(memory_messages_per_queue=2)
    h.queue("q", arguments={"x-max-length": 5})
    h.step()
    publish_n(h, 5)
    h.sync()
    q = h.b.queues["q"]
    assert len(q.lanes[0].paged) == 3
    reads: list[int] = []
    real = h.b.read_log
    assert real is not None
    h.b.read_log = lambda lsns: reads.extend(lsns) or real(lsns)  # type: ignore[func-returns-value]
    publish_n(h, 3, 5)  # drops the 3 oldest
    h.sync()
    assert q.ready_count() == 5
    assert h.b.purge_queue("q") == 5
    h.step()
    assert reads == []
    settled = sorted(s for _l, t, p in h.records if t == RecordType.SETTLE for s in decode_seqs(p)[1])
    assert settled == list(range(1, 9))
    nb = replay_into(fresh_broker(h), h.records, h.b.last_lsn)
    assert nb.queues["q"].ready_count() == 0


def test_snapshot_refers_to_records_and_rebuilds_the_same_queue() -> None:
    h = paging_harness()
    publish_n(h, 30)
    h.sync()
    ch = h.channel()
    h.b.consume(ch, "q", prefetch=3)
    h.step()  # three delivered and unacked, the head refilled from the log
    live = durable_view(h.b)
    covered, chunks = h.b.snapshot(chunk_entries=4)
    recs = [(0, t, p) for chunk in chunks for t, p in chunk]
    assert not [p for _l, t, p in recs if t == RecordType.ENQUEUE], "a body was copied"
    assert [p for _l, t, p in recs if t == RecordType.QUEUE_REFS]
    nb = replay_into(fresh_broker(h), recs, covered)
    assert durable_view(nb) == live
    # the log after the snapshot replays on top of it
    publish_n(h, 5, 30)
    h.sync()
    nb2 = replay_into(fresh_broker(h), recs + [r for r in h.records if r[0] > covered], h.b.last_lsn)
    assert durable_view(nb2) == durable_view(h.b)
    assert [e.message.body for e in ready_entries(nb2, "q")][-5:] == [b"m%d" % i for i in range(30, 35)]


def test_checkpoint_of_an_older_format_keeps_its_messages_whole_and_in_order() -> None:
    """Checkpoints written before QUEUE_REFS hold messages whole (ENQUEUE records
    replayed with LSN 0): they stay in memory, and the log's messages after them stay
    paged out behind them; one indexed by LSN that precedes a whole one is read back
    at once so that the queue keeps sequence order."""
    from broker.core.records import encode_enqueue, encode_json, encode_seqs

    h = paging_harness()
    qid = h.b.queues["q"].qid
    publish_n(h, 3, 10)  # logged publishes: seqs 1..3 (bodies m10..m12)
    h.sync()
    logged = [(lsn, t, p) for lsn, t, p in h.records if t == RecordType.ENQUEUE]
    old_checkpoint = [
        (0, RecordType.DECLARE_QUEUE, encode_json({"qid": qid, "name": "q", "auto_delete": False, "arguments": {}})),
        # whole messages, seqs 5 and 7, around the logged 6 (the logged records are
        # renumbered below to interleave with them)
        (0, RecordType.ENQUEUE, encode_enqueue(5, 0.0, None, [qid], "", "q", None, None, b"whole5")),
        (0, RecordType.ENQUEUE, encode_enqueue(7, 0.0, None, [qid], "", "q", None, None, b"whole7")),
        (0, RecordType.DELIVERED, encode_seqs(qid, [7])),
    ]
    # the log after that checkpoint: logged messages with seqs 6 and 8
    renumbered = []
    for (lsn, t, p), seq in zip(logged, (6, 8, 9)):
        r = decode_enqueue(p)
        payload = encode_enqueue(seq, r.wall_s, None, [qid], "", "q", None, None, r.body)
        h.log[lsn] = (t, payload)
        renumbered.append((lsn, t, payload))
    nb = replay_into(fresh_broker(h), old_checkpoint + renumbered, h.b.last_lsn)
    q = nb.queues["q"]
    # whole ones (and seq 6, read back to stay between them) in memory, 8 and 9 paged
    assert [e.message.seq for e in q.lanes[0].ready] == [5, 6, 7]
    assert [seq for seq, _loc in q.lanes[0].paged] == [8, 9]
    assert [e.message.body for e in ready_entries(nb, "q")] == [b"whole5", b"m10", b"whole7", b"m11", b"m12"]
    assert [e.delivered for e in q.lanes[0].ready] == [False, False, True]
    # and the next checkpoint still carries the whole ones whole
    _covered, chunks = nb.snapshot()
    recs = [(t, p) for chunk in chunks for t, p in chunk]
    whole = [decode_enqueue(p).seq for t, p in recs if t == RecordType.ENQUEUE]
    assert whole == [5, 7]


# ------------------------------------------------------------------ compaction


def enqueue_lsns(h: Harness) -> dict[int, int]:
    """seq -> LSN of the newest ENQUEUE record for it."""
    out = {}
    for lsn, rtype, payload in h.records:
        if rtype == RecordType.ENQUEUE:
            out[decode_enqueue(payload).seq] = lsn
    return out


def test_relocate_logs_queued_messages_again_and_switches_once_written() -> None:
    h = Harness(memory_messages_per_queue=2)
    h.queue("q")
    h.queue("other")
    h.b.bind("amq.fanout", "q")
    h.b.bind("amq.fanout", "other")
    h.step()
    ch = h.channel()
    for i in range(10):
        h.publish(ch, "amq.fanout", "", b"m%d" % i, {"message_id": "id%d" % i})
    h.sync()
    h.b.purge_queue("other")  # "other" no longer holds them: the copies are for "q" only
    cons = h.channel()
    h.b.consume(cons, "q", prefetch=1)
    h.step()  # m0 delivered and unacked; m1 in memory; m2.. paged out
    q = h.b.queues["q"]
    before = enqueue_lsns(h)
    old_paged = list(q.lanes[0].paged)
    end = h.b.last_lsn + 1
    assert h.b.relocate([(1, end)]) == 10
    assert list(q.lanes[0].paged) == old_paged  # not switched before the copies are written
    h.step()
    copies = [(lsn, decode_enqueue(p)) for lsn, t, p in h.records if lsn >= end and t == RecordType.ENQUEUE]
    assert [r.seq for _l, r in copies] == sorted(before)
    for _lsn, r in copies:
        assert r.qids == [q.qid] and r.message_id is None  # the window is left alone
        assert r.properties is not None and r.properties["message_id"] == "id%d" % (r.seq - 1)
    h.b.durable(h.b.last_lsn)
    new = {r.seq: lsn for lsn, r in copies}
    assert [loc >> 1 for _s, loc in q.lanes[0].paged] == [new[s] for s, _l in q.lanes[0].paged]
    # a restart replaying the log ends up pointing at the copies...
    view = durable_view(h.b)
    nb = replay_into(fresh_broker(h), h.records, h.b.last_lsn)
    assert [loc >> 1 for _s, loc in nb.queues["q"].lanes[0].paged] == sorted(new.values())
    # ...and the old records can go (the old segment, after the next checkpoint)
    for lsn in list(h.log):
        if lsn < end:
            del h.log[lsn]
    assert durable_view(nb) == view
    h.b.consume(h.channel(), "q", prefetch=0, no_ack=True)
    assert h.bodies(h.step()) == [b"m%d" % i for i in range(1, 10)]
    assert not h.of_type(MessageLost)


def test_relocated_copy_that_fails_to_write_is_never_used() -> None:
    h = paging_harness()
    publish_n(h, 6)
    h.sync()
    q = h.b.queues["q"]
    old = list(q.lanes[0].paged)
    first = h.b.last_lsn + 1
    assert h.b.relocate([(1, first)]) == 6
    h.step()
    h.b.storage_failed(first, h.b.last_lsn, "disk full")
    h.b.storage_recovered()
    publish_n(h, 1, 6)
    h.sync()  # later records durable: the failed copies must not be switched to
    assert list(q.lanes[0].paged)[: len(old)] == old
    h.b.consume(h.channel(), "q", prefetch=0, no_ack=True)
    assert h.bodies(h.step()) == [b"m%d" % i for i in range(7)]


def test_snapshot_after_relocation_refers_to_the_copies() -> None:
    h = paging_harness()
    publish_n(h, 12)
    h.sync()
    end = h.b.last_lsn + 1
    h.b.relocate([(1, end)])
    h.sync()
    live = durable_view(h.b)
    covered, chunks = h.b.snapshot(chunk_entries=5)
    recs = [(0, t, p) for chunk in chunks for t, p in chunk]
    refs = [lsn for _l, t, p in recs if t == RecordType.QUEUE_REFS for lsn in ref_lsns(t, p)]
    assert refs and min(refs) >= end
    for lsn in list(h.log):
        if lsn < end:
            del h.log[lsn]  # the compacted segment deleted
    nb = replay_into(fresh_broker(h), recs, covered)
    assert durable_view(nb) == live


def test_without_repair_a_record_of_another_message_keeps_the_queue_waiting() -> None:
    h = paging_harness()
    publish_n(h, 4)
    h.sync()
    q = h.b.queues["q"]
    (seq_a, loc_a), (seq_b, loc_b) = list(q.lanes[0].paged)
    h.log[loc_a >> 1] = h.log[loc_b >> 1]
    ch = h.channel()
    h.b.consume(ch, "q", prefetch=0, no_ack=True)
    effects = h.step()
    assert h.bodies(effects) == [b"m0", b"m1"]  # m3 waits behind m2: order is kept
    assert not h.of_type(MessageLost, effects)
    assert list(q.lanes[0].paged) == [(seq_a, loc_a), (seq_b, loc_b)] and q.read_failure is not None


def test_on_disk_mask_tells_references_outside_the_logs_ranges() -> None:
    spans = [(1, 11), (21, 31)]  # LSNs 11..20 are in a deleted segment, 31.. never written
    inside = array("q", [locator(lsn, False) for lsn in (1, 5, 10)])
    assert on_disk_mask(inside, spans) is None
    across_the_gap = array("q", [locator(lsn, True) for lsn in (3, 25, 30)])
    assert on_disk_mask(across_the_gap, spans) is None  # every one is on disk
    mixed = array("q", [locator(lsn, False) for lsn in (3, 15, 25, 31, 40)])
    assert on_disk_mask(mixed, spans) == bytes([1, 0, 1, 0, 0])
    assert on_disk_mask(mixed, []) == bytes(5)
    assert on_disk_mask(array("q"), spans) is None
