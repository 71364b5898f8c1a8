"""Dead letters into a queue that keeps every message persistent
(``Broker.persist_messages``: a quorum queue's leader sets it, docs/cluster.md "Every
message is persistent"): a transient message dead-lettered there is stored, logged and
replicated as persistent, like a transient publish; elsewhere it stays transient."""

from __future__ import annotations

from broker.core import Broker, DeadLetterDropped
from broker.core.records import RecordType

from .durable_view import fresh_broker, replay_into, restart_from_log
from .helpers import Harness, ready_entries

TRANSIENT = {"delivery_mode": 1}


def _setup(h: Harness, *, persist: bool) -> int:
    """``work`` dead-letters to fanout ``dlx``, bound to durable ``qq`` (persisting
    every message when ``persist``) and ``plain``; one transient message in ``work``,
    delivered on the returned channel."""
    h.b.declare_exchange("dlx", "fanout")
    h.queue("qq", durable=True)
    h.queue("plain", durable=True)
    h.b.bind("dlx", "qq")
    h.b.bind("dlx", "plain")
    if persist:
        h.b.persist_messages("qq")
    h.queue("work", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
    h.publish(0, "", "work", b"m", dict(TRANSIENT))
    h.sync()
    ch = h.channel()
    h.b.consume(ch, "work")
    return ch


def _reject(h: Harness, ch: int) -> None:
    (d,) = h.delivers(h.step(), ch)
    h.b.reject(ch, d.delivery_tag, requeue=False)


def _message_records(h: Harness) -> list[int]:
    return [rtype for _lsn, rtype, _p in h.records if rtype in (RecordType.ENQUEUE, RecordType.MOVE)]


def test_a_transient_dead_letter_into_a_queue_persisting_every_message_is_persistent() -> None:
    h = Harness()
    ch = _setup(h, persist=True)
    assert _message_records(h) == []  # transient: the publish logged nothing
    _reject(h, ch)
    h.sync()
    assert len(_message_records(h)) == 1  # the dead letter is logged (and so replicated)
    for queue in ("qq", "plain"):  # one message: persistent wherever it went
        (entry,) = ready_entries(h.b, queue)
        assert entry.message.persistent and entry.message.properties["delivery_mode"] == 2, queue
    assert entry.message.properties["headers"]["x-death"][0]["reason"] == "rejected"


def test_a_transient_dead_letter_into_ordinary_queues_stays_transient() -> None:
    h = Harness()
    ch = _setup(h, persist=False)
    _reject(h, ch)
    h.sync()
    assert _message_records(h) == []
    for queue in ("qq", "plain"):
        (entry,) = ready_entries(h.b, queue)
        assert not entry.message.persistent and entry.message.properties["delivery_mode"] == 1, queue


def test_an_expired_transient_message_dead_lettered_into_a_persisting_queue_is_persistent() -> None:
    h = Harness()
    h.b.declare_exchange("dlx", "fanout")
    h.queue("qq", durable=True)
    h.b.bind("dlx", "qq")
    h.b.persist_messages("qq")
    h.queue("work", durable=True, arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 1000})
    h.publish(0, "", "work", b"m", dict(TRANSIENT))
    h.sync()
    h.sleep(2)
    h.sync()
    (entry,) = ready_entries(h.b, "qq")
    assert entry.message.persistent and entry.message.properties["headers"]["x-death"][0]["reason"] == "expired"
    assert len(_message_records(h)) == 1


def test_while_storage_fails_a_transient_dead_letter_bound_to_be_persisted_is_dropped() -> None:
    """docs/failures.md: while the log cannot be written, a dead letter bound for a
    durable queue is dropped ("storage is failing"); a transient one that a
    persisting queue would make persistent needs the log just the same."""
    h = Harness()
    ch = _setup(h, persist=True)
    (d,) = h.delivers(h.step(), ch)
    h.publish(0, "", "plain", b"doomed")  # a persistent publish whose write fails
    h.step()
    h.b.storage_failed(h.b.last_lsn, h.b.last_lsn, "disk on fire")
    h.step()
    written = len(_message_records(h))
    h.b.reject(ch, d.delivery_tag, requeue=False)
    effects = h.step()
    (dropped,) = h.of_type(DeadLetterDropped, effects)
    assert "storage is failing" in dropped.why
    assert len(_message_records(h)) == written  # nothing appended to a failing log
    assert ready_entries(h.b, "qq") == []


def _bodies_and_modes(b: Broker, queue: str) -> list[tuple[bytes, int]]:
    return [(e.message.body, e.message.properties["delivery_mode"]) for e in ready_entries(b, queue)]


def test_a_transient_dead_letter_made_persistent_survives_a_restart_from_the_log_and_a_checkpoint() -> None:
    """docs/cluster.md "Every message is persistent": a transient message that reaches
    a persisting queue is persistent in every queue it reaches (one message), so it is
    still in both after a restart: from the log, and from a checkpoint."""
    h = Harness()
    ch = _setup(h, persist=True)
    _reject(h, ch)
    h.sync()
    expected = [(b"m", 2)]
    restarted = restart_from_log(h)
    for queue in ("qq", "plain"):
        assert _bodies_and_modes(restarted, queue) == expected, queue
    assert ready_entries(restarted, "work") == []  # dead-lettered: not back at its source
    covered, chunks = h.b.snapshot(chunk_entries=1)
    records = [(0, rtype, payload) for chunk in chunks for rtype, payload in chunk]
    from_checkpoint = replay_into(fresh_broker(h), records, covered)
    for queue in ("qq", "plain"):
        assert _bodies_and_modes(from_checkpoint, queue) == expected, queue


def test_a_transient_dead_letter_into_ordinary_queues_is_gone_after_a_restart() -> None:
    h = Harness()
    ch = _setup(h, persist=False)
    _reject(h, ch)
    h.sync()
    restarted = restart_from_log(h)
    for queue in ("qq", "plain", "work"):
        assert ready_entries(restarted, queue) == [], queue
