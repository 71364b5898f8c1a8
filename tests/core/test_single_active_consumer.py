"""Single active consumer (``x-single-active-consumer``): one consumer receives, the
others wait in registration order and take over, with the unacked messages, when it
goes."""

from __future__ import annotations

import pytest

from broker.core import ConsumerActive, InvalidArgument

from .helpers import Harness

SAC = {"x-single-active-consumer": True}


def test_only_the_first_consumer_receives_and_the_next_takes_over_in_order() -> None:
    h = Harness()
    h.queue("q", arguments=SAC)
    for i in range(4):
        h.publish(0, "", "q", b"m%d" % i)
    h.sync()
    chans = [h.channel() for _ in range(3)]
    tags = [h.b.consume(ch, "q", prefetch=2) for ch in chans]
    assert [h.b.consumer_active(ch, t) for ch, t in zip(chans, tags)] == [True, False, False]
    effects = h.step()
    assert [d.channel_id for d in h.delivers(effects)] == [chans[0], chans[0]]  # prefetch 2, others idle
    # the active one's channel ends with its two messages unacked: the second takes over, and gets them first
    h.b.close_channel(chans[0])
    effects = h.step()
    assert h.of_type(ConsumerActive, effects) == [ConsumerActive(chans[1], tags[1])]
    got = h.delivers(effects)
    assert [(d.channel_id, d.message.body, d.redelivered) for d in got] == [
        (chans[1], b"m0", True), (chans[1], b"m1", True)
    ]
    assert h.b.consumer_active(chans[1], tags[1]) and not h.b.consumer_active(chans[2], tags[2])
    # a standby that cancels hands nothing over
    h.b.cancel(chans[2], tags[2])
    assert h.of_type(ConsumerActive, h.step()) == []
    # cancelling the active one: no one is left to take over
    h.b.cancel(chans[1], tags[1])
    assert h.of_type(ConsumerActive, h.step()) == []


def test_a_plain_queue_has_every_consumer_active_and_the_argument_must_be_a_boolean() -> None:
    h = Harness()
    h.queue("plain")
    ch = h.channel()
    assert h.b.consumer_active(ch, h.b.consume(ch, "plain"))
    assert h.b.consumer_active(ch, h.b.consume(ch, "plain"))
    with pytest.raises(InvalidArgument, match="x-single-active-consumer"):
        h.queue("q", arguments={"x-single-active-consumer": "yes"})


def test_a_cancelled_active_consumer_hands_over_only_once_its_messages_are_settled() -> None:
    h = Harness()
    h.queue("q", arguments=SAC)
    for i in range(3):
        h.publish(0, "", "q", b"m%d" % i)
    h.sync()
    a, b = h.channel(), h.channel()
    tag_a = h.b.consume(a, "q", prefetch=1)
    tag_b = h.b.consume(b, "q")
    (first,) = h.delivers(h.step())
    h.b.cancel(a, tag_a)  # m0 is still out with it: the next one must not overtake it
    effects = h.step()
    assert h.delivers(effects) == [] and h.of_type(ConsumerActive, effects) == []
    assert not h.b.consumer_active(b, tag_b)
    h.b.nack(a, first.delivery_tag)  # back to the queue: now b takes over, m0 first
    effects = h.step()
    assert h.of_type(ConsumerActive, effects) == [ConsumerActive(b, tag_b)]
    assert [d.message.body for d in h.delivers(effects, b)] == [b"m0", b"m1", b"m2"]
