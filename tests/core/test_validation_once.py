"""Rules checked once, in the core command, so that every entry point (REST, channels,
streams) refuses the same input the same way, before anything changes."""

from __future__ import annotations

import pytest

from broker.core import InvalidArgument

from .helpers import Harness


def test_a_routing_key_over_255_bytes_is_refused_by_publish_itself() -> None:
    # before: only REST checked; a channel publish of a 300-byte key was acked
    h = Harness()
    h.queue("q")
    ch = h.channel()
    with pytest.raises(InvalidArgument, match="255 bytes"):
        h.publish(ch, "", "k" * 300)
    with pytest.raises(InvalidArgument, match="255 bytes"):
        h.publish(ch, "", "é" * 128)  # 256 bytes in UTF-8
    assert h.b.stats["published"] == 0
    assert h.publish(ch, "", "k" * 255) == 1  # the refused ones took no tag
    h.sync()
    assert h.acked(ch, 1)


@pytest.mark.parametrize("ack_timeout_s", [0.0, -1.0, 1e12])
def test_an_ack_timeout_outside_its_range_is_refused_by_consume(ack_timeout_s: float) -> None:
    # before: 0 or less was taken, and every delivery expired at once (a storm)
    h = Harness()
    h.queue("q")
    ch = h.channel()
    with pytest.raises(InvalidArgument, match="ack timeout"):
        h.b.consume(ch, "q", consumer_tag="c", ack_timeout_s=ack_timeout_s)
    assert not h.b.channels[ch].consumers


def test_confirmed_counts_every_acked_publish_coalesced_or_not() -> None:
    # before: stats["confirmed"] stayed 0 (GET /overview showed it)
    h = Harness()
    h.queue("q")
    ch = h.channel()
    for _ in range(5):
        h.publish(ch, "", "q")
    h.sync()  # one coalesced ack for tags 1..5
    h.publish(ch, "", "q")
    h.sync()
    h.publish(ch, "nowhere", "q")  # nacked: no such exchange
    h.sync()
    assert h.b.stats["confirmed"] == 6
    assert h.b.stats["nacked"] == 1


def test_a_checkpoint_of_an_idle_broker_carries_no_expired_deduplication_entries() -> None:
    # before: the window was pruned only when something was published, so an idle
    # broker wrote expired entries into every checkpoint
    h = Harness(dedup_window_s=60)
    h.queue("q")
    ch = h.channel()
    for i in range(3):
        h.publish(ch, "", "q", b"x", {"message_id": f"id-{i}"})
    h.sync()
    assert len(h.b.dedup) == 3
    h.sleep(61)  # nothing published meanwhile
    _lsn, chunks = h.b.snapshot()
    for _chunk in chunks:
        pass
    assert len(h.b.dedup) == 0


def test_purge_and_rest_acks_are_refused_while_the_log_cannot_be_written() -> None:
    # before: a purge and acks on a full disk answered success and came undone at the
    # next start ({"purged": 57074}, then all 57,074 back)
    from broker.core import Unavailable

    h = Harness()
    h.queue("q")
    ch = h.channel()
    for i in range(3):
        h.publish(ch, "", "q", b"m%d" % i)
    h.sync()
    leases = h.b.get("q", 1, 30.0)
    h.step()
    h.b.storage_failed(h.b.last_lsn + 1, h.b.last_lsn + 1, "No space left on device")
    with pytest.raises(Unavailable, match="log cannot be written"):
        h.b.purge_queue("q")
    with pytest.raises(Unavailable):
        h.b.ack_leases([leases[0][0]])
    with pytest.raises(Unavailable):
        h.b.nack_leases([leases[0][0]], requeue=False)
    assert h.info("q")["messages_ready"] == 2 and h.info("q")["messages_unacked"] == 1
    assert h.b.nack_leases([leases[0][0]], requeue=True) == 1  # requeue writes nothing
    h.b.storage_recovered()
    assert h.b.purge_queue("q") == 3
