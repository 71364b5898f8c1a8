"""Direct reply-to in the core (directreply.py): a channel's reply consumer, its
address, and replies published to the default exchange handed straight to it, never
to a queue, never logged; a made-up or stale address routes nowhere."""

from __future__ import annotations

import pytest

from broker.core import (
    AppendRecords,
    ChannelError,
    Deliver,
    InvalidArgument,
    PreconditionFailed,
    Return,
    delivery_cost,
    reply_node,
    reply_secret,
)

from .helpers import Harness


def requester(h: Harness, secret: str = "s3cret") -> tuple[int, str]:
    ch = h.channel()
    return ch, h.b.reply_consume(ch, "replies", no_ack=True, secret=secret)


def test_a_reply_goes_to_the_requester_only_unlogged_and_confirmed() -> None:
    h = Harness()
    a, address = requester(h)
    other, _ = requester(h, "other")
    assert address == f"amq.rabbitmq.reply-to.s3cret.{a}"
    responder = h.channel()
    tag = h.publish(responder, "", address, b"answer", {"correlation_id": "c1"})
    effects = h.sync()
    [d] = h.delivers(effects)
    assert (d.channel_id, d.consumer_tag, d.redelivered) == (a, "replies", False)
    assert (d.message.exchange, d.message.routing_key, d.message.body) == ("", address, b"answer")
    assert d.message.properties["correlation_id"] == "c1"
    assert not h.delivers(effects, other)
    assert not h.of_type(AppendRecords, effects)  # nothing on disk
    assert h.acked(responder, tag)
    assert h.b.views.reply_exists(address) and h.b.views.reply_address(a) == address


def test_the_delivery_tag_is_the_channels_next_one_not_taken_as_rabbitmq_310() -> None:
    h = Harness()
    a, address = requester(h)
    h.queue("q", durable=False)
    h.b.consume(a, "q", consumer_tag="c", no_ack=True)
    responder = h.channel()
    h.publish(responder, "", address, b"r1")
    h.publish(responder, "", address, b"r2")
    h.publish(responder, "", "q", b"m")
    tags = [(d.consumer_tag, d.delivery_tag) for d in h.delivers(h.sync(), a)]
    assert tags == [("replies", 1), ("replies", 1), ("c", 1)]


def test_own_tags_gives_each_reply_a_tag_of_its_own_as_an_http_channel_numbers_them() -> None:
    h = Harness()
    a = h.channel()
    address = h.b.reply_consume(a, "replies", no_ack=True, secret="s", own_tags=True)
    h.queue("q", durable=False)
    h.b.consume(a, "q", consumer_tag="c", no_ack=True)
    responder = h.channel()
    h.publish(responder, "", address, b"r1")
    h.publish(responder, "", address, b"r2")
    h.publish(responder, "", "q", b"m")
    tags = [(d.consumer_tag, d.delivery_tag) for d in h.delivers(h.sync(), a)]
    assert tags == [("replies", 1), ("replies", 2), ("c", 3)]
    assert h.b.channels[a].deliveries == {}  # nothing to settle


def test_a_reply_consumer_ends_whatever_its_tag_when_none_is_named() -> None:
    h = Harness()
    a, address = requester(h)
    assert not h.b.reply_cancel(h.channel(), None)  # (none there: nothing ended)
    assert h.b.reply_cancel(a, None)
    assert not h.b.views.reply_exists(address) and not h.b.reply_cancel(a, None)


@pytest.mark.parametrize("mandatory", [False, True])
def test_a_mandatory_reply_is_returned_even_when_delivered(mandatory: bool) -> None:
    h = Harness()
    _a, address = requester(h)
    responder = h.channel()
    tag = h.publish(responder, "", address, b"r", mandatory=mandatory)
    effects = h.sync()
    assert len(h.delivers(effects)) == 1
    returns = h.of_type(Return, effects)
    assert [(r.reply_code, r.message.routing_key) for r in returns] == ([(312, address)] if mandatory else [])
    assert h.acked(responder, tag)


