"""Failure handling in the core: delivery counts, delivery limits, dead letters with
their x-death history, delays, TTL expiry on time, redrive, browse, strict arguments."""

from __future__ import annotations

from typing import Any

import pytest

from broker.core import Deliver, InvalidArgument, RecordType
from broker.core.delayed import DelayedMessages
from broker.core.effects import DeadLetterDropped, DeadLetterHeld

from .durable_view import durable_view, fresh_broker, replay_into, restart_from_log
from .helpers import Harness, ready_entries

DLX = {"x-dead-letter-exchange": "dlx"}


def with_dlq(h: Harness, queue: str = "work", **arguments: Any) -> None:
    """``queue`` dead-letters to fanout exchange ``dlx``, bound to queue ``dead``."""
    h.b.declare_exchange("dlx", "fanout")
    h.queue("dead")
    h.b.bind("dlx", "dead")
    h.queue(queue, arguments={**DLX, **arguments})


def consuming(h: Harness, queue: str, *bodies: bytes) -> int:
    """Publish ``bodies`` to ``queue`` (confirmed), then consume it on a new channel."""
    for body in bodies:
        h.publish(0, "", queue, body)
    h.sync()
    ch = h.channel()
    h.b.consume(ch, queue)
    return ch


def deliver_one(h: Harness, ch: int) -> Deliver:
    (d,) = h.delivers(h.step(), ch)
    return d


def headers_of(h: Harness, queue: str) -> list[dict[str, Any]]:
    return [(e.message.properties or {}).get("headers") or {} for e in ready_entries(h.b, queue)]


# -- delivery counts ----------------------------------------------------------------


def test_delivery_count_counts_every_way_a_delivery_comes_back() -> None:
    h = Harness(consumer_timeout_s=10.0)
    h.queue("q")
    ch = consuming(h, "q", b"m")
    d = deliver_one(h, ch)
    assert (d.delivery_count, d.redelivered) == (0, False)
    h.b.nack(ch, d.delivery_tag)  # nack with requeue
    d = deliver_one(h, ch)
    assert (d.delivery_count, d.redelivered) == (1, True)
    h.b.reject(ch, d.delivery_tag, requeue=True)
    d = deliver_one(h, ch)
    assert d.delivery_count == 2
    (d,) = h.delivers(h.sleep(11), ch)  # the ack timeout expires: back, then out again
    assert d.delivery_count == 3
    h.b.close_channel(ch)  # the channel ends with it unacked
    h.step()
    (lease_id, delivery, redelivered), = h.b.get("q", 1, 1.0)
    assert redelivered and delivery.entry.deliveries == 5  # this REST get is the 5th delivery
    h.sleep(2)  # the lease expires
    (_lid, delivery, _r), = h.b.get("q", 1, 1.0)
    assert delivery.entry.deliveries == 6


def test_delivery_counts_survive_a_restart_from_the_log_and_from_a_checkpoint() -> None:
    h = Harness(queue_memory_messages=1)
    h.queue("q")
    for i in range(3):
        h.publish(0, "", "q", b"m%d" % i)
    h.sync()
    ch = h.channel()
    tag = h.b.consume(ch, "q", prefetch=1)
    for _ in range(3):  # m0 delivered three times
        d = deliver_one(h, ch)
        h.b.nack(ch, d.delivery_tag)
    h.b.cancel(ch, tag)
    h.sync()
    counts = [e.deliveries for e in ready_entries(h.b, "q")]
    assert counts[0] == 3
    nb = restart_from_log(h)
    assert [e.deliveries for e in ready_entries(nb, "q")] == counts
    covered, chunks = h.b.snapshot(chunk_entries=1)
    records = [(0, rtype, payload) for chunk in chunks for rtype, payload in chunk]
    assert any(rtype == RecordType.DELIVERY_COUNTS for _l, rtype, _p in records)
    nb = replay_into(fresh_broker(h), records, covered)
    assert durable_view(nb) == durable_view(h.b)
    ch2 = nb.open_channel()
    nb.consume(ch2, "q")
    first = [e for e in nb.take_effects() if isinstance(e, Deliver)][0]
    assert first.delivery_count == 3


# -- delivery limit and dead letters --------------------------------------------------


def test_delivery_limit_dead_letters_with_history_and_never_delivers_again() -> None:
    h = Harness()
    with_dlq(h, "work", **{"x-delivery-limit": 2})
    h.publish(0, "", "work", b"poison", {"headers": {"k": "v"}, "expiration": 60_000})
    ch = consuming(h, "work")
    for attempt in range(3):  # delivered 3 times: 1 + 2 allowed redeliveries
        d = deliver_one(h, ch)
        assert d.delivery_count == attempt
        h.b.nack(ch, d.delivery_tag)
    assert h.delivers(h.step(), ch) == []
    assert h.info("work")["messages"] == 0
    (entry,) = ready_entries(h.b, "dead")
    props = entry.message.properties
    assert "expiration" not in props  # it must not expire again for the same reason
    headers = props["headers"]
    assert headers["k"] == "v"
    (death,) = headers["x-death"]
    assert death == {
        "queue": "work", "reason": "delivery_limit", "count": 1, "time": int(h.wall.now),
        "exchange": "", "routing-keys": ["work"], "original-expiration": "60000",
    }
    assert headers["x-first-death-queue"] == headers["x-last-death-queue"] == "work"
    assert headers["x-first-death-reason"] == "delivery_limit"
    assert entry.message.body == b"poison" and entry.deliveries == 0
    assert h.info("work")["message_stats"]["dead_lettered"] == {"delivery_limit": 1}


