"""Priority queues in the core: ``x-max-priority``, highest priority first and FIFO
within a priority, requeue to the original place, paging per lane, and recovery from
the log and from a checkpoint (PRIORITY_REFS) in the same order."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from broker.core import Deliver, InvalidArgument, RecordType
from broker.core.lanes import split_by_level

from .durable_view import durable_view, fresh_broker, replay_into, restart_from_log
from .helpers import Harness, ready_entries


def prio(p: int | None) -> dict[str, Any] | None:
    return None if p is None else {"priority": p}


def publish_all(h: Harness, queue: str, items: list[tuple[bytes, int | None]]) -> None:
    for body, p in items:
        h.publish(0, "", queue, body, prio(p))
    h.sync()


def bodies(h: Harness, queue: str) -> list[bytes]:
    return [e.message.body for e in ready_entries(h.b, queue)]


def drain(h: Harness, queue: str) -> list[bytes]:
    """Everything a consumer receives, in order (acked as it comes)."""
    ch = h.channel()
    h.b.consume(ch, queue, prefetch=1)
    out: list[bytes] = []
    while True:
        delivered = [e for e in h.step() if isinstance(e, Deliver)]
        if not delivered:
            return out
        for d in delivered:
            out.append(d.message.body)
            h.b.ack(ch, d.delivery_tag)


@pytest.mark.parametrize("memory", [2048, 1])
def test_higher_priority_first_fifo_within_one_priority(memory: int) -> None:
    h = Harness(memory_messages_per_queue=memory)
    h.queue("q", arguments={"x-max-priority": 5})
    publish_all(h, "q", [(b"a0", None), (b"b3", 3), (b"c0", 0), (b"d5", 5), (b"e9", 9), (b"f3", 3), (b"g1", 1)])
    # no priority counts as 0; above the maximum counts as the maximum (RabbitMQ's rules)
    assert drain(h, "q") == [b"d5", b"e9", b"b3", b"f3", b"g1", b"a0", b"c0"]


def test_a_requeued_message_returns_to_its_place_within_its_priority() -> None:
    h = Harness()
    h.queue("q", arguments={"x-max-priority": 2})
    publish_all(h, "q", [(b"h1", 2), (b"h2", 2), (b"l1", 0), (b"l2", 0)])
    ch = h.channel()
    tag = h.b.consume(ch, "q", prefetch=3)
    got = [d for d in h.step() if isinstance(d, Deliver)]
    assert [d.message.body for d in got] == [b"h1", b"h2", b"l1"]
    h.b.cancel(ch, tag)  # (its deliveries stay out until settled)
    h.publish(0, "", "q", b"h3", prio(2))
    h.sync()
    h.b.nack(ch, got[2].delivery_tag)  # l1 back before l2
    h.b.nack(ch, got[0].delivery_tag)  # h1 back before h3
    h.step()
    h.b.close_channel(ch)  # h2 back between them
    h.step()
    assert bodies(h, "q") == [b"h1", b"h2", b"h3", b"l1", b"l2"]
    assert [e.delivered for e in ready_entries(h.b, "q")] == [True, True, False, True, False]


def test_a_plain_queue_ignores_priorities() -> None:
    h = Harness()
    h.queue("q")
    publish_all(h, "q", [(b"a", 0), (b"b", 9), (b"c", None)])
    assert drain(h, "q") == [b"a", b"b", b"c"]
    assert "messages_ready_by_priority" not in h.info("q")


def test_get_and_queue_info_follow_priorities() -> None:
    h = Harness()
    h.queue("q", arguments={"x-max-priority": 3})
    publish_all(h, "q", [(b"a", 1), (b"b", 3), (b"c", None), (b"d", 3)])
    info = h.info("q")
    assert info["messages_ready"] == 4
    assert info["messages_ready_by_priority"] == {"0": 1, "1": 1, "3": 2}
    got = h.b.get("q", 3, 30.0)
    assert [d.entry.message.body for _lid, d, _r in got] == [b"b", b"d", b"a"]


def test_x_max_priority_0_is_one_level_first_in_first_out() -> None:
    """RabbitMQ accepts 0: a priority queue of one level, every message at 0."""
    h = Harness()
    h.queue("q", arguments={"x-max-priority": 0})
    publish_all(h, "q", [(b"a0", None), (b"b3", 3), (b"c0", 0), (b"d9", 9)])
    assert drain(h, "q") == [b"a0", b"b3", b"c0", b"d9"]


@pytest.mark.parametrize("value", [256, -1, "5", True, 2.5, None])
def test_x_max_priority_out_of_range_is_refused(value: object) -> None:
    h = Harness()
    with pytest.raises(InvalidArgument, match="x-max-priority"):
        h.queue("q", arguments={"x-max-priority": value})
    assert "q" not in h.b.queues


def test_paging_is_per_priority_and_a_restart_keeps_the_order() -> None:
    """Bodies are paged out lane by lane; the log and a checkpoint both restore every
    message to its priority, in order, without copying a body into the checkpoint."""
    h = Harness(memory_messages_per_queue=4)
    h.queue("q", arguments={"x-max-priority": 9})
    items = [(b"m%03d" % i, (i * 7) % 12 if i % 5 else None) for i in range(300)]
    publish_all(h, "q", items)
    q = h.b.queues["q"]
    assert q.paged_count() > 250  # the backlog is in the log, not in memory
    assert sum(len(lane.ready) + len(lane.tail) for lane in q.lanes) <= 10
    expected = [b for b, _p in sorted(items, key=lambda it: (-min(it[1] or 0, 9), it[0]))]
    assert bodies(h, "q") == expected
    # from the log alone
    nb = restart_from_log(h)
    assert durable_view(nb) == durable_view(h.b)
    assert [e.message.body for e in ready_entries(nb, "q")] == expected
    # from a checkpoint (references by priority), then the log after it
    covered, chunks = h.b.snapshot(chunk_entries=16)
    records = [(0, t, p) for chunk in chunks for t, p in chunk]
    assert not [p for _l, t, p in records if t == RecordType.ENQUEUE], "a body was copied"
    assert [p for _l, t, p in records if t == RecordType.PRIORITY_REFS]
    publish_all(h, "q", [(b"late-hi", 9), (b"late-lo", None)])
    nb = replay_into(fresh_broker(h), records + [r for r in h.records if r[0] > covered], h.b.last_lsn)
    assert durable_view(nb) == durable_view(h.b)
    got = [e.message.body for e in ready_entries(nb, "q")]
    assert got[0] != b"late-hi" and b"late-hi" in got and got[-1] == b"late-lo"
    assert got == bodies(h, "q")


def test_unacked_and_requeued_messages_keep_their_priority_across_a_checkpoint() -> None:
    h = Harness(memory_messages_per_queue=2)
    h.queue("q", arguments={"x-max-priority": 4})
    publish_all(h, "q", [(b"a", 4), (b"b", 1), (b"c", 4), (b"d", 1)])
    ch = h.channel()
    h.b.consume(ch, "q", prefetch=2)
    h.step()  # a and c are out, unacked
    covered, chunks = h.b.snapshot(chunk_entries=1)
    records = [(0, t, p) for chunk in chunks for t, p in chunk]
    nb = replay_into(fresh_broker(h), records, covered)
    # after the "crash" the unacked ones are back in their place, first
    assert [e.message.body for e in ready_entries(nb, "q")] == [b"a", b"c", b"b", b"d"]


def test_delayed_and_dead_lettered_messages_enter_their_priority() -> None:
    h = Harness()
    h.b.declare_exchange("dlx", "fanout")
    h.queue("dead", arguments={"x-max-priority": 5})
    h.b.bind("dlx", "dead")
    h.queue("work", arguments={"x-dead-letter-exchange": "dlx"})
    h.queue("q", arguments={"x-max-priority": 5})
    h.b.publish(0, "", "q", b"later-hi", prio(5), delay_s=10.0)
    publish_all(h, "q", [(b"lo", 1), (b"mid", 3)])
    assert bodies(h, "q") == [b"mid", b"lo"]
    h.sleep(11)
    assert bodies(h, "q") == [b"later-hi", b"mid", b"lo"]
    publish_all(h, "work", [(b"dl-lo", None), (b"dl-hi", 5)])
    ch = h.channel()
    h.b.consume(ch, "work", prefetch=2)
    for d in [e for e in h.step() if isinstance(e, Deliver)]:
        h.b.reject(ch, d.delivery_tag, requeue=False)
    h.sync()
    assert bodies(h, "dead") == [b"dl-hi", b"dl-lo"]
    nb = restart_from_log(h)
    assert [e.message.body for e in ready_entries(nb, "dead")] == [b"dl-hi", b"dl-lo"]


def test_split_by_level_clamps_above_the_maximum_and_keeps_sequence_order() -> None:
    seqs = array("q", [1, 2, 3, 4, 5, 6])
    locs = array("q", [10, 20, 30, 40, 50, 60])
    prios = array("B", [0, 7, 2, 9, 2, 0])
    got = {level: (list(s), list(l)) for level, (s, l) in split_by_level(seqs, locs, prios, 3)}
    assert got == {0: ([1, 6], [10, 60]), 2: ([3, 5], [30, 50]), 3: ([2, 4], [20, 40])}