def test_made_up_and_stale_addresses_route_nowhere() -> None:
    h = Harness()
    a, address = requester(h)
    responder = h.channel()
    prefix = "amq.rabbitmq.reply-to."
    forged = [
        address[:-1] + str(a + 1),  # another channel's number
        f"{prefix}guess.{a}",  # the right channel, the wrong secret
        f"{prefix}s3cret",  # no channel number
        f"{prefix}s3cret.x{a}",
        f"{prefix}.{a}",
        prefix,
    ]
    for key in forged:
        tag = h.publish(responder, "", key, b"forged", mandatory=True)
        assert not h.delivers(h.sync())
        assert h.acked(responder, tag) and tag in h.returned[responder]
        assert not h.b.views.reply_exists(key)
    # a reply address is no routing key of another exchange
    h.b.declare_exchange("x", "direct", durable=False)
    h.publish(responder, "x", address, b"elsewhere")
    assert not h.delivers(h.sync())
    # cancelled: gone; consumed again: a new address
    assert not h.b.reply_cancel(a, "not-it")
    assert h.b.reply_cancel(a, "replies")
    h.publish(responder, "", address, b"late")
    assert not h.delivers(h.sync()) and not h.b.views.reply_exists(address)
    again = h.b.reply_consume(a, "replies", no_ack=True, secret="fresh")
    assert again != address and h.b.views.reply_exists(again)
    # the channel's end ends it
    h.b.close_channel(a)
    h.publish(responder, "", again, b"later")
    assert not h.delivers(h.sync()) and not h.b.views.reply_exists(again)
    assert h.b.views.reply_exists("amq.rabbitmq.reply-to")


def test_reply_consume_refusals() -> None:
    h = Harness()
    a = h.channel()
    with pytest.raises(PreconditionFailed, match="reply consumer cannot acknowledge"):
        h.b.reply_consume(a, "r", no_ack=False, secret="s")
    h.queue("q", durable=False)
    h.b.consume(a, "q", consumer_tag="taken")
    with pytest.raises(ChannelError, match="already in use"):
        h.b.reply_consume(a, "taken", no_ack=True, secret="s")
    for secret in ("", "x" * 201, "clé"):
        with pytest.raises(InvalidArgument):
            h.b.reply_consume(a, "r", no_ack=True, secret=secret)
    h.b.reply_consume(a, "r", no_ack=True, secret="s")
    with pytest.raises(PreconditionFailed, match="reply consumer already set"):
        h.b.reply_consume(a, "r2", no_ack=True, secret="t")
    with pytest.raises(ChannelError):
        h.b.reply_consume(999, "r", no_ack=True, secret="s")


def test_a_transactions_reply_goes_at_the_commit() -> None:
    h = Harness()
    _a, address = requester(h)
    responder = h.channel()
    h.b.tx_select(responder)
    h.publish(responder, "", address, b"held")
    assert not h.delivers(h.sync())
    h.b.tx_commit(responder)
    assert h.bodies(h.sync()) == [b"held"]


def test_a_reply_spends_credit_but_is_never_held_back_for_it() -> None:
    h = Harness(channel_credit_bytes=100)
    a, address = requester(h)
    responder = h.channel()
    for _ in range(3):
        h.publish(responder, "", address, b"x" * 100)
    assert len(h.delivers(h.sync(), a)) == 3
    assert h.b.channels[a].credit < 0


def test_replies_past_a_backlog_of_sixteen_channel_buffers_are_dropped_until_it_drains() -> None:
    """A requester that stops reading: its unsent replies may take its credit down to
    16 channel buffers below zero; replies past that are dropped (returned, when
    mandatory), as for a requester that has gone, until its edge sends what it holds."""
    h = Harness(channel_credit_bytes=1000)
    a, address = requester(h)
    responder = h.channel()
    tags = [h.publish(responder, "", address, b"x" * 1000, mandatory=True) for _ in range(40)]
    effects = h.sync()
    delivered = h.delivers(effects, a)
    cost = delivery_cost(b"x" * 1000)
    # each one sent while the credit is not yet past 1000 credit + 16,000 backlog
    assert len(delivered) == 17_000 // cost + 1 < 40
    assert -16_000 - cost <= h.b.channels[a].credit < -16_000
    assert all(h.acked(responder, tag) for tag in tags)  # confirmed either way
    assert len(h.of_type(Return, effects)) == 40  # a reply counts as unroutable, delivered or not
    h.b.grant_credit(a, 20_000)  # the edge sent them
    h.publish(responder, "", address, b"after")
    assert h.bodies(h.delivers(h.sync(), a)) == [b"after"]


def test_cluster_secrets_name_their_node() -> None:
    secret = reply_secret("r4nd0m", "node.b-1")
    assert "." in secret and secret.endswith(".r4nd0m")
    assert reply_node(f"amq.rabbitmq.reply-to.{secret}.7") == "node.b-1"
    assert reply_node("amq.rabbitmq.reply-to.r4nd0m.7") is None  # a single node's
    assert reply_node("amq.rabbitmq.reply-to.!!.x.7") is None
    assert reply_node("other.a.b.c") is None
    assert isinstance(Deliver, type)