def test_delivery_limit_without_dead_letter_exchange_drops() -> None:
    h = Harness()
    h.queue("q", arguments={"x-delivery-limit": 0})
    ch = consuming(h, "q", b"m")
    h.b.nack(ch, deliver_one(h, ch).delivery_tag)
    h.sync()
    assert h.info("q")["messages"] == 0
    assert restart_from_log(h).queues["q"].ready_count() == 0


def test_reject_without_requeue_dead_letters_with_the_routing_key_argument() -> None:
    h = Harness()
    h.b.declare_exchange("dlx", "direct")
    h.queue("dead")
    h.b.bind("dlx", "dead", "failed")
    h.queue("work", arguments={**DLX, "x-dead-letter-routing-key": "failed"})
    ch = consuming(h, "work", b"m")
    h.b.reject(ch, deliver_one(h, ch).delivery_tag, requeue=False)
    h.sync()
    (headers,) = headers_of(h, "dead")
    assert headers["x-death"][0]["reason"] == "rejected"
    assert ready_entries(h.b, "dead")[0].message.routing_key == "failed"
    # the move is one MOVE record, and a restart sees the message in one place only
    assert any(r[1] == RecordType.MOVE for r in h.records)
    nb = restart_from_log(h)
    assert (nb.queues["work"].ready_count(), nb.queues["dead"].ready_count()) == (0, 1)


def test_a_held_dead_letter_stays_in_its_queue_until_settled_or_its_holder_ends() -> None:
    """A cluster holds the dead letters that route to no queue of this core
    (``hold_dead_letters``): unsettled in their source queue, announced, settled once
    another node took them; back in the queue when the holding channel ends, and
    after a restart from the log."""
    h = Harness()
    h.b.declare_exchange("dlx", "direct")  # bound to no queue of this core
    h.queue("work", arguments=DLX)
    holder = h.channel()
    h.b.hold_dead_letters(holder)
    assert h.b.totals()["channels"] == 0  # the holding channel is not listed
    ch = consuming(h, "work", b"m1", b"m2")
    d1, d2 = h.delivers(h.step(), ch)
    h.b.reject(ch, d1.delivery_tag, requeue=False)
    (held,) = h.of_type(DeadLetterHeld, h.step())
    assert (held.channel_id, held.queue, held.exchange, held.body) == (holder, "work", "dlx", b"m1")
    assert held.properties["headers"]["x-death"][0]["reason"] == "rejected"
    h.sync()
    assert h.info("work")["messages_unacked"] == 2  # m1 held, m2 with the consumer
    assert restart_from_log(h).queues["work"].ready_count() == 2  # nothing settled yet
    assert h.b.settle_held_dead_letter(holder, held.delivery_tag) is True
    h.sync()
    assert h.info("work")["messages_unacked"] == 1 and restart_from_log(h).queues["work"].ready_count() == 1
    # m2: held, then the holder ends: back in its queue (and to the consumer)
    h.b.reject(ch, d2.delivery_tag, requeue=False)
    (held,) = h.of_type(DeadLetterHeld, h.step())
    h.b.close_channel(holder)
    assert h.b.totals()["channels"] == 1  # the consumer's; the closed holder is not counted twice
    assert h.b.settle_held_dead_letter(holder, held.delivery_tag) is False
    (again,) = h.delivers(h.step(), ch)
    assert again.message.body == b"m2"
    # without a holder, a dead letter routing nowhere here is dropped (a single node)
    h.b.hold_dead_letters(None)
    h.b.reject(ch, again.delivery_tag, requeue=False)
    assert h.of_type(DeadLetterDropped, h.step())
    h.sync()
    assert h.info("work")["messages"] == 0


class _Routes:
    """A cluster's answers: does this dead letter reach other nodes' queues too, and
    which queues here keep a copy only once a majority of their replicas has it."""

    def __init__(self, answer: bool, majority: tuple[str, ...] = ()) -> None:
        self.answer = answer
        self.majority = majority
        self.asked: list[tuple[str, str]] = []
        self.asked_majority: list[str] = []

    def reaches_other_nodes(self, exchange: str, routing_key: str, properties: dict[str, Any]) -> bool:
        self.asked.append((exchange, routing_key))
        return self.answer

    def needs_majority(self, queue: str) -> bool:
        self.asked_majority.append(queue)
        return queue in self.majority


