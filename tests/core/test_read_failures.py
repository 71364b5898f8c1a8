"""A failed read of a paged-out message never discards it.

Before: any read error (EMFILE, EIO, a transport error on a network file system) made
the core settle the message as lost, for good. Now the message keeps its place, its
queue delivers nothing more until a retry (with backoff) reads it, and a LogReadFailed
effect raises the alarm; only ``repair`` gives up on a record that is really
unreadable.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.core import LogReadFailed, MessageLost
from broker.core.pager import READ_RETRY_MIN_S

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


@pytest.mark.parametrize("transient", [True, False])
def test_a_failed_read_keeps_the_message_and_its_place_and_retries(transient: bool) -> None:
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


def test_with_repair_a_transient_failure_still_keeps_the_message() -> None:
    h, _ = _paged_backlog(repair=True)
    pairs = h.b.queues["q"].lanes[0].paged.take(8)
    h.b.queues["q"].lanes[0].paged.put_back(pairs)
    _failing_reads(h, {pairs[0][1] >> 1}, transient=True)
    c = h.channel()
    h.b.consume(c, "q", consumer_tag="c", prefetch=100)
    effects = h.step()
    assert h.bodies(effects) == [b"m0", b"m1"]
    assert h.of_type(LogReadFailed, effects) and not h.of_type(MessageLost, effects)
