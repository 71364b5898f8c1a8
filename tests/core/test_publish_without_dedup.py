"""Publishes made with ``dedup=False`` (AMQP's, as RabbitMQ takes them): every copy is
enqueued whatever its ``message_id``, nothing is remembered by the deduplication
window, live or after a restart from the log or a checkpoint; the default (dedup on)
is unchanged."""

from __future__ import annotations

from broker.core import Deliver
from broker.core.records import RecordType, decode_enqueue

from .durable_view import fresh_broker, replay_into, restart_from_log
from .helpers import Harness, ready_entries

ID = {"message_id": "order-7"}


def _publish(h: Harness, ch: int, body: bytes, *, dedup: bool, exchange: str = "", key: str = "q") -> int:
    tag, _routed = h.b.publish(ch, exchange, key, body, dict(ID), dedup=dedup)
    return tag


def test_the_same_message_id_twice_is_enqueued_twice_and_keeps_its_id() -> None:
    h = Harness(dedup_window_s=120)
    h.queue("q")
    ch = h.channel()
    tags = [_publish(h, ch, b"a", dedup=False), _publish(h, ch, b"b", dedup=False)]
    h.sync()
    assert all(h.acked(ch, t) for t in tags)
    assert h.ready_bodies("q") == [b"a", b"b"]
    assert h.b.stats["deduplicated"] == 0
    assert len(h.b.dedup) == 0
    # the id is the message's property still (delivered unchanged)...
    h.b.consume(ch, "q")
    delivered = [e for e in h.step() if isinstance(e, Deliver)]
    assert [d.message.properties for d in delivered] == [ID, ID]
    # ...but not its record's deduplication id, which replay would remember
    enqueues = [decode_enqueue(p) for _lsn, t, p in h.records if t == RecordType.ENQUEUE]
    assert [(r.message_id, r.properties) for r in enqueues] == [(None, ID), (None, ID)]


def test_the_default_still_deduplicates() -> None:
    h = Harness(dedup_window_s=120)
    h.queue("q")
    ch = h.channel()
    tags = [_publish(h, ch, b"a", dedup=True), h.publish(ch, "", "q", b"b", dict(ID))]
    h.sync()
    assert all(h.acked(ch, t) for t in tags)
    assert h.ready_bodies("q") == [b"a"]
    assert h.b.stats["deduplicated"] == 1


def test_a_publish_without_dedup_is_no_duplicate_of_one_with_it_nor_the_reverse() -> None:
    h = Harness(dedup_window_s=120)
    h.queue("q")
    ch = h.channel()
    _publish(h, ch, b"remembered", dedup=True)
    _publish(h, ch, b"taken anyway", dedup=False)  # not looked up
    _publish(h, ch, b"duplicate", dedup=True)  # the first is still remembered
    h.sync()
    assert h.ready_bodies("q") == [b"remembered", b"taken anyway"]
    h2 = Harness(dedup_window_s=120)
    h2.queue("q")
    ch2 = h2.channel()
    _publish(h2, ch2, b"not remembered", dedup=False)
    _publish(h2, ch2, b"first with dedup", dedup=True)
    h2.sync()
    assert h2.ready_bodies("q") == [b"not remembered", b"first with dedup"]


def test_a_restart_from_the_log_does_not_remember_it() -> None:
    h = Harness(dedup_window_s=120)
    h.queue("q", durable=True)
    ch = h.channel()
    _publish(h, ch, b"a", dedup=False)
    h.sync()
    nb = restart_from_log(h, dedup_window_s=120)
    assert len(nb.dedup) == 0
    ch2 = nb.open_channel()
    nb.publish(ch2, "", "q", b"b", dict(ID))  # deduplicated: but nothing to match
    assert [e.message.body for e in ready_entries(nb, "q")] == [b"a", b"b"]
    assert [e.message.properties for e in ready_entries(nb, "q")] == [ID, ID]