def test_a_dead_letter_reaching_queues_here_and_elsewhere_goes_here_at_once_and_is_held_for_the_rest() -> None:
    """A dead letter bound to a queue of this core and (the cluster's routes say) to
    queues of other nodes: the local queue gets it at once, with its x-death; its
    source keeps it, held, until the other nodes took it; a restart before that finds
    the source message back and the local copy once (the next dead-lettering adds a
    second copy whose x-death count says so)."""
    h = Harness()
    with_dlq(h)
    holder = h.channel()
    routes = _Routes(True)
    h.b.hold_dead_letters(holder, routes)
    ch = consuming(h, "work", b"m1", b"m2")
    d1, d2 = h.delivers(h.step(), ch)
    h.b.reject(ch, d1.delivery_tag, requeue=False)
    (held,) = h.of_type(DeadLetterHeld, h.step())
    assert routes.asked == [("dlx", "work")]
    assert (held.channel_id, held.queue, held.exchange, held.body, held.local) == (holder, "work", "dlx", b"m1", True)
    (here,) = headers_of(h, "dead")
    assert here["x-death"][0]["reason"] == "rejected" and here["x-death"][0]["count"] == 1
    assert held.properties["headers"]["x-death"] == here["x-death"]
    h.sync()
    assert h.info("work")["messages_unacked"] == 2  # m1 held, m2 with the consumer
    # a crash now: the local copy is in the log, the source was never settled
    nb = restart_from_log(h)
    assert (nb.queues["work"].ready_count(), nb.queues["dead"].ready_count()) == (2, 1)
    # the other nodes took it: settled in its source
    assert h.b.settle_held_dead_letter(holder, held.delivery_tag) is True
    h.sync()
    assert h.info("work")["messages_unacked"] == 1
    nb = restart_from_log(h)
    assert (nb.queues["work"].ready_count(), nb.queues["dead"].ready_count()) == (1, 1)
    # the routes say "nowhere else": one MOVE, nothing held (a single node's way)
    routes.answer = False
    h.b.reject(ch, d2.delivery_tag, requeue=False)
    assert h.of_type(DeadLetterHeld, h.step()) == []
    h.sync()
    assert h.info("work")["messages"] == 0 and h.info("dead")["messages"] == 2
    # a single node never asks
    h.b.hold_dead_letters(None)
    asked = len(routes.asked)
    h.publish(0, "", "work", b"m3")
    (d3,) = h.delivers(h.step(), ch)
    h.b.reject(ch, d3.delivery_tag, requeue=False)
    h.step()
    assert len(routes.asked) == asked and h.info("dead")["messages"] == 3


def test_a_dead_letter_reaching_a_queue_kept_by_a_majority_is_held_and_copied_there_by_the_cluster() -> None:
    """A quorum queue this node leads (the routes say it needs a majority) gets no copy
    in the dead-lettering step: the source is held, the other local queue gets its copy
    at once, and the effect names the queue still awaiting. ``copy_held_dead_letter``
    makes that copy (an ENQUEUE record of its own, whose LSN the cluster watches for
    the majority), the source staying held until settled; a crash before the copy
    finds the source message back and the quorum queue without it."""
    h = Harness()
    with_dlq(h)  # fanout dlx -> "dead" (a classic queue here)
    h.queue("quorum-dlq")
    h.b.bind("dlx", "quorum-dlq")
    holder = h.channel()
    routes = _Routes(False, majority=("quorum-dlq",))
    h.b.hold_dead_letters(holder, routes)
    ch = consuming(h, "work", b"m1", b"m2")
    d1, d2 = h.delivers(h.step(), ch)
    h.b.reject(ch, d1.delivery_tag, requeue=False)
    (held,) = h.of_type(DeadLetterHeld, h.step())
    assert sorted(routes.asked_majority) == ["dead", "quorum-dlq"]
    assert (held.channel_id, held.queue, held.awaiting, held.local) == (holder, "work", ("quorum-dlq",), True)
    assert (h.info("dead")["messages"], h.info("quorum-dlq")["messages"]) == (1, 0)
    h.sync()
    assert h.info("work")["messages_unacked"] == 2  # m1 held, m2 with the consumer
    nb = restart_from_log(h)  # a crash before the copy: the source has it, the quorum queue not
    assert (nb.queues["work"].ready_count(), nb.queues["quorum-dlq"].ready_count()) == (2, 0)
    # the cluster makes the copy: one ENQUEUE record into that queue alone
    made = h.b.copy_held_dead_letter(list(held.awaiting), held.exchange, held.routing_key, held.body, held.properties)
    h.step()
    ((name, lsn),) = made
    assert name == "quorum-dlq" and h.log[lsn][0] == RecordType.ENQUEUE
    assert [r for r in h.records if r[0] > lsn] == []  # nothing settled the source with it
    (copy,) = ready_entries(h.b, "quorum-dlq")
    assert copy.message.body == b"m1" and copy.message.properties["headers"]["x-death"] == held.properties["headers"]["x-death"]
    assert h.info("work")["messages_unacked"] == 2 and h.info("dead")["messages"] == 1
    # its majority has it: the source is settled
    assert h.b.settle_held_dead_letter(holder, held.delivery_tag) is True
    h.sync()
    nb = restart_from_log(h)
    assert [nb.queues[q].ready_count() for q in ("work", "dead", "quorum-dlq")] == [1, 1, 1]
    # a queue gone, or storage failing: no copy made (the cluster tries again)
    assert h.b.copy_held_dead_letter(["nope"], held.exchange, held.routing_key, held.body, held.properties) == []
    # no queue that needs a majority, nothing elsewhere: one MOVE, as on a single node
    routes.majority = ()
    h.b.reject(ch, d2.delivery_tag, requeue=False)
    assert h.of_type(DeadLetterHeld, h.step()) == []
    h.sync()
    assert [h.info(q)["messages"] for q in ("work", "dead", "quorum-dlq")] == [0, 2, 2]
    # a single node never asks
    h.b.hold_dead_letters(None)
    asked = len(routes.asked_majority)
    h.publish(0, "", "work", b"m3")
    (d3,) = h.delivers(h.step(), ch)
    h.b.reject(ch, d3.delivery_tag, requeue=False)
    h.step()
    assert len(routes.asked_majority) == asked and h.info("quorum-dlq")["messages"] == 3


