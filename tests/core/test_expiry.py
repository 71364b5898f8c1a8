"""Expired messages leave their queue on time although nobody reads it: a message's own
``expiration`` (no ``x-message-ttl`` needed), out of queue order, paged out to the log,
requeued after a delivery; dead-lettered with reason ``expired``, and no longer counted."""

from __future__ import annotations

from typing import Any

import pytest

from broker.core import Deliver
from broker.core.records import RecordType, decode_seqs

from .helpers import Harness, ready_entries

DLX = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}


def setup(memory: int = 2048, **queue: Any) -> tuple[Harness, int]:
    h = Harness(queue_memory_messages=memory)
    h.queue("dead")
    h.queue("q", **queue)
    return h, h.channel()


def dead_letters(h: Harness) -> list[tuple[bytes, str]]:
    """(body, reason) of every message in the dead-letter queue, in order."""
    out = []
    for entry in ready_entries(h.b, "dead"):
        (death,) = entry.message.properties["headers"]["x-death"]
        out.append((entry.message.body, death["reason"]))
    return out


def settled(h: Harness) -> list[int]:
    return sorted(s for _l, t, p in h.records if t == RecordType.SETTLE for s in decode_seqs(p)[1])


@pytest.mark.parametrize("durable", [True, False])
def test_a_message_leaves_at_its_expiration_with_nobody_consuming(durable: bool) -> None:
    h, ch = setup(durable=durable, arguments=dict(DLX))  # no x-message-ttl
    h.publish(ch, "", "q", b"short", {"expiration": 2000})
    h.publish(ch, "", "q", b"keep")
    h.sync()
    assert h.info("q")["messages_ready"] == 2
    h.sleep(1.999)
    assert h.info("q")["messages_ready"] == 2
    assert h.b.next_deadline() == pytest.approx(h.mono.now + 0.001)  # the queue's timer waits for it
    h.sleep(0.001)
    assert h.ready_bodies("q") == [b"keep"]
    assert h.info("q")["messages_ready"] == 1
    assert h.info("q")["message_stats"]["dead_lettered"] == {"expired": 1}
    assert h.b.totals()["messages_ready"] == 1 + 1  # "keep", and the dead letter
    assert dead_letters(h) == [(b"short", "expired")]
    assert h.b.next_deadline() is None  # nothing left to wake for


def test_a_short_expiration_behind_long_ones_leaves_on_time() -> None:
    h, ch = setup(arguments=dict(DLX))
    h.publish(ch, "", "q", b"long", {"expiration": 60_000})
    h.publish(ch, "", "q", b"none")
    h.publish(ch, "", "q", b"short", {"expiration": 1000})
    h.publish(ch, "", "q", b"middle", {"expiration": 5000})
    h.sync()
    h.sleep(1.0)
    assert h.ready_bodies("q") == [b"long", b"none", b"middle"]
    h.sleep(4.0)
    assert h.ready_bodies("q") == [b"long", b"none"]
    h.sleep(55.0)
    assert h.ready_bodies("q") == [b"none"]
    assert dead_letters(h) == [(b"short", "expired"), (b"middle", "expired"), (b"long", "expired")]
    assert h.info("q")["messages_ready"] == 1


def test_a_per_message_expiration_shorter_than_the_queue_ttl_leaves_on_time() -> None:
    h, ch = setup(arguments={"x-message-ttl": 10_000, **DLX})
    h.publish(ch, "", "q", b"first")
    h.publish(ch, "", "q", b"short", {"expiration": 1000})
    h.sleep(1.0)
    assert h.ready_bodies("q") == [b"first"]
    h.sleep(9.0)
    assert h.ready_bodies("q") == []
    assert dead_letters(h) == [(b"short", "expired"), (b"first", "expired")]


def test_a_paged_out_message_expires_on_time_and_is_dead_lettered_whole() -> None:
    h, ch = setup(memory=2, arguments=dict(DLX))
    for i in range(6):
        h.publish(ch, "", "q", f"m{i}".encode())
    h.publish(ch, "", "q", b"paged", {"expiration": 3000, "headers": {"k": "v"}})
    h.publish(ch, "", "q", b"after")
    h.sync()
    q = h.b.queues["q"]
    assert q.paged_count() >= 6  # "paged" is only in the log
    h.sleep(3.0)
    assert h.info("q")["messages_ready"] == 7
    assert b"paged" not in h.ready_bodies("q")
    (entry,) = ready_entries(h.b, "dead")
    assert entry.message.body == b"paged" and entry.message.properties["headers"]["k"] == "v"
    assert h.b.totals()["messages_ready"] == 8


def test_a_paged_out_message_without_a_dead_letter_exchange_is_settled_unread() -> None:
    h, ch = setup(memory=2)
    for i in range(6):
        h.publish(ch, "", "q", f"m{i}".encode())
    tag = h.publish(ch, "", "q", b"paged", {"expiration": 3000})
    h.sync()
    seq = tag + 0  # the REST-free channel numbers publishes like messages here
    reads: list[Any] = []
    real = h.b.read_log
    h.b.read_log = lambda lsns: reads.append(list(lsns)) or real(lsns)  # type: ignore[assignment,func-returns-value]
    h.sleep(3.0)
    h.sync()
    assert reads == []  # nothing read back: it goes nowhere
    assert seq in settled(h)
    assert h.info("q")["messages_ready"] == 6
    assert h.info("q")["message_stats"]["dead_lettered"] == {"expired": 1}


