"""Exclusive queues of a connection (connections.py): channels that joined one
connection share its exclusive queues; other channels are refused them; they live
until the connection closes, not with the channel that declared them."""

from __future__ import annotations

import pytest

from broker.core import ChannelError, ResourceLocked

from .helpers import Harness


def test_channels_of_one_connection_share_its_exclusive_queues() -> None:
    h = Harness()
    conn = h.b.open_connection()
    a, b, stranger = h.channel(), h.channel(), h.channel()
    h.b.join_connection(a, conn)
    h.b.join_connection(b, conn)
    q, created = h.b.declare_queue("ex", exclusive=True, durable=False, channel_id=a)
    assert created and q.exclusive_owner == conn
    assert h.b.declare_queue("ex", exclusive=True, durable=False, channel_id=b)[1] is False
    h.publish(b, "", "ex", b"m")
    h.b.consume(b, "ex", consumer_tag="c")
    assert len(h.delivers(h.step(), b)) == 1
    for refused in (
        lambda: h.b.declare_queue("ex", passive=True, channel_id=stranger),
        lambda: h.b.consume(stranger, "ex"),
        lambda: h.b.channel_get(stranger, "ex"),
        lambda: h.b.purge_queue("ex", channel_id=stranger),
    ):
        with pytest.raises(ResourceLocked):
            refused()


def test_the_queue_outlives_its_declaring_channel_until_the_connection_closes() -> None:
    h = Harness()
    conn = h.b.open_connection()
    a = h.channel()
    h.b.join_connection(a, conn)
    h.b.declare_queue("ex", exclusive=True, durable=False, channel_id=a)
    h.b.declare_queue("", exclusive=True, durable=False, channel_id=a)
    h.b.close_channel(a)
    assert len(h.b.queues) == 2
    later = h.channel()
    h.b.join_connection(later, conn)
    h.b.consume(later, "ex")  # a channel opened later still may use it
    h.b.close_channel(later)
    h.b.close_connection(conn)
    assert h.b.queues == {}
    h.b.close_connection(conn)  # idempotent
    other = h.channel()
    h.b.declare_queue("ex", exclusive=True, durable=False, channel_id=other)  # the name is free


def test_a_deleted_exclusive_queue_is_forgotten_by_its_connection() -> None:
    h = Harness()
    conn = h.b.open_connection()
    a = h.channel()
    h.b.join_connection(a, conn)
    h.b.declare_queue("ex", exclusive=True, durable=False, channel_id=a)
    h.b.delete_queue("ex", channel_id=a)
    other = h.channel()
    h.b.declare_queue("ex", exclusive=True, durable=False, channel_id=other)
    h.b.close_connection(conn)
    assert "ex" in h.b.queues  # the new owner's queue of the same name stays


def test_joining_is_refused_to_a_closed_connection_or_a_channel_with_queues() -> None:
    h = Harness()
    conn = h.b.open_connection()
    ch = h.channel()
    h.b.declare_queue("mine", exclusive=True, durable=False, channel_id=ch)
    with pytest.raises(ChannelError):
        h.b.join_connection(ch, conn)
    h.b.close_connection(conn)
    with pytest.raises(ChannelError):
        h.b.join_connection(h.channel(), conn)
    with pytest.raises(ChannelError):
        h.b.join_connection(99, h.b.open_connection())
    assert h.b.open_connection() < 0  # never a channel's id