def test_a_dead_letter_held_for_other_nodes_is_back_in_its_source_after_a_restart_and_not_copied_here_twice() -> None:
    """The source node restarts before the other nodes confirmed: the source message is
    back in its queue (nothing settled it: never lost), marked redelivered when it had
    been delivered; dead-lettered again, it is held for the other nodes again, but the
    local queue, which has its copy from before (in the log, with its deduplication
    key), is not given a second one. Past the deduplication window it would be (at
    least once, docs/cluster.md)."""
    for window_s, copies in ((120.0, 1), (0.0, 2)):
        h = Harness(dedup_window_s=window_s)
        with_dlq(h)
        holder = h.channel()
        h.b.hold_dead_letters(holder, _Routes(True))
        h.publish(0, "", "work", b"m1", {"message_id": "id-1"})
        h.sync()
        ch = h.channel()
        h.b.consume(ch, "work")
        (d1,) = h.delivers(h.step(), ch)
        h.b.reject(ch, d1.delivery_tag, requeue=False)
        assert h.of_type(DeadLetterHeld, h.step())
        h.sync()
        nb = restart_from_log(h, dedup_window_s=window_s)
        holder2 = nb.open_channel()
        nb.hold_dead_letters(holder2, _Routes(True))
        ch2 = nb.open_channel()
        nb.consume(ch2, "work")
        (d,) = [e for e in nb.take_effects() if isinstance(e, Deliver)]
        assert d.redelivered  # it was delivered before the crash
        nb.reject(ch2, d.delivery_tag, requeue=False)
        (held,) = [e for e in nb.take_effects() if isinstance(e, DeadLetterHeld)]
        assert held.properties["message_id"] == "id-1" and held.local
        here = [e.message.properties or {} for e in ready_entries(nb, "dead")]
        assert [p["message_id"] for p in here] == ["id-1"] * copies, window_s
        assert nb.settle_held_dead_letter(holder2, held.delivery_tag)
        nb.take_effects()
        assert nb.queues["work"].ready_count() == 0 and nb.queues["dead"].ready_count() == copies


def test_a_dead_letter_move_is_atomic_at_every_point_of_the_log() -> None:
    h = Harness()
    with_dlq(h)
    for i in range(5):
        h.publish(0, "", "work", b"m%d" % i)
    h.sync()
    setup = len(h.records)
    ch = h.channel()
    h.b.consume(ch, "work")
    for d in h.delivers(h.step(), ch):
        h.b.nack(ch, d.delivery_tag, requeue=False)
        h.step()
    h.sync()
    assert len(h.records) > setup
    # a crash after any record: every message is in exactly one of the two queues
    for cut in range(setup, len(h.records) + 1):
        records = h.records[:cut]
        nb = replay_into(fresh_broker(h), records, records[-1][0])
        bodies = [e.message.body for q in ("work", "dead") for e in ready_entries(nb, q)]
        assert sorted(bodies) == [b"m%d" % i for i in range(5)], cut
    assert [e.message.body for e in ready_entries(nb, "dead")] == [b"m%d" % i for i in range(5)]


def test_expired_messages_leave_on_time_and_are_dead_lettered() -> None:
    h = Harness()
    with_dlq(h, "work", **{"x-message-ttl": 5000})
    h.publish(0, "", "work", b"old")
    h.sleep(3)
    h.publish(0, "", "work", b"new")
    h.sync()
    assert h.info("work")["messages_ready"] == 2
    assert h.b.next_deadline() is not None
    h.sleep(2.5)  # "old" expires with nobody consuming
    assert h.info("work")["messages_ready"] == 1
    assert [e.message.body for e in ready_entries(h.b, "dead")] == [b"old"]
    assert headers_of(h, "dead")[0]["x-death"][0]["reason"] == "expired"
    h.sleep(3)
    assert h.info("work")["messages_ready"] == 0
    assert h.info("work")["message_stats"]["dead_lettered"] == {"expired": 2}


def test_maxlen_drop_head_dead_letters_the_oldest() -> None:
    h = Harness()
    with_dlq(h, "work", **{"x-max-length": 2})
    for i in range(4):
        h.publish(0, "", "work", b"m%d" % i)
    h.sync()
    assert [e.message.body for e in ready_entries(h.b, "work")] == [b"m2", b"m3"]
    assert [e.message.body for e in ready_entries(h.b, "dead")] == [b"m0", b"m1"]
    assert {hd["x-death"][0]["reason"] for hd in headers_of(h, "dead")} == {"maxlen"}


@pytest.mark.parametrize("limit", [{"x-max-length": 2}, {"x-max-length-bytes": 4}])
def test_a_requeue_past_the_length_limit_drops_from_the_head(limit: dict[str, int]) -> None:
    """RabbitMQ applies drop-head after a requeue too: unacked messages take no room,
    but once back they count, and the oldest (the requeued ones) go."""
    h = Harness()
    with_dlq(h, "work", **limit)
    ch = consuming(h, "work", b"m0", b"m1")
    tags = [d.delivery_tag for d in h.delivers(h.step(), ch)]
    h.b.cancel(ch, next(iter(h.b.deliveries.channels[ch].consumers)))
    for body in (b"m2", b"m3"):
        h.publish(0, "", "work", body)
    h.sync()
    assert [e.message.body for e in ready_entries(h.b, "work")] == [b"m2", b"m3"]
    h.b.nack(ch, tags[-1], True, True)
    h.sync()
    assert [e.message.body for e in ready_entries(h.b, "work")] == [b"m2", b"m3"]
    assert [e.message.body for e in ready_entries(h.b, "dead")] == [b"m0", b"m1"]
    assert {hd["x-death"][0]["reason"] for hd in headers_of(h, "dead")} == {"maxlen"}