def test_a_restart_from_a_checkpoint_does_not_remember_it() -> None:
    h = Harness(dedup_window_s=120)
    h.queue("q", durable=True)
    ch = h.channel()
    _publish(h, ch, b"a", dedup=False)
    h.sync()
    covered, chunks = h.b.snapshot(3)
    records = [(0, rtype, payload) for chunk in chunks for rtype, payload in chunk]
    nb = replay_into(fresh_broker(h, dedup_window_s=120), records, covered)
    assert len(nb.dedup) == 0
    ch2 = nb.open_channel()
    nb.publish(ch2, "", "q", b"b", dict(ID))
    assert [e.message.body for e in ready_entries(nb, "q")] == [b"a", b"b"]
    assert [e.message.properties for e in ready_entries(nb, "q")] == [ID, ID]


def test_an_unroutable_publish_without_dedup_is_not_remembered() -> None:
    # with dedup, an unroutable publish is remembered (a resend is a duplicate);
    # without, a later publish of that id once a queue is bound lands
    for dedup, landed in ((True, []), (False, [b"later"])):
        h = Harness(dedup_window_s=120)
        h.b.declare_exchange("ex", "direct")
        ch = h.channel()
        _publish(h, ch, b"lost", dedup=dedup, exchange="ex", key="k")
        h.queue("q")
        h.b.bind("ex", "q", "k")
        _publish(h, ch, b"later", dedup=True, exchange="ex", key="k")
        h.sync()
        assert h.ready_bodies("q") == landed, dedup


def test_a_transaction_carries_the_flag_to_its_commit() -> None:
    h = Harness(dedup_window_s=120)
    h.queue("q")
    ch = h.channel()
    h.b.tx_select(ch)
    _publish(h, ch, b"a", dedup=False)
    _publish(h, ch, b"b", dedup=False)
    _publish(h, ch, b"c", dedup=True)
    _publish(h, ch, b"d", dedup=True)  # a duplicate of c at the commit
    assert [p[-1] for p in h.b.tx_publishes(ch)] == [False, False, True, True]
    h.b.tx_commit(ch)
    h.sync()
    assert h.ready_bodies("q") == [b"a", b"b", b"c"]


def test_a_restored_message_without_dedup_is_not_remembered() -> None:
    h = Harness(dedup_window_s=120)
    h.queue("q", durable=True)
    h.b.restore_message("q", "", "q", b"a", dict(ID), h.wall.now, dedup=False)
    h.sync()
    assert len(h.b.dedup) == 0
    (record,) = [decode_enqueue(p) for _lsn, t, p in h.records if t == RecordType.ENQUEUE]
    assert (record.message_id, record.properties) == (None, ID)
    ch = h.channel()
    h.publish(ch, "", "q", b"b", dict(ID))
    h.sync()
    assert h.ready_bodies("q") == [b"a", b"b"]


def test_a_lost_publish_without_dedup_leaves_an_earlier_publishs_entry_in_the_window() -> None:
    """Storage fails under a publish made without deduplication whose ``message_id``
    an earlier, deduplicated and confirmed publish used: the window keeps the earlier
    one's entry (only the lost publish's own entry is forgotten), so a resend of the
    earlier one is still answered as a duplicate."""
    h = Harness(dedup_window_s=120)
    h.queue("q")
    ch = h.channel()
    first = _publish(h, ch, b"confirmed", dedup=True)
    h.sync()
    ok_lsn = h.b.last_lsn
    lost = _publish(h, ch, b"lost", dedup=False)
    h.step()
    h.b.storage_failed(ok_lsn + 1, h.b.last_lsn, "io error")
    h.step()
    assert h.acked(ch, first) and h.nacked(ch, lost)
    h.b.storage_recovered()
    resend = _publish(h, ch, b"confirmed", dedup=True)
    h.sync()
    assert h.acked(ch, resend)
    assert h.ready_bodies("q") == [b"confirmed"]
    assert h.b.stats["deduplicated"] == 1
