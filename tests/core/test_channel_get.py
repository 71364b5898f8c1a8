"""A channel's get (AMQP's basic.get, ``Broker.channel_get``): one ready message as a
delivery of the channel, numbered with its consumers' deliveries, settled by the
channel's ack/nack, back in its queue when the channel closes or its ack timeout
passes; with ``no_ack`` settled at once. Not a consumer: no prefetch, no auto-delete."""

from __future__ import annotations

import pytest

from broker.core import ChannelError, DeliveryExpired, NotFound, ResourceLocked

from .helpers import Harness


def test_get_takes_the_next_message_as_an_unacked_delivery_of_the_channel() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    for body in (b"a", b"b", b"c"):
        h.publish(ch, "", "q", body)
    got = h.b.channel_get(ch, "q")
    assert got is not None
    assert (got.delivery_tag, got.redelivered, got.message.body, got.message_count) == (1, False, b"a", 2)
    assert got.message.exchange == "" and got.message.routing_key == "q"
    assert h.info("q")["messages_unacked"] == 1 and h.b.channels[ch].unacked == 1
    h.b.consume(ch, "q", consumer_tag="c", prefetch=1)
    (deliver,) = h.delivers(h.step(), ch)
    assert deliver.delivery_tag == 2  # one numbering for gets and deliveries
    h.b.ack(ch, 1)
    assert h.info("q")["messages_unacked"] == 1
    assert h.b.channel_get(ch, "q").message_count == 0


def test_nack_requeues_it_redelivered_and_close_returns_it() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    h.publish(ch, "", "q", b"m")
    first = h.b.channel_get(ch, "q")
    assert h.b.channel_get(ch, "q") is None  # nothing else ready
    h.b.nack(ch, first.delivery_tag, requeue=True)
    again = h.b.channel_get(ch, "q")
    assert again.redelivered and again.message.body == b"m" and again.delivery_tag == 2
    h.b.close_channel(ch)
    assert h.info("q")["messages_ready"] == 1 and h.info("q")["messages_unacked"] == 0


def test_no_ack_get_settles_at_once() -> None:
    h = Harness()
    h.queue("q", durable=False)
    ch = h.channel()
    h.publish(ch, "", "q", b"m")
    got = h.b.channel_get(ch, "q", no_ack=True)
    assert got.message.body == b"m" and got.message_count == 0
    assert h.info("q")["messages_unacked"] == 0 and not h.b.channels[ch].deliveries
    with pytest.raises(ChannelError):
        h.b.ack(ch, got.delivery_tag)


def test_get_ignores_prefetch_and_is_not_a_consumer_of_an_auto_delete_queue() -> None:
    h = Harness()
    h.queue("q", durable=False, auto_delete=True)
    ch = h.channel()
    h.b.qos(ch, 1, True)
    for body in (b"a", b"b"):
        h.publish(ch, "", "q", body)
    assert h.b.channel_get(ch, "q").message.body == b"a"
    assert h.b.channel_get(ch, "q").message.body == b"b"  # past the channel's prefetch
    h.b.ack(ch, 2, multiple=True)
    h.sleep(3600)
    assert "q" in h.b.queues  # never had a consumer: not auto-deleted


def test_an_unacked_get_expires_with_the_queues_ack_timeout() -> None:
    h = Harness()
    h.queue("q", durable=False, arguments={"x-consumer-timeout": 5000})
    ch = h.channel()
    h.publish(ch, "", "q", b"m")
    got = h.b.channel_get(ch, "q")
    effects = h.sleep(6)
    assert [(e.channel_id, e.consumer_tag, e.delivery_tag) for e in h.of_type(DeliveryExpired, effects)] == [
        (ch, "", got.delivery_tag)
    ]
    assert h.info("q")["messages_ready"] == 1
    with pytest.raises(ChannelError, match="expired"):
        h.b.ack(ch, got.delivery_tag)


def test_get_refusals() -> None:
    h = Harness()
    owner, other = h.channel(), h.channel()
    h.b.declare_queue("ex", exclusive=True, durable=False, channel_id=owner)
    with pytest.raises(NotFound):
        h.b.channel_get(owner, "missing")
    with pytest.raises(ResourceLocked):
        h.b.channel_get(other, "ex")
    with pytest.raises(ChannelError):
        h.b.channel_get(99, "ex")
    assert h.b.channel_get(owner, "ex") is None


def test_newest_unacked_tag_looks_only_at_unsettled_deliveries() -> None:
    """What an AMQP ``multiple`` settle of tag 0 (or up to a tag) reaches: the newest
    delivery still unsettled, found among the unsettled ones (not every tag used)."""
    h = Harness()
    h.queue("q")
    ch = h.channel()
    for body in (b"1", b"2", b"3"):
        h.publish(ch, "", "q", body)
    h.sync()
    tags = [h.b.channel_get(ch, "q").delivery_tag for _ in range(3)]  # type: ignore[union-attr]
    views = h.b.views
    assert views.newest_unacked_tag(ch) == tags[2]
    assert views.newest_unacked_tag(ch, tags[1]) == tags[1]
    h.b.ack(ch, tags[2])
    assert views.newest_unacked_tag(ch) == tags[1]
    h.b.ack(ch, tags[1], True)
    assert views.newest_unacked_tag(ch) == 0 and views.newest_unacked_tag(404) == 0