def test_reject_publish_dlx_nacks_and_dead_letters() -> None:
    h = Harness()
    with_dlq(h, "work", **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    t1 = h.publish(0, "", "work", b"kept")
    t2 = h.publish(0, "", "work", b"refused")
    h.sync()
    assert h.acked(0, t1) and h.nacked(0, t2)
    assert [e.message.body for e in ready_entries(h.b, "dead")] == [b"refused"]


def test_a_refused_publish_s_dead_letter_held_by_a_cluster_holds_its_nack_not_the_full_queue() -> None:
    """``reject-publish-dlx`` in a cluster whose routes say the dead letter reaches other
    nodes (or a quorum queue here): the message was never in the refusing queue, so
    nothing is held there; the publish's confirm (its nack) is held instead, and leaves
    only once the cluster settles it. Later publishes' confirms wait behind it (in tag
    order); so is a transaction's, at its commit; a single node nacks at once."""
    h = Harness()
    with_dlq(h, "work", **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    h.queue("other")
    holder = h.channel()
    routes = _Routes(True)
    h.b.hold_dead_letters(holder, routes)
    pub = h.channel()
    t1 = h.publish(pub, "", "work", b"kept")
    t2 = h.publish(pub, "", "work", b"refused")
    t3 = h.publish(pub, "", "other", b"after")
    (held,) = h.of_type(DeadLetterHeld, h.step())
    assert (held.refused, held.channel_id, held.delivery_tag, held.queue, held.body) == (True, pub, t2, "work", b"refused")
    assert held.local  # the dead-letter queue here has its copy at once
    h.sync()
    assert [e.message.body for e in ready_entries(h.b, "dead")] == [b"refused"]
    assert h.info("work")["messages"] == 1 and h.info("work")["messages_unacked"] == 0  # nothing held there
    assert h.acked(pub, t1) and h.confirm_of(pub, t2) is None and h.confirm_of(pub, t3) is None
    h.b.settle_held_confirm(pub, t2, True, None)  # taken elsewhere: the nack leaves, then t3's ack
    h.sync()
    ack, reason = h.confirm_of(pub, t2) or (True, None)
    assert not ack and "full" in str(reason) and h.acked(pub, t3)
    nb = restart_from_log(h)  # the refused message is in no queue but the dead-letter queue
    assert (nb.queues["work"].ready_count(), nb.queues["dead"].ready_count()) == (1, 1)
    # reaching a queue here that needs a majority: held the same way, that copy awaited
    routes.answer, routes.majority = False, ("dead",)
    t4 = h.publish(pub, "", "work", b"refused-2")
    (held,) = h.of_type(DeadLetterHeld, h.step())
    assert (held.refused, held.delivery_tag, held.awaiting, held.local) == (True, t4, ("dead",), False)
    h.sync()
    assert h.confirm_of(pub, t4) is None
    h.b.settle_held_confirm(pub, t4, True, None)
    h.sync()
    assert h.nacked(pub, t4)
    # a transaction's publish, applied at the commit, is held the same way
    routes.majority = ()
    routes.answer = True
    h.b.tx_select(pub)
    h.publish(pub, "", "work", b"in-tx")
    h.b.tx_commit(pub)
    (held,) = h.of_type(DeadLetterHeld, h.step())
    assert held.refused and held.body == b"in-tx"
    h.sync()
    assert h.confirm_of(pub, held.delivery_tag) is None
    h.b.settle_held_confirm(pub, held.delivery_tag, True, None)
    h.sync()
    assert h.nacked(pub, held.delivery_tag)
    # a single node: nacked at once, nothing held
    h.b.hold_dead_letters(None)
    solo = h.channel()
    t = h.publish(solo, "", "work", b"solo")
    assert h.of_type(DeadLetterHeld, h.step()) == []
    h.sync()
    assert h.nacked(solo, t)


def test_a_dead_letter_cycle_without_rejection_drops_the_message() -> None:
    h = Harness()
    h.queue("a", arguments={"x-message-ttl": 1000, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "b"})
    h.queue("b", arguments={"x-message-ttl": 1000, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "a"})
    h.publish(0, "", "a", b"m")
    h.sync()
    h.sleep(1.1)
    assert h.info("b")["messages_ready"] == 1
    effects = h.sleep(1.1)
    assert h.info("a")["messages_ready"] == 0 and h.info("b")["messages_ready"] == 0
    assert [e.reason for e in h.of_type(DeadLetterDropped, effects)] == ["expired"]


def test_a_cycle_with_a_rejection_is_allowed_retry_queue_pattern() -> None:
    h = Harness()
    h.queue("work", arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "retry"})
    h.queue("retry", arguments={"x-message-ttl": 1000, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "work"})
    ch = consuming(h, "work", b"m")
    h.b.nack(ch, deliver_one(h, ch).delivery_tag, requeue=False)
    h.step()
    d = h.delivers(h.sleep(1.1), ch)
    assert [x.message.body for x in d] == [b"m"]
    deaths = d[0].message.properties["headers"]["x-death"]
    assert [(x["queue"], x["reason"]) for x in deaths] == [("retry", "expired"), ("work", "rejected")]


@pytest.mark.parametrize("count", [{"$amqp": "int64", "value": 3}, 3, "three", None, {"odd": 1}, True, -2])
def test_a_client_sent_x_death_count_of_any_shape_is_counted_not_a_crash(count: Any) -> None:
    """A consumer that republishes a dead letter sends its x-death back; an AMQP long
    (RabbitMQ's and Java's type for the count) arrives as a tagged int64. Dead-lettering
    it again counts on from it (or from 1 when it is no count at all)."""
    h = Harness()
    with_dlq(h)
    death = {"queue": "work", "reason": "rejected", "count": count, "exchange": "", "routing-keys": ["work"]}
    h.publish(0, "", "work", b"m", {"headers": {"x-death": [death]}})
    h.sync()
    ch = h.channel()
    h.b.consume(ch, "work")
    h.b.reject(ch, deliver_one(h, ch).delivery_tag, requeue=False)
    h.sync()
    (headers,) = headers_of(h, "dead")
    assert headers["x-death"][0]["count"] == (4 if count in (3, {"$amqp": "int64", "value": 3}) else 2)
    assert h.b.queues["work"].ready_count() == 0


def test_missing_dead_letter_exchange_drops_and_reports() -> None:
    h = Harness()
    h.queue("q", arguments={"x-dead-letter-exchange": "nowhere"})
    ch = consuming(h, "q", b"m")
    h.b.nack(ch, deliver_one(h, ch).delivery_tag, requeue=False)
    (drop,) = h.of_type(DeadLetterDropped, h.step())
    assert drop.queue == "q" and "nowhere" in drop.why


# -- delays ---------------------------------------------------------------------------


def test_nack_with_delay_returns_the_message_when_due_and_across_a_restart() -> None:
    h = Harness()
    h.queue("q")
    ch = consuming(h, "q", b"m")
    h.b.nack(ch, deliver_one(h, ch).delivery_tag, delay_s=30)
    h.sync()
    assert h.info("q")["messages_delayed"] == 1 and h.info("q")["messages_ready"] == 0
    assert h.delivers(h.sleep(29), ch) == []
    # a restart now keeps it delayed until its due time (wall clock)
    nb = restart_from_log(h)
    assert len(nb.queues["q"].delayed) == 1 and nb.queues["q"].ready_count() == 0
    d = h.delivers(h.sleep(1.5), ch)
    assert [x.delivery_count for x in d] == [1]


def test_delay_survives_a_checkpoint() -> None:
    h = Harness()
    h.queue("q")
    ch = consuming(h, "q", b"m")
    h.b.nack(ch, deliver_one(h, ch).delivery_tag, delay_s=60)
    h.sync()
    covered, chunks = h.b.snapshot()
    records = [(0, rtype, payload) for chunk in chunks for rtype, payload in chunk]
    nb = replay_into(fresh_broker(h), records, covered)
    assert [(s, round(due_ms / 1000 - h.wall.now)) for s, due_ms in nb.queues["q"].delayed.due_times()] == [(1, 60)]


def test_delay_needs_requeue_and_a_sane_value() -> None:
    h = Harness()
    h.queue("q")
    ch = consuming(h, "q", b"m")
    d = deliver_one(h, ch)
    with pytest.raises(InvalidArgument):
        h.b.nack(ch, d.delivery_tag, requeue=False, delay_s=5)
    assert d.delivery_tag in h.b.channels[ch].deliveries  # nothing settled


def test_publish_with_delay_enters_the_queue_when_due_durably() -> None:
    h = Harness()
    h.queue("q")
    tag, _n = h.b.publish(0, "", "q", b"later", None, delay_s=10)
    h.publish(0, "", "q", b"now")
    h.sync()
    assert h.acked(0, tag)
    assert [r[1] for r in h.records].count(RecordType.MOVE) == 1
    assert h.info("q")["messages_delayed"] == 1
    assert [e.message.body for e in ready_entries(h.b, "q")] == [b"now"]
    nb = restart_from_log(h)
    assert len(nb.queues["q"].delayed) == 1
    h.sleep(10.5)
    # when due it takes its place by publish order: ahead of later publishes
    assert [e.message.body for e in ready_entries(h.b, "q")] == [b"later", b"now"]


# -- browse, redrive, arguments ---------------------------------------------------------


def test_redrive_moves_back_to_the_origin_once_each() -> None:
    h = Harness()
    with_dlq(h)
    for i in range(3):
        h.publish(0, "", "work", b"m%d" % i)
    h.sync()
    ch = h.channel()
    h.b.consume(ch, "work")
    for d in h.delivers(h.step(), ch):
        h.b.nack(ch, d.delivery_tag, requeue=False)
    h.b.cancel(ch, next(iter(h.b.channels[ch].consumers)))
    h.sync()
    moved, stopped = h.b.redrive("dead", 2)
    h.sync()
    assert (moved, stopped) == (2, None)
    assert [e.message.body for e in ready_entries(h.b, "work")] == [b"m0", b"m1"]
    assert [e.message.body for e in ready_entries(h.b, "dead")] == [b"m2"]
    nb = restart_from_log(h)
    assert durable_view(nb)["messages"] == durable_view(h.b)["messages"]
    # to any exchange
    h.queue("other")
    assert h.b.redrive("dead", 5, exchange="", routing_key="other") == (1, None)


def test_a_redrive_routed_back_into_its_queue_moves_each_message_once() -> None:
    """An exchange bound to the dead-letter queue itself: each message ready when the
    redrive began is moved (to the queue's tail) once, not again and again up to
    ``count``."""
    h = Harness()
    h.queue("dead")
    h.b.declare_exchange("loop", "fanout")
    h.b.bind("loop", "dead")
    for i in range(3):
        h.publish(0, "", "dead", b"m%d" % i)
    h.sync()
    records = len(h.records)
    assert h.b.redrive("dead", 1000, exchange="loop") == (3, None)
    h.sync()
    assert [r[1] for r in h.records[records:]].count(RecordType.MOVE) == 3
    assert [e.message.body for e in ready_entries(h.b, "dead")] == [b"m0", b"m1", b"m2"]


def test_redrive_stops_at_a_message_without_origin() -> None:
    h = Harness()
    h.queue("dead")
    h.publish(0, "", "dead", b"stray")
    h.sync()
    moved, stopped = h.b.redrive("dead", 10)
    assert moved == 0 and stopped is not None and "origin" in stopped
    assert h.info("dead")["messages_ready"] == 1


def test_browse_shows_ready_unacked_delayed_and_paged_without_consuming() -> None:
    h = Harness(queue_memory_messages=2)
    h.queue("q")
    for i in range(6):
        h.publish(0, "", "q", b"m%d" % i)
    h.sync()
    assert h.b.queues["q"].lanes[0].paged  # paged-out bodies are read back from the log to be shown
    assert [e.message.body for _s, _st, e, _u, _d in h.b.browse("q", 10)] == [b"m%d" % i for i in range(6)]
    assert len(h.b.queues["q"].lanes[0].paged) == 4  # and left where they were
    ch = h.channel()
    h.b.consume(ch, "q", prefetch=2)
    d1, d2 = h.delivers(h.step(), ch)
    h.b.nack(ch, d2.delivery_tag, delay_s=60)
    h.step()
    before = h.info("q")
    seen = h.b.browse("q", 10)
    assert [(s, state) for s, state, *_ in seen] == [
        (1, "unacked"), (2, "delayed"), (3, "unacked"), (4, "ready"), (5, "ready"), (6, "ready")
    ]
    assert seen[1][4] == h.wall.now + 60
    assert sorted(e.message.body for _s, _st, e, _u, _d in seen if e is not None) == [b"m%d" % i for i in range(6)]
    assert h.info("q") == before
    page = h.b.browse("q", 2, after=seen[1][0])
    assert [s for s, *_ in page] == [s for s, *_ in seen[2:4]]


def test_unknown_x_arguments_are_refused_naming_them() -> None:
    h = Harness()
    with pytest.raises(InvalidArgument, match="x-max-lenght"):
        h.queue("q", arguments={"x-max-lenght": 10})
    with pytest.raises(InvalidArgument, match="x-delivery-limit"):
        h.queue("q", arguments={"x-delivery-limit": -1})
    with pytest.raises(InvalidArgument, match="x-dead-letter-exchange"):
        h.queue("q", arguments={"x-dead-letter-routing-key": "k"})
    with pytest.raises(InvalidArgument, match="x-foo"):
        h.b.declare_exchange("e", "direct", arguments={"x-foo": 1})
    assert "q" not in h.b.queues and "e" not in h.b.exchanges
    h.queue("q", arguments={"my-metadata": 1, "x-queue-type": "quorum"})  # non-x names are metadata


def test_alternate_exchange_takes_unroutable_messages() -> None:
    h = Harness()
    h.b.declare_exchange("ae", "fanout")
    h.queue("unrouted")
    h.b.bind("ae", "unrouted")
    h.b.declare_exchange("main", "direct", arguments={"alternate-exchange": "ae"})
    h.queue("known")
    h.b.bind("main", "known", "k")
    h.publish(0, "main", "k", b"routed")
    h.publish(0, "main", "other", b"alternate")
    h.sync()
    assert [e.message.body for e in ready_entries(h.b, "known")] == [b"routed"]
    assert [e.message.body for e in ready_entries(h.b, "unrouted")] == [b"alternate"]


def test_purge_removes_delayed_messages_too_durably() -> None:
    h = Harness()
    h.queue("q")
    ch = consuming(h, "q", b"m", b"n")
    first, _second = h.delivers(h.step(), ch)
    h.b.nack(ch, first.delivery_tag, delay_s=60)
    h.b.close_channel(ch)
    h.sync()
    assert h.info("q")["messages_delayed"] == 1
    assert h.b.purge_queue("q") == 2
    h.sync()
    assert (h.info("q")["messages_delayed"], h.info("q")["messages_ready"]) == (0, 0)
    nb = restart_from_log(h)
    assert (len(nb.queues["q"].delayed), nb.queues["q"].ready_count()) == (0, 0)


# -- queue expiry (x-expires) ------------------------------------------------------------


def test_an_unused_queue_expires_and_use_starts_its_time_over() -> None:
    h = Harness()
    h.queue("q", arguments={"x-expires": 5000})
    h.sleep(4)
    h.b.get("q")  # a get is a use
    h.sleep(4)
    h.queue("q", arguments={"x-expires": 5000})  # so is a redeclare
    h.sleep(4)
    assert "q" in h.b.queues
    ch = h.channel()
    tag = h.b.consume(ch, "q")
    h.sleep(60)  # never while it has a consumer
    assert "q" in h.b.queues
    h.b.cancel(ch, tag)
    h.sleep(4.9)
    assert "q" in h.b.queues
    h.sleep(0.2)
    assert "q" not in h.b.queues
    h.sync()
    assert "q" not in restart_from_log(h).queues  # its deletion is logged


def test_queue_expiry_starts_over_after_a_restart() -> None:
    h = Harness()
    h.queue("q", arguments={"x-expires": 5000})
    h.publish(0, "", "q", b"m")
    h.sleep(4)
    nb = restart_from_log(h)
    nb.take_effects()
    mono = nb.clock
    assert "q" in nb.queues and nb.next_deadline() == mono() + 5.0
    mono.now += 5.1  # type: ignore[attr-defined]
    nb.advance()
    assert "q" not in nb.queues


def test_delayed_messages_are_paged_out_once_written_and_read_back_when_due() -> None:
    h = Harness()
    h.queue("q")
    for i in range(5):
        h.b.publish(0, "", "q", b"d%d" % i, None, delay_s=10 + i)
    q = h.b.queues["q"]
    assert len(q.delayed.entries) == 5  # records not written yet: held whole
    h.sync()
    assert q.delayed.entries == [] and q.delayed.paged_count == 5  # bodies only in the log
    h.sleep(12.5)
    assert [e.message.body for e in ready_entries(h.b, "q")] == [b"d0", b"d1", b"d2"]
    assert h.info("q")["messages_delayed"] == 2


def test_a_delayed_message_whose_read_fails_stays_delayed_and_is_retried() -> None:
    h = Harness()
    h.queue("q")
    h.b.publish(0, "", "q", b"d", None, delay_s=5)
    h.sync()
    saved = dict(h.log)
    h.log.clear()  # the log cannot be read for now
    effects = h.sleep(6)
    assert [type(e).__name__ for e in effects if type(e).__name__ == "LogReadFailed"] == ["LogReadFailed"]
    assert h.info("q")["messages_delayed"] == 1 and h.info("q")["messages_ready"] == 0
    h.log.update(saved)
    h.sleep(1)
    assert [e.message.body for e in ready_entries(h.b, "q")] == [b"d"]


def test_a_delayed_publish_whose_record_fails_is_nacked_and_never_delivered() -> None:
    h = Harness()
    h.queue("q")
    tag, _n = h.b.publish(0, "", "q", b"d", None, delay_s=1)
    h.step()
    h.b.storage_failed(1, h.b.last_lsn, "disk on fire")
    h.step()
    assert h.nacked(0, tag)
    assert h.info("q")["messages_delayed"] == 0
    h.sleep(2)
    assert h.info("q")["messages_ready"] == 0


def test_a_delay_that_is_not_a_whole_millisecond_still_comes_due() -> None:
    h = Harness()
    h.wall.now += 0.0004  # due times are kept in ms once paged out
    h.queue("q")
    ch = consuming(h, "q", b"m")
    h.b.nack(ch, deliver_one(h, ch).delivery_tag, delay_s=2.0003)
    h.sync()
    assert h.b.next_deadline() is not None
    assert [d.delivery_count for d in h.delivers(h.sleep(2.01), ch)] == [1]


def test_delayed_messages_come_due_in_due_order_whatever_order_they_were_delayed_in() -> None:
    delayed = DelayedMessages()
    order = [5, 7, 7, 3, 9, 1, 8, 8, 2, 10]  # due times (s); mostly rising, some not
    for seq, due in enumerate(order, 1):
        delayed.push_paged(due * 1000, seq, seq << 1)
    assert len(delayed) == delayed.paged_count == 10 and delayed.next_due() == 1.0
    assert sorted(delayed.due_times()) == [(seq, due * 1000) for seq, due in enumerate(order, 1)]
    got = []
    for now in range(11):
        _entries, paged = delayed.pop_due(float(now))
        got.extend((due, seq) for due, seq, _loc in paged)
        assert all(due <= now * 1000 for due, _seq in got)
    assert [due for due, _seq in got] == sorted(due * 1000 for due in order)
    assert not delayed and delayed.next_due() is None


# -- x-max-length-bytes ------------------------------------------------------------------


def test_max_length_bytes_drops_the_oldest_into_the_dead_letter_queue() -> None:
    h = Harness(queue_memory_messages=1)
    with_dlq(h, "work", **{"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc", b"dd"):
        h.publish(0, "", "work", body)
    h.sync()
    assert [e.message.body for e in ready_entries(h.b, "work")] == [b"bbbb", b"cccc", b"dd"]
    assert h.b.queues["work"].ready_bytes == 10
    assert [e.message.body for e in ready_entries(h.b, "dead")] == [b"aaaa"]
    ch = consuming(h, "work")
    d = h.delivers(h.step(), ch)
    assert len(d) == 3 and h.b.queues["work"].ready_bytes == 0
    h.b.close_channel(ch)  # back to the queue: counted again
    h.step()
    assert h.b.queues["work"].ready_bytes == 10
    nb = restart_from_log(h)
    assert nb.queues["work"].ready_bytes == 10 and not nb.queues["work"].lanes[0].paged


def test_max_length_bytes_with_reject_publish_nacks_what_does_not_fit() -> None:
    h = Harness()
    h.queue("q", arguments={"x-max-length-bytes": 5, "x-overflow": "reject-publish"})
    t1 = h.publish(0, "", "q", b"abc")
    t2 = h.publish(0, "", "q", b"def")  # 3 + 3 > 5
    t3 = h.publish(0, "", "q", b"gh")  # 3 + 2 fits
    h.sync()
    assert (h.acked(0, t1), h.nacked(0, t2), h.acked(0, t3)) == (True, True, True)
    assert [e.message.body for e in ready_entries(h.b, "q")] == [b"abc", b"gh"]
