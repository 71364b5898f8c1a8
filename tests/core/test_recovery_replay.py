"""Log replay and snapshots: a fresh broker fed the records must equal the live state."""

from __future__ import annotations

import random
from typing import Any

import pytest

from broker.core import Broker, Deliver
from broker.core.records import RecordType, decode_enqueue

from .durable_view import (
    durable_view,
    fresh_broker,
    live_entries,
    replay_into,
    restart_from_log,
)
from .helpers import Harness, ready_entries

TRANSIENT = {"delivery_mode": 1}


def build_state(h: Harness) -> dict[str, Any]:
    """A broker with a bit of everything; returns handles used by the tests."""
    b = h.b
    b.declare_exchange("topic", "topic")
    b.declare_exchange("hdr", "headers", arguments={"note": "x"})
    b.declare_exchange("fan", "fanout")
    b.declare_exchange("tmp", "fanout", durable=False)
    b.declare_exchange("ad", "direct", auto_delete=True)
    b.declare_exchange("gone", "direct")
    h.queue("orders", arguments={"x-max-length": 100})
    h.queue("audit")
    h.queue("ttl", arguments={"x-message-ttl": 60_000})
    h.queue("scratch", durable=False)
    h.queue("doomed")
    h.queue("renamed")
    ch = h.channel()
    b.declare_queue("mine", exclusive=True, channel_id=ch)
    b.bind("topic", "orders", "order.*")
    b.bind("topic", "audit", "#")
    b.bind("topic", "scratch", "#")
    b.bind("hdr", "audit", "", {"x-match": "any", "kind": "audit", "level": None})
    b.bind("fan", "topic", "order.new", to_exchange=True)  # e2e, durable both ends
    b.bind("fan", "tmp", to_exchange=True)  # to a transient exchange: not logged
    b.bind("ad", "audit", "k")
    b.bind("ad", "orders", "k")
    b.bind("gone", "audit", "g")
    b.bind("amq.direct", "ttl", "t")
    b.bind("amq.direct", "doomed", "d")
    b.bind("topic", "mine", "#", channel_id=ch)
    for i in range(6):
        h.publish(ch, "topic", f"order.{i}", f"o{i}".encode(), {"message_id": f"id{i}", "headers": {"i": i}})
    h.publish(ch, "topic", "order.t", b"transient", TRANSIENT)
    h.publish(ch, "fan", "", b"via-fan")
    h.publish(ch, "hdr", "", b"hdr", {"headers": {"level": 3}})
    h.publish(ch, "amq.direct", "t", b"ttl1", {"expiration": 30_000})
    h.publish(ch, "amq.direct", "t", b"ttl2")
    h.publish(ch, "amq.direct", "d", b"dd")
    h.publish(ch, "", "renamed", b"old-renamed")
    h.sync()
    # consumers: some acked, some unacked, some requeued
    cons = h.channel()
    b.consume(cons, "orders", consumer_tag="oc", prefetch=4)
    got = h.delivers(h.step(), cons)
    assert [d.message.body for d in got] == [b"o0", b"o1", b"o2", b"o3"]
    b.ack(cons, got[0].delivery_tag)
    b.nack(cons, got[1].delivery_tag, requeue=True)  # back at the head, redelivered
    b.reject(cons, got[2].delivery_tag, requeue=False)  # gone
    # got[3] stays unacked; the requeued o1 goes out again to the same consumer
    redo = h.delivers(h.step(), cons)
    b.cancel(cons, "oc")
    # REST leases
    leases = b.get("audit", max_count=3)
    b.ack_leases([leases[0][0]])
    b.nack_leases([leases[1][0]])  # requeued, delivered flag set
    # leases[2] stays out
    b.purge_queue("scratch")
    b.unbind("ad", "audit", "k")
    b.unbind("ad", "orders", "k")  # last binding: "ad" auto-deletes
    assert "ad" not in b.exchanges
    b.delete_exchange("gone")
    b.delete_queue("doomed")
    b.delete_queue("renamed")
    h.queue("renamed", arguments={"x-max-length": 5})  # same name, new queue
    h.publish(ch, "", "renamed", b"new-renamed")
    h.publish(ch, "", "orders", b"no-ack-me")
    h.sync()
    return {"ch": ch, "cons": cons, "unacked": got[3], "redo": redo, "lease": leases[2]}


