"""Pending-confirm bookkeeping against random ack/nack/multiple/restart sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from client.codec import Properties, ReturnedMessage
from client.errors import PublishNacked, PublishRefused, PublishReturned
from client.pending import PendingConfirms, UnknownDeliveryTag
from client.publisher import PendingPublish, PublishTracker


class PendingMachine(RuleBasedStateMachine):
    """PendingConfirms against a plain-list model."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: PendingConfirms[int] = PendingConfirms()
        self.model: list[tuple[int, int]] = []  # (tag, entry) in tag order
        self.next_tag = 1
        self.next_entry = 0
        self.settled: list[int] = []

    @rule(n=st.integers(min_value=1, max_value=5))
    def add(self, n: int) -> None:
        for _ in range(n):
            tag = self.pending.add(self.next_entry)
            assert tag == self.next_tag
            self.model.append((tag, self.next_entry))
            self.next_tag += 1
            self.next_entry += 1

    @precondition(lambda self: self.next_tag > 1)
    @rule(data=st.data(), multiple=st.booleans())
    def settle(self, data: st.DataObject, multiple: bool) -> None:
        tag = data.draw(st.integers(min_value=1, max_value=self.next_tag - 1))
        got = self.pending.settle(tag, multiple=multiple)
        if multiple:
            expected = [(t, e) for t, e in self.model if t <= tag]
        else:
            expected = [(t, e) for t, e in self.model if t == tag]
        assert got == expected
        self.model = [(t, e) for t, e in self.model if (t, e) not in expected]
        self.settled += [e for _, e in got]

    @precondition(lambda self: self.next_tag > 1)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        tag = data.draw(st.integers(min_value=1, max_value=self.next_tag - 1))
        got = self.pending.remove(tag)
        expected = [e for t, e in self.model if t == tag]
        assert got == (expected[0] if expected else None)
        self.model = [(t, e) for t, e in self.model if t != tag]
        self.settled += expected

    @rule(offset=st.integers(min_value=0, max_value=3))
    def settle_unknown_tag(self, offset: int) -> None:
        for tag in (self.next_tag + offset, -offset):
            with pytest.raises(UnknownDeliveryTag):
                self.pending.settle(tag, multiple=True)

    @rule()
    def restart(self) -> None:
        entries = self.pending.restart()
        assert entries == [e for _, e in self.model]
        self.model = [(i + 1, e) for i, e in enumerate(entries)]
        self.next_tag = len(entries) + 1

    @invariant()
    def matches_model(self) -> None:
        assert list(self.pending) == self.model
        assert len(self.pending) == len(self.model)
        assert self.pending.next_tag == self.next_tag
        assert self.pending.first() == (self.model[0] if self.model else None)

    @invariant()
    def every_entry_settled_at_most_once_and_never_lost(self) -> None:
        assert len(self.settled) == len(set(self.settled))
        live = {e for _, e in self.model}
        assert not (live & set(self.settled))
        assert live | set(self.settled) == set(range(self.next_entry))


TestPendingMachine = PendingMachine.TestCase
TestPendingMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_single_settles_in_order_keep_no_trace() -> None:
    """A publisher confirmed one tag at a time (one-at-a-time publishing) holds no
    more than its pending entries, however long it runs."""
    pending: PendingConfirms[int] = PendingConfirms()
    for i in range(10_000):
        tag = pending.add(i)
        pending.add(i)  # one more in flight
        assert pending.settle(tag, multiple=False) == [(tag, i)]
        assert pending.settle(tag + 1, multiple=False) == [(tag + 1, i)]
        assert len(pending) == 0 and pending.first() is None
    assert len(pending._order) == 0  # the order of tags did not grow either


def test_multiple_settle_of_a_range_in_the_middle() -> None:
    pending: PendingConfirms[str] = PendingConfirms()
    for name in "abcdef":
        pending.add(name)
    assert pending.settle(2, multiple=False) == [(2, "b")]
    assert pending.settle(4, multiple=True) == [(1, "a"), (3, "c"), (4, "d")]
    assert pending.settle(4, multiple=True) == []
    assert pending.settle(3, multiple=False) == []
    assert list(pending) == [(5, "e"), (6, "f")]
    assert pending.restart() == ["e", "f"]
    assert list(pending) == [(1, "e"), (2, "f")]
    assert pending.add("g") == 3


