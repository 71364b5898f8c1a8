"""A refused publish's held confirm (heldletters.py ``hold_confirm``,
confirms.py ``ConfirmTracker.hold`` adding up): a ``reject-publish-dlx`` publish whose
dead letter the cluster holds, and which is also forwarded to another node's queue
(the gateway's ``hold_confirm`` on top), has exactly one confirm, a nack, once every
answer is in, in either order; in a transaction too."""

from __future__ import annotations

from typing import Any

import pytest

from broker.core.effects import Confirm, DeadLetterHeld

from .helpers import Harness


class _Routes:
    """A cluster's answer: every dead letter reaches other nodes' queues too."""

    def reaches_other_nodes(self, exchange: str, routing_key: str, properties: dict[str, Any]) -> bool:
        return True

    def needs_majority(self, queue: str) -> bool:
        return False


def _setup() -> tuple[Harness, int]:
    h = Harness()
    h.b.declare_exchange("dlx", "fanout")
    h.b.declare_queue("dead")
    h.b.bind("dlx", "dead", "")
    h.b.declare_queue(
        "work", arguments={"x-dead-letter-exchange": "dlx", "x-max-length": 1, "x-overflow": "reject-publish-dlx"}
    )
    h.b.hold_dead_letters(h.channel(), _Routes())
    pub = h.channel()
    h.publish(pub, "", "work", b"fills it")
    h.sync()
    return h, pub


def _confirms(h: Harness, pub: int) -> list[Confirm]:
    return [e for e in h.effects if isinstance(e, Confirm) and e.channel_id == pub]


@pytest.mark.parametrize("forward_first", [True, False])
@pytest.mark.parametrize("forward_ack", [True, False])
def test_a_refused_and_forwarded_publish_has_one_nack_after_every_answer(forward_first: bool, forward_ack: bool) -> None:
    h, pub = _setup()
    before = len(_confirms(h, pub))
    tag = h.publish(pub, "", "work", b"refused here, sent elsewhere too")
    assert h.b.hold_confirm(pub, tag, 1) == tag  # (the gateway, forwarding it to one owner)
    (held,) = [e for e in h.step() if isinstance(e, DeadLetterHeld)]
    assert (held.refused, held.delivery_tag) == (True, tag)
    h.sync()
    answers = [
        lambda: h.b.settle_held_confirm(pub, tag, forward_ack, None if forward_ack else "refused there"),
        lambda: h.b.settle_held_confirm(pub, held.delivery_tag, True, None),  # its dead letter taken
    ]
    if not forward_first:
        answers.reverse()
    answers[0]()
    h.sync()
    assert h.confirm_of(pub, tag) is None  # one answer is still out
    answers[1]()
    h.sync()
    assert h.nacked(pub, tag)
    assert len(_confirms(h, pub)) == before + 1  # exactly one confirm
    ack, reason = h.confirm_of(pub, tag) or (True, None)
    assert "full" in str(reason)  # the queue's refusal, whatever the owner said


def test_a_transactions_refused_and_forwarded_publish_has_one_nack_after_every_answer() -> None:
    h, pub = _setup()
    before = len(_confirms(h, pub))
    h.b.tx_select(pub)
    tag = h.publish(pub, "", "work", b"in tx")
    h.b.tx_commit(pub, {tag: 1})  # (forwarded to one owner at the commit)
    (held,) = [e for e in h.step() if isinstance(e, DeadLetterHeld)]
    assert (held.refused, held.delivery_tag) == (True, tag)
    h.sync()
    h.b.settle_held_confirm(pub, tag, True, None)  # the owner's ack
    h.sync()
    assert h.confirm_of(pub, tag) is None
    h.b.settle_held_confirm(pub, tag, True, None)  # its dead letter taken
    h.sync()
    assert h.nacked(pub, tag) and len(_confirms(h, pub)) == before + 1


def test_a_held_dead_letters_copy_skips_gone_queues_and_a_failing_log() -> None:
    """``copy_held_dead_letter`` (the cluster's copy into quorum queues it leads): one
    record per queue, whose LSN the cluster watches; a deleted queue left out (nothing
    to copy into); nothing at all while storage is failing (tried again later)."""
    h = Harness()
    for name in ("q1", "q2", "gone"):
        h.b.declare_queue(name, durable=True)
    h.b.delete_queue("gone")
    h.sync()
    made = h.b.copy_held_dead_letter(["q1", "gone", "q2"], "dlx", "k", b"dead", {"delivery_mode": 2})
    assert [name for name, _ in made] == ["q1", "q2"]
    lsns = [lsn for _, lsn in made]
    assert all(lsns) and len(set(lsns)) == 2  # (each watched on its own)
    h.sync()
    assert h.b.queues["q1"].ready_count() == h.b.queues["q2"].ready_count() == 1
    h.b.storage_failed(h.b.last_lsn + 1, h.b.last_lsn + 1, "disk on fire")
    assert h.b.copy_held_dead_letter(["q1"], "dlx", "k", b"again", {}) == []
    assert h.b.queues["q1"].ready_count() == 1