def test_log_replay_rebuilds_durable_state() -> None:
    h = Harness()
    handles = build_state(h)
    live = durable_view(h.b)
    # sanity: the scenario really contains what the comparison is about
    assert "tmp" not in live["exchanges"] and "ad" not in live["exchanges"]
    assert "scratch" not in live["queues"] and "mine" not in live["queues"]
    assert any(m[5] for m in live["messages"]["orders"])  # delivered-unacked / requeued
    assert [m[1] for m in live["messages"]["renamed"]] == [b"new-renamed"]
    assert ("fan", "x", "topic", "order.new", ()) in live["bindings"]
    assert handles["unacked"].delivery_tag
    for twice in (False, True):
        h.step()
        nb = replay_into(fresh_broker(h), h.records, h.records[-1][0], twice=twice)
        assert durable_view(nb) == live


def test_replayed_broker_redelivers_and_continues() -> None:
    h = Harness()
    build_state(h)
    expected = [
        (e.message.body, e.delivered) for e in live_entries(h.b, "orders") if e.message.persistent
    ]
    nb = restart_from_log(h)
    assert nb.last_lsn == h.records[-1][0] and nb.durable_lsn == nb.last_lsn
    h2 = Harness()
    h2.b = nb  # drive the recovered broker with the harness checks
    h2.records = list(h.records)
    h2.wall, h2.mono = h.wall, h.mono  # type: ignore[assignment]
    ch = nb.open_channel()
    nb.consume(ch, "orders", consumer_tag="again")
    got = h2.delivers(h2.step())
    # o1 (requeued), o3..o5 (unacked at the crash), the rest never delivered; the
    # transient message did not survive
    assert expected == [(b"o1", True), (b"o3", True), (b"o4", True), (b"o5", True), (b"no-ack-me", False)]
    assert [(d.message.body, d.redelivered) for d in got] == expected
    # new records continue the LSN sequence
    nb.ack(ch, 0, multiple=True)
    h2.step()
    assert h2.records[-1][0] > h.records[-1][0]
    seqs = [d.message.seq for d in got]
    tag, _ = nb.publish(ch, "", "orders", b"after")
    assert ready_entries(nb, "orders")[-1].message.seq > max(seqs)
    h2.sync()
    assert h2.acked(ch, tag)


def test_dedup_window_survives_log_replay() -> None:
    h = Harness(dedup_window_s=100)
    build_state(h)
    nb = restart_from_log(h, dedup_window_s=100)
    before = durable_view(nb)
    ch = nb.open_channel()
    nb.publish(ch, "topic", "order.9", b"dup", {"message_id": "id3"})
    nb.take_effects()
    assert durable_view(nb) == before
    h.wall.now += 101
    nb2 = restart_from_log(h, dedup_window_s=100)
    ch = nb2.open_channel()
    nb2.publish(ch, "topic", "order.9", b"dup", {"message_id": "id3"})
    assert len(ready_entries(nb2, "orders")) == len(ready_entries(nb, "orders")) + 1


def test_replay_remembers_only_the_publishes_still_inside_the_window() -> None:
    """A restart after a pause: publishes older than the window are not loaded into it
    at all (they would only be pruned again), the recent ones are."""
    h = Harness(dedup_window_s=100)
    h.queue("q")
    ch = h.channel()
    h.publish(ch, "", "q", b"old", {"message_id": "old"})
    h.wall.now += 60
    h.publish(ch, "", "q", b"new", {"message_id": "new"})
    h.sync()
    h.wall.now += 70  # "old" is 130 s old, "new" 70 s
    nb = restart_from_log(h, dedup_window_s=100)
    assert len(nb.dedup) == 1
    assert nb.dedup.lookup("", "old", h.wall.now) is None
    assert nb.dedup.lookup("", "new", h.wall.now) is not None
    assert [e.message.body for e in ready_entries(nb, "q")] == [b"old", b"new"]