# --- the tracker: outcomes of random confirm sequences --------------------------------

Step = tuple[str, int, bool]  # (kind, tag, multiple)


def _handle(i: int) -> PendingPublish:
    return PendingPublish(f"m{i}", i + 1, b"x" * 10)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(min_value=1, max_value=30))
def test_tracker_settles_every_publish_exactly_once(data: st.DataObject, n: int) -> None:
    tracker = PublishTracker(max_pending=1000, max_pending_bytes=10**9)
    handles = [_handle(i) for i in range(n)]
    tags = {tracker.add(h): h for h in handles}
    expected: dict[str, type | None] = {}
    unsettled = dict(tags)
    while unsettled:
        kind = data.draw(st.sampled_from(["ack", "nack", "return", "restart"]))
        tag = data.draw(st.sampled_from(sorted(unsettled)))
        multiple = data.draw(st.booleans())
        if kind == "restart":
            order = tracker.restart()
            assert [h.seq for h in order] == sorted(h.seq for h in order)
            tags = {i + 1: h for i, h in enumerate(order)}
            unsettled = dict(tags)  # returns are remembered across a restart
            continue
        if kind == "return":
            tracker.on_return(tag, 312, "NO_ROUTE", ReturnedMessage("", "k", b"", Properties()))
            assert tags[tag]._returned is not None
            continue
        covered = [t for t in sorted(unsettled) if (t <= tag if multiple else t == tag)]
        if kind == "ack":
            tracker.on_ack(tag, multiple)
            for t in covered:
                h = unsettled.pop(t)
                expected[h.message_id] = PublishReturned if h._returned else None
        else:
            tracker.on_nack(tag, multiple, "full")
            for t in covered:
                h = unsettled.pop(t)
                expected[h.message_id] = PublishNacked
        assert len(tracker) == len(unsettled)
    assert len(tracker) == 0 and tracker.pending_bytes == 0
    assert tracker.confirmed + tracker.failed == n
    for h in handles:
        assert h.done()
        want = expected[h.message_id]
        if want is None:
            assert h.exception() is None
        else:
            assert isinstance(h.exception(), want)
    failures = tracker.take_unobserved_failures()
    assert len(failures) == tracker.failed
    assert tracker.take_unobserved_failures() == []


def test_nack_reports_the_tag_and_reason() -> None:
    tracker = PublishTracker(max_pending=10, max_pending_bytes=1000)
    a, b = _handle(0), _handle(1)
    tracker.add(a)
    tracker.add(b)
    tracker.on_nack(2, False, "queue full")
    err = b.exception()
    assert isinstance(err, PublishNacked) and err.delivery_tag == 2 and err.reason == "queue full"
    assert err.message_id == "m1"
    assert not a.done()


def test_refuse_fails_one_publish_by_message_id() -> None:
    tracker = PublishTracker(max_pending=10, max_pending_bytes=1000)
    hs = [_handle(i) for i in range(3)]
    for h in hs:
        tracker.add(h)
    assert tracker.refuse("m1", "payload_too_large", "too big")
    assert not tracker.refuse("m1", "x", "y")
    assert isinstance(hs[1].exception(), PublishRefused)
    assert [h.message_id for h in tracker.restart()] == ["m0", "m2"]


def test_window_counts_messages_and_bytes() -> None:
    tracker = PublishTracker(max_pending=2, max_pending_bytes=25)
    assert tracker.has_room(10**6)  # anything fits when nothing is pending
    tracker.add(_handle(0))
    assert tracker.has_room(10) and not tracker.has_room(16)
    tracker.add(_handle(1))
    assert not tracker.has_room(1)
    tracker.on_ack(1, False)
    assert tracker.has_room(10)
