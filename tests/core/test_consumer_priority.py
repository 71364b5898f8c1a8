"""Consumer priorities (``x-priority``, consumerorder.py): the highest-priority
consumers get a queue's messages while they have room, lower ones only when those are
full; equal priorities take turns. A single-active-consumer queue ignores them."""

from __future__ import annotations

import pytest

from broker.core import InvalidArgument

from .helpers import Harness


def fill(h: Harness, ch: int, n: int) -> None:
    for i in range(n):
        h.publish(ch, "", "q", b"%d" % i)


def test_the_highest_priority_gets_messages_while_it_has_room() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    h.b.consume(ch, "q", consumer_tag="low", prefetch=10)
    h.b.consume(ch, "q", consumer_tag="high", prefetch=2, priority=5)
    fill(h, ch, 5)
    got = h.delivers(h.step())
    assert [d.consumer_tag for d in got] == ["high", "high", "low", "low", "low"]
    h.b.ack(ch, got[0].delivery_tag)  # high has room again: it gets the next one
    fill(h, ch, 1)
    assert [d.consumer_tag for d in h.delivers(h.step())] == ["high"]


def test_equal_priorities_take_turns_above_a_lower_one() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    h.b.consume(ch, "q", consumer_tag="low")
    h.b.consume(ch, "q", consumer_tag="a", priority=1)
    h.b.consume(ch, "q", consumer_tag="b", priority=1)
    fill(h, ch, 6)
    assert [d.consumer_tag for d in h.delivers(h.step())] == ["a", "b"] * 3


def test_negative_priority_is_below_the_default() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    h.b.consume(ch, "q", consumer_tag="neg", priority=-1)
    h.b.consume(ch, "q", consumer_tag="plain", prefetch=1)
    fill(h, ch, 3)
    assert [d.consumer_tag for d in h.delivers(h.step())] == ["plain", "neg", "neg"]


def test_cancelling_the_high_one_hands_back_to_the_rest() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    h.b.consume(ch, "q", consumer_tag="x")
    h.b.consume(ch, "q", consumer_tag="y")
    h.b.consume(ch, "q", consumer_tag="hi", priority=9)
    h.b.cancel(ch, "hi")
    fill(h, ch, 4)
    assert [d.consumer_tag for d in h.delivers(h.step())] == ["x", "y", "x", "y"]


def test_single_active_consumer_queue_ignores_priorities() -> None:
    h = Harness()
    h.queue("q", durable=False, arguments={"x-single-active-consumer": True})
    ch = h.channel()
    h.b.consume(ch, "q", consumer_tag="first")
    h.b.consume(ch, "q", consumer_tag="second", priority=10)
    fill(h, ch, 2)
    assert [d.consumer_tag for d in h.delivers(h.step())] == ["first", "first"]


@pytest.mark.parametrize("bad", ["1", 1.5, True, 1 << 31, -(1 << 31) - 1])
def test_priority_must_be_a_32_bit_integer(bad: object) -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    with pytest.raises(InvalidArgument, match="x-priority"):
        h.b.consume(ch, "q", consumer_tag="c", priority=bad)
    assert h.b.channels[ch].consumers == {} and h.b.queues["q"].consumers == []