def test_nacked_publish_not_deduplicated_after_restart() -> None:
    h = Harness()
    h.queue("full", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    h.queue("roomy")
    h.b.bind("amq.fanout", "full")
    h.b.bind("amq.fanout", "roomy")
    ch = h.channel()
    h.publish(ch, "amq.fanout", "", b"1")
    t = h.publish(ch, "amq.fanout", "", b"2", {"message_id": "resend-me"})
    h.sync()
    assert h.nacked(ch, t)
    nb = restart_from_log(h)
    nb.purge_queue("full")
    ch2 = nb.open_channel()
    nb.publish(ch2, "amq.fanout", "", b"2", {"message_id": "resend-me"})
    assert [e.message.body for e in ready_entries(nb, "full")] == [b"2"]


def test_transient_things_never_produce_records() -> None:
    h = Harness()
    h.queue("t", durable=False)
    h.queue("d")
    h.b.declare_exchange("tx", "fanout", durable=False)
    h.b.bind("tx", "t")
    h.b.bind("tx", "d")
    h.b.bind("amq.topic", "t", "#")
    h.step()
    base = len(h.records)
    assert [r[1] for r in h.records] == [RecordType.DECLARE_QUEUE]  # only "d"
    ch = h.channel()
    for i in range(3):
        h.publish(ch, "tx", "", bytes([i]), TRANSIENT)
        h.publish(ch, "", "t", bytes([i]))  # persistent message, transient queue
    c = h.b.consume(ch, "d")
    h.b.consume(ch, "t")
    got = h.delivers(h.step())
    for d in got:
        h.b.ack(ch, d.delivery_tag)
    h.b.cancel(ch, c)
    h.publish(ch, "tx", "", b"x", TRANSIENT)
    h.b.purge_queue("d")
    h.b.unbind("amq.topic", "t", "#")
    h.b.delete_queue("t")
    h.b.delete_exchange("tx")
    h.step()
    assert len(h.records) == base
    # and the confirms needed no durability
    assert h.confirms[ch].last == 7


def test_enqueue_record_contents() -> None:
    h = Harness()
    h.queue("a")
    h.queue("b")
    h.queue("t", durable=False)
    for q in "abt":
        h.b.bind("amq.topic", q, "k.#")
    ch = h.channel()
    props = {"message_id": "m", "expiration": 5000, "headers": {"h": [1, 2]}, "content_type": "x/y"}
    h.publish(ch, "amq.topic", "k.1", b"\x00\xffbody", props)
    h.step()
    (enq,) = [r for r in h.records if r[1] == RecordType.ENQUEUE]
    rec = decode_enqueue(enq[2])
    assert sorted(rec.qids) == sorted([h.b.queues["a"].qid, h.b.queues["b"].qid])
    assert (rec.exchange, rec.routing_key, rec.message_id, rec.body) == ("amq.topic", "k.1", "m", b"\x00\xffbody")
    assert rec.properties == props
    assert rec.wall_s == h.wall.now and rec.expires_at == h.wall.now + 5


# ------------------------------------------------------------------ snapshots


def snapshot_records(b: Broker, chunk_entries: int = 3) -> tuple[int, list[tuple[int, int, bytes]]]:
    lsn, chunks = b.snapshot(chunk_entries)
    return lsn, [(0, rtype, payload) for chunk in chunks for rtype, payload in chunk]


def test_snapshot_alone_rebuilds_state() -> None:
    h = Harness()
    build_state(h)
    h.step()
    live = durable_view(h.b)
    covered, recs = snapshot_records(h.b)
    assert covered == h.records[-1][0]
    nb = replay_into(fresh_broker(h), recs, covered)
    assert durable_view(nb) == live
    # a message routed to two queues is still stored once after recovery: both queues
    # index it by the LSN of the same ENQUEUE record (paged out, its body on disk only)
    shared = {seq: loc >> 1 for seq, loc in nb.queues["audit"].lanes[0].paged}
    for seq, loc in nb.queues["orders"].lanes[0].paged:
        if seq in shared:
            assert loc >> 1 == shared[seq]
            break
    else:
        pytest.fail("no message shared by orders and audit")
    assert not nb.queues["orders"].lanes[0].ready and not nb.queues["orders"].lanes[0].tail
    # snapshot + the log after it is the same as well (nothing after it here)
    nb2 = replay_into(fresh_broker(h), recs + [r for r in h.records if r[0] > covered], covered)
    assert durable_view(nb2) == live
    # the snapshot keeps the counters going and the dedup window
    assert nb.store.counters() == h.b.store.counters()
    assert sorted(nb.dedup.digests()) == sorted(h.b.dedup.digests())


def test_snapshot_then_log() -> None:
    h = Harness()
    build_state(h)
    h.step()
    covered, recs = snapshot_records(h.b)
    # more work after the checkpoint
    ch = h.channel()
    h.publish(ch, "topic", "order.late", b"late")
    h.b.delete_queue("ttl")
    h.queue("ttl")
    h.b.consume(ch, "audit", prefetch=2)
    h.sync()
    live = durable_view(h.b)
    tail = [r for r in h.records if r[0] > covered]
    assert tail
    nb = replay_into(fresh_broker(h), recs + tail, h.records[-1][0])
    assert durable_view(nb) == live


class Mutator:
    """Random but valid operations on a built state (used between snapshot chunks)."""

    def __init__(self, h: Harness, rng: random.Random) -> None:
        self.h = h
        self.rng = rng
        self.ch = h.channel()
        self.cons = h.channel()
        self.n = 0
        self.extra_queues: list[str] = []

    def durable_queues(self) -> list[str]:
        return sorted(n for n, q in self.h.b.queues.items() if q.persistent_log)

    def step(self) -> None:
        h, b, rng = self.h, self.h.b, self.rng
        self.n += 1
        op = rng.randrange(10)
        queues = self.durable_queues()
        if op <= 2 and queues:
            h.publish(self.ch, "", rng.choice(queues), f"m{self.n}".encode(),
                      {"message_id": f"f{self.n}"} if rng.random() < 0.5 else None)
        elif op == 3:
            h.publish(self.ch, "topic", f"order.{self.n}", f"t{self.n}".encode())
        elif op == 4 and queues:
            q = rng.choice(queues)
            tag = f"c{self.n}"
            b.consume(self.cons, q, consumer_tag=tag, prefetch=rng.randint(1, 3))
            h.step()
            b.cancel(self.cons, tag)
        elif op == 5 and b.channels[self.cons].deliveries:
            t = rng.choice(list(b.channels[self.cons].deliveries))
            if rng.random() < 0.5:
                b.ack(self.cons, t, multiple=rng.random() < 0.3)
            else:
                b.nack(self.cons, t, requeue=rng.random() < 0.7)
        elif op == 6 and queues:
            got = b.get(rng.choice(queues), max_count=2)
            if got and rng.random() < 0.5:
                b.ack_leases([got[0][0]])
        elif op == 7:
            name = f"new{self.n}"
            h.queue(name, durable=rng.random() < 0.8)
            if "topic" in b.exchanges:
                b.bind("topic", name, "#")
            self.extra_queues.append(name)
        elif op == 8 and queues:
            victim = rng.choice(queues)
            b.delete_queue(victim)
            if rng.random() < 0.5:
                h.queue(victim)  # same name, new qid
                b.bind("amq.fanout", victim)
        elif op == 9:
            r = rng.random()
            exchanges = sorted(n for n, x in b.exchanges.items() if not x.builtin)
            if r < 0.25 and exchanges:
                name = f"x{self.n}"
                b.declare_exchange(name, rng.choice(["fanout", "topic"]), auto_delete=rng.random() < 0.5,
                                   durable=rng.random() < 0.8)
                b.bind(name, rng.choice(exchanges), "#", to_exchange=True)
                targets = queues + ["scratch"] if "scratch" in b.queues else queues
                if targets:
                    b.bind(name, rng.choice(targets), "#")
                b.bind(rng.choice(exchanges), name, "#", to_exchange=True)
            elif r < 0.45 and exchanges:
                b.delete_exchange(rng.choice(exchanges))
            elif r < 0.65:
                bindings = [x for x in b.list_bindings() if x["exchange"]]
                if bindings:
                    x = rng.choice(bindings)
                    b.unbind(
                        x["exchange"], x.get("queue") or x["to_exchange"], x["routing_key"], x["arguments"],
                        to_exchange="to_exchange" in x,
                        channel_id=b.queues[x["queue"]].exclusive_owner or 0 if "queue" in x else 0,
                    )
            else:
                h.sleep(rng.choice([1, 31, 61]))  # leases and TTLs run out
        h.sync() if rng.random() < 0.7 else h.step()


@pytest.mark.parametrize("seed", range(60))
def test_fuzzy_snapshot_equals_live_state(seed: int) -> None:
    rng = random.Random(seed)
    h = Harness()
    build_state(h)
    mut = Mutator(h, rng)
    for _ in range(rng.randrange(10)):
        mut.step()
    h.step()
    covered, chunks = h.b.snapshot(chunk_entries=rng.choice([1, 2, 5]))
    snap: list[tuple[int, int, bytes]] = []
    for chunk in chunks:
        snap.extend((0, rtype, payload) for rtype, payload in chunk)
        for _ in range(rng.randrange(4)):
            mut.step()
    for _ in range(rng.randrange(5)):
        mut.step()
    h.sync()
    live = durable_view(h.b)
    tail = [r for r in h.records if r[0] > covered]
    nb = replay_into(fresh_broker(h), snap + tail, h.records[-1][0])
    assert durable_view(nb) == live
    assert durable_view(restart_from_log(h)) == live  # the whole log alone, too


def test_snapshot_cut_includes_message_delivered_between_chunks() -> None:
    """A message delivered after the snapshot started but before its queue's chunk
    was produced must still be in the checkpoint (its ENQUEUE is before the LSN)."""
    h = Harness()
    h.queue("a")
    h.queue("b")
    ch = h.channel()
    h.publish(ch, "", "a", b"a1")
    h.publish(ch, "", "b", b"b1")
    h.sync()
    covered, chunks = h.b.snapshot(chunk_entries=10)
    snap = [(0, rt, p) for rt, p in next(chunks)]  # head
    snap += [(0, rt, p) for rt, p in next(chunks)]  # queue "a"
    h.b.consume(ch, "b")
    assert [d.message.body for d in h.delivers(h.sync())] == [b"b1"]
    for chunk in chunks:
        snap += [(0, rt, p) for rt, p in chunk]
    live = durable_view(h.b)
    assert [m[1] for m in live["messages"]["b"]] == [b"b1"]
    tail = [r for r in h.records if r[0] > covered]
    nb = replay_into(fresh_broker(h), snap + tail, h.records[-1][0])
    assert durable_view(nb) == live


def test_ttl_survives_recovery() -> None:
    h = Harness()
    h.queue("ttl", arguments={"x-message-ttl": 10_000})
    ch = h.channel()
    h.publish(ch, "", "ttl", b"a")
    h.wall.now += 5
    h.publish(ch, "", "ttl", b"b", {"expiration": 1000})
    h.sync()
    for nb in (restart_from_log(h), replay_into(fresh_broker(h), snapshot_records(h.b)[1], h.b.last_lsn)):
        assert [e.expires_at for e in ready_entries(nb, "ttl")] == [h.wall.now + 5, h.wall.now + 1]
        h.wall.now += 2
        assert [e.message.body for e in ready_entries(nb, "ttl")]
        (got,) = nb.get("ttl", max_count=5)
        assert got[1].entry.message.body == b"a"
        h.wall.now -= 2


def test_replay_unknown_record_type() -> None:
    h = Harness()
    b = fresh_broker(h)
    b.begin_recovery()
    with pytest.raises(ValueError):
        b.replay(99, b"", 1)


def test_replay_in_new_broker_delivers_with_harness_checks() -> None:
    h = Harness()
    h.queue("q")
    ch = h.channel()
    for i in range(3):
        h.publish(ch, "", "q", bytes([i]))
    h.b.consume(ch, "q", prefetch=2)
    h.sync()
    nb = restart_from_log(h)
    c2 = nb.open_channel()
    nb.consume(c2, "q")
    got = [e for e in nb.take_effects() if isinstance(e, Deliver)]
    assert [(d.message.body, d.redelivered) for d in got] == [(b"\x00", True), (b"\x01", True), (b"\x02", False)]


def test_replay_does_not_auto_delete_on_its_own() -> None:
    """Replay sees only durable bindings; an auto-delete exchange that kept a binding
    to a transient queue must not be deleted by replaying its other binding's removal."""
    h = Harness()
    h.queue("tq", durable=False)
    h.b.declare_exchange("ad", "fanout", auto_delete=True)
    h.b.declare_exchange("dx", "fanout")
    h.b.bind("ad", "dx", to_exchange=True)
    h.b.bind("ad", "tq")
    h.b.delete_exchange("dx")
    assert "ad" in h.b.exchanges  # still bound to tq
    live = durable_view(h.b)
    nb = restart_from_log(h)
    assert durable_view(nb) == live
    # and auto-deletions that did happen live are in the log
    h.b.unbind("ad", "tq")
    assert "ad" not in h.b.exchanges
    assert "ad" not in restart_from_log(h).exchanges


def test_replay_after_an_unclean_stop_marks_every_message_redelivered() -> None:
    """Delivered marks are logged lazily: after a crash any recovered message may
    have been delivered, so all of them come back flagged (AMQP: 'may have been')."""
    h = Harness()
    h.queue("q")
    ch = h.channel()
    for i in range(5):
        h.publish(ch, "", "q", bytes([i]))
    h.sync()
    consumer = h.channel()
    h.b.consume(consumer, "q", prefetch=2)
    delivered = h.delivers(h.step())
    h.b.ack(consumer, delivered[1].delivery_tag)  # message 1 settled: not recovered
    h.step()
    nb = fresh_broker(h)
    nb.begin_recovery()
    for lsn, rtype, payload in h.records:
        nb.replay(rtype, payload, lsn)
    nb.finish_recovery(h.records[-1][0], assume_delivered=True)
    c2 = nb.open_channel()
    nb.consume(c2, "q")
    got = [e for e in nb.take_effects() if isinstance(e, Deliver)]
    assert [(d.message.body, d.redelivered) for d in got] == [(bytes([i]), True) for i in (0, 2, 3, 4)]


def test_replay_reads_single_entry_dedup_records_of_older_checkpoints() -> None:
    """Checkpoints used to hold one DEDUP record per window entry (now DEDUP_BATCH)."""
    from broker.core.records import encode_dedup

    h = Harness()
    b = fresh_broker(h)
    b.begin_recovery()
    b.replay(RecordType.DEDUP, encode_dedup("amq.direct", "old-id", h.wall.now), 0)
    b.finish_recovery(0)
    assert b.dedup.lookup("amq.direct", "old-id", h.wall.now) == 0
