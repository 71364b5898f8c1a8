"""Transactions: publishes and settles held until a commit applies them in one step
(one batch of records, kept in one write group), or a rollback discards them."""

from __future__ import annotations

import pytest

from broker.core import AppendRecords, ChannelError, Return

from .durable_view import fresh_broker, replay_into
from .helpers import Harness, ready_entries


def test_nothing_is_visible_or_settled_before_the_commit_and_all_of_it_after() -> None:
    h = Harness()
    h.queue("q")
    h.publish(0, "", "q", b"old")
    h.sync()
    ch = h.channel()
    h.b.consume(ch, "q")
    (d,) = h.delivers(h.step())
    h.b.tx_select(ch)
    tags = [h.publish(ch, "", "q", b"t%d" % i) for i in range(3)]
    h.b.ack(ch, d.delivery_tag)
    h.sync()
    assert h.info("q")["messages_unacked"] == 1 and h.info("q")["message_stats"]["published"] == 1
    assert all(h.confirm_of(ch, t) is None for t in tags)  # no confirm before the commit
    assert h.b.tx_commit(ch) == 4
    effects = h.step()
    appends = h.of_type(AppendRecords, effects)
    assert len(appends) == 1 and appends[0].together  # one batch, kept in one write group
    h.b.durable(h.b.last_lsn)
    h.step()
    assert all(h.acked(ch, t) for t in tags)
    stats = h.info("q")["message_stats"]
    assert (stats["acked"], stats["published"]) == (1, 4)  # "old" acked; the three went in


def test_rollback_nacks_the_publishes_and_forgets_the_settles() -> None:
    h = Harness()
    h.queue("q")
    h.publish(0, "", "q", b"m")
    h.sync()
    ch = h.channel()
    h.b.consume(ch, "q")
    (d,) = h.delivers(h.step())
    h.b.tx_select(ch)
    tag = h.publish(ch, "", "q", b"never")
    h.b.ack(ch, d.delivery_tag)
    assert h.b.tx_rollback(ch) == 2
    h.sync()
    assert h.nacked(ch, tag) and h.confirm_of(ch, tag) == (False, "transaction rolled back")
    assert h.info("q")["messages_unacked"] == 1  # still out with the consumer
    assert [e.message.body for e in ready_entries(h.b, "q")] == []
    # the next transaction starts at once
    h.b.ack(ch, d.delivery_tag)
    h.b.tx_commit(ch)
    h.sync()
    assert h.info("q")["messages_unacked"] == 0


def test_a_crash_before_or_after_the_commit_batch_leaves_all_or_nothing() -> None:
    h = Harness()
    h.queue("q")
    h.sync()
    ch = h.channel()
    h.b.tx_select(ch)
    for i in range(5):
        h.publish(ch, "", "q", b"t%d" % i)
    h.step()
    before = len(h.records)
    h.b.tx_commit(ch)
    h.sync()
    assert len(h.records) > before
    for cut, expected in ((before, []), (len(h.records), [b"t%d" % i for i in range(5)])):
        records = h.records[:cut]
        nb = replay_into(fresh_broker(h), records, records[-1][0])
        assert [e.message.body for e in ready_entries(nb, "q")] == expected


def test_wrong_states_and_stale_settles_are_refused_and_change_nothing() -> None:
    h = Harness()
    h.queue("q")
    for i in range(3):
        h.publish(0, "", "q", b"m%d" % i)
    h.sync()
    ch = h.channel()
    with pytest.raises(ChannelError, match="tx_select first"):
        h.b.tx_commit(ch)
    with pytest.raises(ChannelError, match="not transactional"):
        h.b.tx_rollback(ch)
    h.publish(ch, "", "q", b"unconfirmed")
    with pytest.raises(ChannelError, match="not all confirmed"):
        h.b.tx_select(ch)
    h.sync()
    h.b.tx_select(ch)
    with pytest.raises(ChannelError, match="already transactional"):
        h.b.tx_select(ch)
    h.b.consume(ch, "q", prefetch=3)
    d1, d2, d3 = h.delivers(h.step())[:3]
    with pytest.raises(ChannelError):
        h.b.ack(ch, 999)  # an unknown tag is refused when it is given
    h.b.ack(ch, d3.delivery_tag, multiple=True)
    h.b.ack(ch, d1.delivery_tag)  # taken already by the multiple ack before it
    with pytest.raises(ChannelError, match="settled earlier in this transaction"):
        h.b.tx_commit(ch)
    h.sync()
    assert h.info("q")["messages_unacked"] == 3  # nothing was applied


def test_a_commit_holds_the_confirms_of_publishes_forwarded_elsewhere() -> None:
    """A cluster forwards some of a transaction's publishes at the commit
    (``elsewhere``): their confirms wait for the other nodes' answers, and one that
    reaches no queue here is not returned as unroutable."""
    h = Harness()
    h.queue("q")
    ch = h.channel()
    h.b.tx_select(ch)
    local = h.publish(ch, "", "q", b"here")
    away = h.b.publish(ch, "", "on-another-node", b"there", mandatory=True)[0]
    assert [p[:3] for p in h.b.tx_publishes(ch)] == [(local, "", "q"), (away, "", "on-another-node")]
    assert h.b.tx_commit(ch, {away: 1}) == 2
    h.b.durable(h.b.last_lsn)
    effects = h.step()
    assert not h.of_type(Return, effects)
    assert h.acked(ch, local) and h.confirm_of(ch, away) is None  # waits for the other node
    h.b.settle_held_confirm(ch, away, False, "queue_unavailable: node 'b' is down")
    h.step()
    assert h.confirm_of(ch, away) == (False, "queue_unavailable: node 'b' is down")
