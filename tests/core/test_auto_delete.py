"""Auto-delete queues read over REST (gets, long-polls: no consumer to lose, as Celery's
``rpc://`` reply queues) are deleted once idle for ``auto_delete_grace_s``: no reader,
no lease out, no message."""

from __future__ import annotations

import pytest

from broker.core import NotFound, QueueAutoDeleted

from .helpers import Harness

GRACE = 5.0  # CoreConfig's default


def setup(**kwargs: float) -> Harness:
    h = Harness(**kwargs)
    h.queue("reply", auto_delete=True)
    return h


def test_a_queue_read_with_gets_goes_after_the_grace() -> None:
    h = setup()
    ch = h.channel()
    h.publish(ch, "", "reply", b"result")
    ((lid, _d, _r),) = h.b.get("reply")
    h.b.ack_leases([lid])
    h.sleep(GRACE - 0.1)
    assert "reply" in h.b.queues
    h.sleep(0.1)
    assert "reply" not in h.b.queues
    assert h.b.totals()["queues"] == 0
    with pytest.raises(NotFound):
        h.b.get("reply")


def test_an_empty_get_counts_as_a_reader() -> None:
    h = setup()
    assert h.b.get("reply") == []
    h.sleep(GRACE)
    assert "reply" not in h.b.queues


def test_the_grace_is_a_setting() -> None:
    h = setup(auto_delete_grace_s=0.5)
    h.b.get("reply")
    h.sleep(0.5)
    assert "reply" not in h.b.queues


def test_a_queue_never_read_is_kept() -> None:
    h = setup()
    h.sleep(GRACE * 10)
    assert "reply" in h.b.queues  # as in RabbitMQ (x-expires is for that)


def test_a_queue_without_auto_delete_is_kept() -> None:
    h = Harness()
    h.queue("plain")
    h.b.get("plain")
    h.sleep(GRACE * 10)
    assert "plain" in h.b.queues


def test_a_lease_out_keeps_it_and_its_settle_starts_the_grace() -> None:
    h = setup()
    ch = h.channel()
    h.publish(ch, "", "reply", b"result")
    ((lid, _d, _r),) = h.b.get("reply", lease_s=60)
    h.sleep(GRACE * 3)
    assert "reply" in h.b.queues  # the reader still holds the message
    h.b.ack_leases([lid])
    h.sleep(GRACE - 0.1)
    assert "reply" in h.b.queues
    h.sleep(0.1)
    assert "reply" not in h.b.queues


def test_a_queue_holding_messages_is_kept() -> None:
    h = setup()
    ch = h.channel()
    h.b.get("reply")
    h.publish(ch, "", "reply", b"late result")  # nobody came for it yet
    h.sleep(GRACE * 3)
    assert h.info("reply")["messages_ready"] == 1
    ((lid, _d, _r),) = h.b.get("reply")
    h.b.ack_leases([lid])
    h.sleep(GRACE)
    assert "reply" not in h.b.queues


def test_an_expired_lease_returns_its_message_and_the_queue_is_kept() -> None:
    h = setup()
    ch = h.channel()
    h.publish(ch, "", "reply", b"result")
    h.b.get("reply", lease_s=1)
    h.sleep(1.0)
    h.sleep(GRACE * 2)
    assert h.info("reply")["messages_ready"] == 1


def test_a_parked_long_poll_keeps_it_and_its_end_starts_the_grace() -> None:
    h = setup()
    h.b.get("reply")  # the long-poll's first try
    h.b.park_getter("reply")
    h.sleep(GRACE * 3)
    assert "reply" in h.b.queues
    # its timer keeps looking (the long-poll may end with no command after it)
    assert h.b.next_deadline() == pytest.approx(h.mono.now + GRACE, abs=GRACE)
    h.b.unpark_getter("reply")
    h.sleep(GRACE - 0.1)
    assert "reply" in h.b.queues
    h.sleep(0.1)
    assert "reply" not in h.b.queues


def test_each_get_and_a_redeclare_start_the_grace_over() -> None:
    h = setup()
    for _ in range(5):
        h.b.get("reply")
        h.sleep(GRACE - 1)
    h.b.declare_queue("reply", auto_delete=True)  # Celery redeclares it at each send
    h.sleep(GRACE - 1)
    assert "reply" in h.b.queues
    h.sleep(1)
    assert "reply" not in h.b.queues


def test_a_consumer_keeps_it_and_its_going_deletes_it_at_once() -> None:
    h = setup()
    h.b.get("reply")
    ch = h.channel()
    tag = h.b.consume(ch, "reply")
    h.sleep(GRACE * 3)
    assert "reply" in h.b.queues
    h.b.cancel(ch, tag)
    assert "reply" not in h.b.queues  # RabbitMQ's rule for consumers


def test_the_last_consumer_going_while_a_long_poll_waits_leaves_it_to_the_grace() -> None:
    h = setup()
    ch = h.channel()
    tag = h.b.consume(ch, "reply")
    h.b.get("reply")
    h.b.park_getter("reply")
    h.b.cancel(ch, tag)
    assert "reply" in h.b.queues  # the long-poll still reads it
    h.b.unpark_getter("reply")
    h.sleep(GRACE)
    assert "reply" not in h.b.queues


def test_a_queue_the_broker_deletes_by_itself_is_told_apart_from_a_clients_delete() -> None:
    """``QueueAutoDeleted`` (a cluster deletes the queue's definition in etcd on it):
    for an auto-delete queue its readers left, or one unused for its x-expires; never
    for a client's delete."""
    h = setup()
    h.queue("expiring", arguments={"x-expires": 2000})
    h.queue("plain")
    h.queue("polled", auto_delete=True)
    ch = h.channel()
    h.b.cancel(ch, h.b.consume(ch, "reply"))
    h.b.delete_queue("plain")
    h.b.get("polled")  # a REST reader, gone idle
    h.sleep(GRACE)
    assert not {"reply", "expiring", "plain", "polled"} & set(h.b.queues)
    h.step()
    assert [(e.queue, e.reason) for e in h.of_type(QueueAutoDeleted)] == [
        ("reply", "auto-delete queue lost its last consumer"),
        ("expiring", "queue expired (unused for its x-expires)"),
        ("polled", "auto-delete queue left idle by its readers"),
    ]


def test_an_exclusive_queue_whose_owner_closed_is_told_as_deleted_by_the_broker() -> None:
    h = Harness()
    ch = h.channel()
    h.b.declare_queue("mine", exclusive=True, channel_id=ch)
    h.b.close_channel(ch)
    assert "mine" not in h.b.queues
    h.step()
    assert [(e.queue, e.reason) for e in h.of_type(QueueAutoDeleted)] == [("mine", "exclusive queue owner closed")]
