"""A failed read of a paged-out message never discards it.

Before: any read error (EMFILE, EIO, a transport error on a network file system) made
the core settle the message as lost, for good. Now a LogReadFailed effect raises the
alarm and the message is kept: a record that is really unreadable keeps its place and
its queue waits for a retry (with backoff); a transient failure of one record sets that
message aside for retries while the messages behind it are served; only ``repair``
gives up on a record that is really unreadable.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.core import LogReadFailed, MessageLost
from broker.core.pager import (
    READ_RETRY_MAX_S,
    READ_RETRY_MIN_S,
    READ_SET_ASIDE_ATTEMPTS,
)

from .helpers import Harness


class _Failure(str):
    """A read failure as the storage layer reports it (a str with ``transient``)."""

    transient: bool

    def __new__(cls, reason: str, transient: bool) -> _Failure:
        failure = super().__new__(cls, reason)
        failure.transient = transient
        return failure


def _paged_backlog(repair: bool = False) -> tuple[Harness, int]:
    h = Harness(memory_messages_per_queue=2, repair=repair)
    h.queue("q")
    ch = h.channel()
    for i in range(10):
        h.publish(ch, "", "q", b"m%d" % i)
    h.sync()
    assert len(h.b.queues["q"].lanes[0].paged) == 8
    return h, ch


def _failing_reads(h: Harness, failing: set[int], transient: bool) -> list[int]:
    """Make reads of the messages with these sequence numbers fail; returns the LSNs
    asked for."""
    asked: list[int] = []
    real = h.read_log
    def read(lsns: Any) -> list[Any]:
        asked.extend(lsns)
        out = real(lsns)
        return [
            _Failure(f"reading record {lsn} failed", transient) if lsn in failing else r
            for lsn, r in zip(lsns, out)
        ]

    h.b.read_log = read
    return asked


def test_an_unreadable_record_keeps_the_message_and_its_place_and_retries() -> None:
    transient = False
    h, _ = _paged_backlog()
    third_lsn = h.b.queues["q"].lanes[0].paged.take(1)[0][1] >> 1
    h.b.queues["q"].lanes[0].paged.put_back([(3, third_lsn << 1)])
    _failing_reads(h, {third_lsn}, transient)
    c = h.channel()
    h.b.consume(c, "q", consumer_tag="c", prefetch=100)
    effects = h.step()
    assert h.bodies(effects) == [b"m0", b"m1"]  # the in-memory head only
    [alarm] = h.of_type(LogReadFailed, effects)
    assert alarm.queue == "q" and alarm.lsn == third_lsn and alarm.transient is transient
    assert not h.of_type(MessageLost)
    assert len(h.b.queues["q"].lanes[0].paged) == 8  # nothing left the queue
    # not before the retry is due
    effects = h.sleep(READ_RETRY_MIN_S / 2)
    assert h.bodies(effects) == []
    # the retry fails again: the wait doubles
    effects = h.sleep(READ_RETRY_MIN_S)
    [again] = h.of_type(LogReadFailed, effects)
    assert again.retry_in_s == 2 * READ_RETRY_MIN_S
    # the log is readable again: everything comes, in order, nothing lost
    h.b.read_log = h.read_log
    effects = h.sleep(2 * READ_RETRY_MIN_S)
    assert h.bodies(effects) == [b"m%d" % i for i in range(2, 10)]
    assert not h.of_type(MessageLost)
    assert h.b.queues["q"].read_failure is None


def test_with_repair_an_unreadable_record_is_given_up_and_the_rest_served() -> None:
    h, _ = _paged_backlog(repair=True)
    pairs = h.b.queues["q"].lanes[0].paged.take(8)
    h.b.queues["q"].lanes[0].paged.put_back(pairs)
    bad_lsn = pairs[3][1] >> 1  # m5
    _failing_reads(h, {bad_lsn}, transient=False)
    c = h.channel()
    h.b.consume(c, "q", consumer_tag="c", prefetch=100)
    effects = h.step()
    assert h.bodies(effects) == [b"m%d" % i for i in range(10) if i != 5]
    [lost] = h.of_type(MessageLost, effects)
    assert lost.lsn == bad_lsn


@pytest.mark.parametrize("repair", [False, True])
def test_a_lasting_transient_failure_sets_the_message_aside_and_serves_the_ones_behind_it(repair: bool) -> None:
    """One record whose read keeps failing transiently (EIO on one sector, say) does
    not hold its queue for good: after READ_SET_ASIDE_ATTEMPTS retries in place (a
    passing EMFILE keeps the order) the messages behind it are delivered, and the one
    set aside comes back once a retry reads it."""
    h, _ = _paged_backlog(repair=repair)
    pairs = h.b.queues["q"].lanes[0].paged.take(8)
    h.b.queues["q"].lanes[0].paged.put_back(pairs)
    bad_lsn = pairs[0][1] >> 1  # m2
    _failing_reads(h, {bad_lsn}, transient=True)
    c = h.channel()
    h.b.consume(c, "q", consumer_tag="c", prefetch=100)
    effects = h.step()
    assert h.bodies(effects) == [b"m0", b"m1"]  # first retried in place
    delivered: list[bytes] = []
    alarms = len(h.of_type(LogReadFailed, effects))
    for _ in range(READ_SET_ASIDE_ATTEMPTS + 1):
        effects = h.sleep(READ_RETRY_MAX_S)
        delivered += h.bodies(effects)
        alarms += len(h.of_type(LogReadFailed, effects))
        assert all(a.lsn == bad_lsn and a.transient for a in h.of_type(LogReadFailed, effects))
    assert delivered == [b"m%d" % i for i in range(3, 10)]
    assert alarms >= READ_SET_ASIDE_ATTEMPTS + 1
    assert not h.of_type(MessageLost)
    assert h.b.queues["q"].read_failure is not None  # the alarm stays until it is read
    # readable again: it comes, nothing lost
    h.b.read_log = h.read_log
    effects = h.sleep(READ_RETRY_MAX_S)
    assert h.bodies(effects) == [b"m2"]
    assert not h.of_type(MessageLost)
    assert h.b.queues["q"].read_failure is None


def test_a_transient_failure_of_every_read_still_waits_for_the_log() -> None:
    """When the record after one set aside fails too, the log cannot be read at all
    (EMFILE): the queue waits for a retry with everything else in its place."""
    h, _ = _paged_backlog()
    pairs = h.b.queues["q"].lanes[0].paged.take(8)
    h.b.queues["q"].lanes[0].paged.put_back(pairs)
    _failing_reads(h, {loc >> 1 for _seq, loc in pairs}, transient=True)
    c = h.channel()
    h.b.consume(c, "q", consumer_tag="c", prefetch=100)
    effects = h.step()
    assert h.bodies(effects) == [b"m0", b"m1"]
    delivered: list[bytes] = []
    for _ in range(READ_SET_ASIDE_ATTEMPTS + 3):
        delivered += h.bodies(h.sleep(READ_RETRY_MAX_S))
    assert delivered == []
    assert not h.of_type(MessageLost)
    h.b.read_log = h.read_log
    effects = h.sleep(2 * READ_RETRY_MAX_S)
    assert sorted(h.bodies(effects)) == sorted(b"m%d" % i for i in range(2, 10))
    assert h.b.queues["q"].read_failure is None
