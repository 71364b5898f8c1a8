"""A dead letter held for other nodes (``hold_dead_letters``, docs/cluster.md "Dead
letters across nodes") across a checkpoint and a restart: held, it is an unacked
delivery of its source queue, so a checkpoint keeps it with the queue's other unacked
messages and a restart from that checkpoint finds it back in its source queue
(delivered once, so redelivered), with its local copy (if any) once, not lost and not
doubled; a dead letter settled before the checkpoint is gone from it."""

from __future__ import annotations

from typing import Any

from broker.core import Broker, DeadLetterHeld, Deliver

from .durable_view import fresh_broker, replay_into
from .helpers import Harness, ready_entries


class _Routes:
    """The cluster's answer: every dead letter reaches other nodes' queues too (and no
    queue here needs a majority)."""

    def reaches_other_nodes(self, exchange: str, routing_key: str, properties: dict[str, Any]) -> bool:
        return True

    def needs_majority(self, queue: str) -> bool:
        return False


def _from_checkpoint(h: Harness) -> Broker:
    """A restart from a checkpoint taken now (chunked as small as can be), with no
    log after it."""
    covered, chunks = h.b.snapshot(chunk_entries=1)
    records = [(0, rtype, payload) for chunk in chunks for rtype, payload in chunk]
    return replay_into(fresh_broker(h), records, covered)


def _held(h: Harness, *, local_copy: bool) -> tuple[int, DeadLetterHeld]:
    """``work`` dead-letters to ``dlx`` (bound to ``dead`` here when ``local_copy``);
    m1 rejected and held, m2 with a consumer. Returns (holding channel, the hold)."""
    h.b.declare_exchange("dlx", "direct")
    if local_copy:
        h.queue("dead")
        h.b.bind("dlx", "dead", "work")
    h.queue("work", arguments={"x-dead-letter-exchange": "dlx"})
    holder = h.channel()
    h.b.hold_dead_letters(holder, _Routes())
    for body in (b"m1", b"m2"):
        h.publish(0, "", "work", body)
    h.sync()
    ch = h.channel()
    h.b.consume(ch, "work")
    d1, _d2 = (e for e in h.step() if isinstance(e, Deliver))
    h.b.reject(ch, d1.delivery_tag, requeue=False)
    (held,) = [e for e in h.step() if isinstance(e, DeadLetterHeld)]
    h.sync()
    return holder, held


def test_a_held_dead_letter_is_in_a_checkpoint_and_back_in_its_source_after_a_restart() -> None:
    for local_copy in (False, True):
        h = Harness()
        _holder, held = _held(h, local_copy=local_copy)
        assert held.body == b"m1" and held.local is local_copy
        nb = _from_checkpoint(h)
        back = {e.message.body: e.deliveries for e in ready_entries(nb, "work")}
        assert back == {b"m1": 1, b"m2": 1}, local_copy  # both unsettled, both delivered once
        if local_copy:
            assert [e.message.body for e in ready_entries(nb, "dead")] == [b"m1"]  # once
        # the restarted node's cluster holds again: dead-lettered anew, it is held again
        holder2 = nb.open_channel()
        nb.hold_dead_letters(holder2, _Routes())
        ch = nb.open_channel()
        nb.consume(ch, "work", prefetch=1)
        (d,) = [e for e in nb.take_effects() if isinstance(e, Deliver)]
        assert d.message.body == b"m1" and d.redelivered
        nb.reject(ch, d.delivery_tag, requeue=False)
        (again,) = [e for e in nb.take_effects() if isinstance(e, DeadLetterHeld)]
        assert again.body == b"m1" and again.channel_id == holder2


def test_a_held_dead_letter_settled_before_a_checkpoint_is_not_in_it() -> None:
    h = Harness()
    holder, held = _held(h, local_copy=True)
    assert h.b.settle_held_dead_letter(holder, held.delivery_tag) is True
    h.sync()
    nb = _from_checkpoint(h)
    assert [e.message.body for e in ready_entries(nb, "work")] == [b"m2"]
    assert [e.message.body for e in ready_entries(nb, "dead")] == [b"m1"]
