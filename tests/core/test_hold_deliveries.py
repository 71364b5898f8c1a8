"""``Broker.hold_deliveries`` on a priority queue: the bound is on a message's seq,
which a queue numbers across its lanes, so a held head in a high lane (published
after the bound) must not hide ready messages at or below the bound in lower lanes --
not from a consumer, a REST get, or a redrive. (A replicated queue's leader holds
every message its majority does not have yet: docs/cluster.md.)"""

from __future__ import annotations

from typing import Any

import pytest

from .helpers import Harness, ready_entries


def prio(p: int) -> dict[str, Any]:
    return {"priority": p}


def _low_then_high(h: Harness, queue: str, **arguments: Any) -> tuple[int, int]:
    """Two low-priority messages, then one high: held after the low ones. Returns the
    seqs of the last low and of the high message."""
    h.queue(queue, arguments={"x-max-priority": 5, **arguments}, durable=True)
    for body, p in ((b"low1", 0), (b"low2", 0), (b"high", 5)):
        h.publish(0, "", queue, body, prio(p))
    h.sync()
    seqs = {e.message.body: e.message.seq for e in ready_entries(h.b, queue)}
    h.b.hold_deliveries(queue, seqs[b"low2"])
    return seqs[b"low2"], seqs[b"high"]


@pytest.mark.parametrize("memory", [2048, 1])
def test_a_held_high_priority_head_does_not_hide_lower_lanes_from_a_consumer(memory: int) -> None:
    h = Harness(memory_messages_per_queue=memory)  # 1: the low lane is paged out
    _low, high = _low_then_high(h, "q")
    ch = h.channel()
    h.b.consume(ch, "q")
    assert h.bodies(h.step(), ch) == [b"low1", b"low2"]
    assert [e.message.body for e in ready_entries(h.b, "q")] == [b"high"]  # still held
    h.b.hold_deliveries("q", high)
    assert h.bodies(h.step(), ch) == [b"high"]
    assert h.info("q")["messages_ready"] == 0


def test_a_held_high_priority_head_does_not_hide_lower_lanes_from_a_get() -> None:
    h = Harness()
    _low_then_high(h, "q")
    got = h.b.get("q", 5, 30.0)
    assert [d.entry.message.body for _lease, d, _redelivered in got] == [b"low1", b"low2"]
    assert h.info("q")["messages_ready"] == 1


def test_a_redrive_moves_the_ready_messages_of_lower_lanes_past_a_held_head() -> None:
    h = Harness()
    h.queue("target")
    _low_then_high(h, "q")
    moved, stopped = h.b.redrive("q", 10, exchange="", routing_key="target")
    assert (moved, stopped) == (2, None)
    h.step()
    assert h.ready_bodies("target") == [b"low1", b"low2"]
    assert h.ready_bodies("q") == [b"high"]


def test_a_held_message_in_a_lower_lane_stays_held_below_a_ready_higher_lane() -> None:
    h = Harness()
    h.queue("q", arguments={"x-max-priority": 5})
    h.publish(0, "", "q", b"high", prio(5))
    h.publish(0, "", "q", b"low", prio(0))
    h.sync()
    seqs = {e.message.body: e.message.seq for e in ready_entries(h.b, "q")}
    h.b.hold_deliveries("q", seqs[b"high"])
    ch = h.channel()
    h.b.consume(ch, "q")
    assert h.bodies(h.step(), ch) == [b"high"]  # and not the held low one
    h.b.hold_deliveries("q", None)
    assert h.bodies(h.step(), ch) == [b"low"]