def test_a_requeued_message_expires_without_a_reader() -> None:
    h, ch = setup(arguments=dict(DLX))
    h.publish(ch, "", "q", b"m", {"expiration": 5000})
    ((lid, _d, _r),) = h.b.get("q")
    h.sleep(1.0)
    h.b.nack_leases([lid])  # back in the queue; nobody reads it again
    h.step()
    assert h.info("q")["messages_ready"] == 1
    h.sleep(4.0)
    assert h.info("q")["messages_ready"] == 0
    assert dead_letters(h) == [(b"m", "expired")]


def test_a_delivered_message_is_not_expired_while_out() -> None:
    h, ch = setup(arguments=dict(DLX))
    h.publish(ch, "", "q", b"m", {"expiration": 1000})
    tag = h.b.consume(ch, "q")
    (d,) = h.delivers(h.step())
    h.sleep(5.0)
    assert dead_letters(h) == []  # it is with its consumer, not in the queue
    h.b.ack(ch, d.delivery_tag)
    h.b.cancel(ch, tag)
    assert h.info("q")["messages"] == 0 and not h.b.queues["q"].expiring


def test_a_priority_queue_expires_out_of_order_too() -> None:
    h, ch = setup(arguments={"x-max-priority": 5, **DLX})
    h.publish(ch, "", "q", b"high", {"priority": 5, "expiration": 60_000})
    h.publish(ch, "", "q", b"low", {"priority": 1, "expiration": 1000})
    h.sleep(1.0)
    assert h.ready_bodies("q") == [b"high"]
    assert h.info("q")["messages_ready_by_priority"] == {"5": 1}


def test_the_index_holds_only_messages_with_an_expiration() -> None:
    h, ch = setup()
    for _ in range(100):
        h.publish(ch, "", "q", b"plain")
    h.publish(ch, "", "q", b"e", {"expiration": 1000})
    q = h.b.queues["q"]
    assert len(q.expiring) == 1
    h.b.consume(ch, "q")
    delivered = h.delivers(h.step())
    assert len(delivered) == 101 and not q.expiring  # taken for delivery: out of the index
    assert all(isinstance(d, Deliver) for d in delivered)


def test_requeues_do_not_grow_the_index() -> None:
    h, ch = setup()
    h.publish(ch, "", "q", b"m", {"expiration": 3_600_000})
    for _ in range(1000):
        ((lid, _d, _r),) = h.b.get("q")
        h.b.nack_leases([lid])
    q = h.b.queues["q"]
    assert len(q.expiring) == 1
    assert len(q.expiring._heap) < 200  # rebuilt from the live ones as stale pairs pile up


def test_removing_a_paged_out_pair_copies_its_chunk_and_leaves_a_checkpoint_cut_intact() -> None:
    from broker.core.paging import PagedRefs

    refs = PagedRefs()
    for seq in range(1, 5001):
        refs.append(seq, seq << 1)
    refs.take(3)
    cut = refs.cut()
    before = [list(chunk[start:stop]) for chunk, start, stop in cut]
    assert refs.remove(2500) == 5000
    assert refs.remove(2500) is None and refs.remove(2) is None  # gone, or taken before
    assert refs.remove(4) == 8  # the first still queued (the head chunk's offset holds)
    assert [list(chunk[start:stop]) for chunk, start, stop in cut] == before
    seqs = [seq for seq, _loc in refs]
    assert len(refs) == len(seqs) == 5000 - 3 - 2 and seqs[0] == 5 and 2500 not in seqs
    assert refs.take(2) == [(5, 10), (6, 12)]


# ------------------------------------------------------------------ after a restart


def _restarted(h: Harness, how: str) -> Harness:
    """``h``'s broker restarted from its log, or from a checkpoint and the log after it,
    in a harness of its own (same clocks and log)."""
    from .durable_view import replay_into

    h.sync()
    r = Harness(queue_memory_messages=2, boot_id="b1")
    r.mono.now, r.wall.now = h.mono.now, h.wall.now
    r.log = h.log
    r.records = list(h.records)
    if how == "log":
        records = h.records
    else:
        _covered, chunks = h.b.snapshot(3)
        records = [(0, rtype, payload) for chunk in chunks for rtype, payload in chunk]
    replay_into(r.b, records, h.b.last_lsn)
    r.step()
    return r


@pytest.mark.parametrize("how", ["log", "checkpoint"])
def test_expirations_are_known_after_a_restart_without_reading_the_messages(how: str) -> None:
    h, ch = setup(memory=2, arguments=dict(DLX))
    for i in range(5):
        h.publish(ch, "", "q", f"m{i}".encode())
    h.publish(ch, "", "q", b"paged", {"expiration": 10_000})
    h.publish(ch, "", "q", b"unacked", {"expiration": 20_000})
    h.publish(ch, "", "q", b"last")
    h.sync()
    leases = h.b.get("q", max_count=10)  # all of them; all but "unacked" go back
    assert [g[1].entry.message.body for g in leases][-2:] == [b"unacked", b"last"]
    h.b.nack_leases([lid for lid, d, _r in leases if d.entry.message.body != b"unacked"])
    r = _restarted(h, how)
    assert r.info("q")["messages_ready"] == 8  # the unacked one is back
    assert r.b.queues["q"].paged_count() >= 6  # none of them read back
    r.sleep(10.0)
    assert r.info("q")["messages_ready"] == 7
    r.sleep(10.0)
    assert r.info("q")["messages_ready"] == 6
    assert dead_letters(r) == [(b"paged", "expired"), (b"unacked", "expired")]


def test_a_ttl_queue_expires_what_expired_while_the_broker_was_down() -> None:
    h, ch = setup(memory=2, arguments={"x-message-ttl": 5000, **DLX})
    for i in range(4):
        h.publish(ch, "", "q", f"m{i}".encode())
    h.wall.now += 60  # down for a minute
    r = _restarted(h, "log")
    assert r.info("q")["messages_ready"] == 0
    assert len(dead_letters(r)) == 4
