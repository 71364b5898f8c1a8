"""Direct reply-to: RabbitMQ's ``amq.rabbitmq.reply-to`` pseudo-queue, for RPC.

A requester's channel takes the pseudo-queue as its one *reply consumer*
(:meth:`DirectReplies.reply_consume`, no-ack only) and is given its *reply address*,
``amq.rabbitmq.reply-to.<secret>.<channel id>``: the edge writes it into the
``reply_to`` property of the requests the channel publishes. A reply is a publish to
the default exchange with that address as its routing key. No queue has such a name
(``amq.`` names are reserved), so the reply routes nowhere, and publishing hands it,
there and only there, to :meth:`DirectReplies.deliver_reply`: a ``Deliver`` to the
requester's channel, straight away, with no queue, no record, no ack and no
redelivery. A reply to a channel that has gone, cancelled its reply consumer, or
never had that secret (a made-up address) is dropped; it counts as unroutable either
way (a ``mandatory`` reply is returned even when it was delivered, as RabbitMQ does).

The secret is chosen by the caller (the edge draws it at random; the core draws
nothing) and may carry the node's label in a cluster (``<label>.<random>``): the
address names the channel by its id, and the secret makes it unguessable. Nothing
here is logged or kept in a snapshot: a reply consumer ends with its channel, and
with the broker.
"""

from __future__ import annotations

import base64
from typing import Any

from .constants import delivery_cost
from .delivery import Deliveries
from .effects import Deliver
from .entities import ChannelState
from .errors import InvalidArgument, PreconditionFailed
from .message import StoredMessage
from .shared import Outbox

__all__ = ["REPLY_TO", "REPLY_TO_PREFIX", "DirectReplies", "is_reply", "reply_node", "reply_secret"]

#: The pseudo-queue a requester consumes, and the ``reply_to`` it publishes with.
REPLY_TO = "amq.rabbitmq.reply-to"
#: How every reply address begins.
REPLY_TO_PREFIX = REPLY_TO + "."
#: The longest secret a caller may choose (an address stays a valid routing key).
_MAX_SECRET = 200


def is_reply(exchange: str, routing_key: str) -> bool:
    """Whether a publish to ``exchange`` with ``routing_key`` is a direct reply: to
    the default exchange, keyed by something of a reply address's form (whether that
    address exists is :meth:`DirectReplies.deliver_reply`'s business)."""
    return not exchange and routing_key.startswith(REPLY_TO_PREFIX)


def reply_secret(random: str, node: str | None = None) -> str:
    """A reply consumer's secret: ``random`` (drawn by the caller, without dots),
    after the label of ``node`` in a cluster (its name in unpadded URL-safe base64:
    names may hold dots), so that any node can tell where a reply goes."""
    if node is None:
        return random
    label = base64.urlsafe_b64encode(node.encode()).rstrip(b"=").decode()
    return f"{label}.{random}"


def reply_node(address: str) -> str | None:
    """The node a reply address of :func:`reply_secret`'s cluster form names; None
    for any other name (a single node's address, a malformed one)."""
    if not address.startswith(REPLY_TO_PREFIX):
        return None
    parts = address[len(REPLY_TO_PREFIX):].split(".")
    if len(parts) != 3 or not parts[0]:
        return None
    label = parts[0]
    try:
        node = base64.b64decode(label + "=" * (-len(label) % 4), altchars=b"-_", validate=True).decode()
    except ValueError:  # (binascii.Error, UnicodeDecodeError)
        return None
    return node or None


class DirectReplies:
    """Reply consumers and the delivery of replies (see the module docstring). Keeps
    its state on the channels themselves (``ChannelState.reply_consumer``), so a
    channel's end ends its reply consumer with nothing to clean up."""

    def __init__(self, deliveries: Deliveries, outbox: Outbox, *, backlog_bytes: int = 16 << 20) -> None:
        self._channels = deliveries.channels
        self._channel = deliveries.channel
        self._tags = deliveries.tags
        self._emit = outbox.emit
        #: how far replies may take a requester's credit below zero (bytes its edge
        #: holds unsent: a requester that stops reading): past it, replies are dropped
        self._backlog_bytes = backlog_bytes

    def reply_consume(
        self, channel_id: int, consumer_tag: str, *, no_ack: bool, secret: str, own_tags: bool = False
    ) -> str:
        """Make ``consumer_tag`` the channel's reply consumer; return its reply
        address. ``own_tags``: each reply takes a delivery tag of its own (the HTTP
        channel's numbering, where every delivery has one); else it shares the next
        delivery's (RabbitMQ 3.10's, AMQP's: see :meth:`deliver_reply`).
        Raises ConsumerTagInUse (a consumer of another kind has that tag:
        consumertags.py), PreconditionFailed (not ``no_ack``, or a reply consumer
        already), and InvalidArgument for an empty or over-long ``secret``."""
        ch = self._channel(channel_id)
        reply = ch.reply_consumer
        if reply is None or reply[0] != consumer_tag:  # (a second reply consumer: below)
            self._tags.check_free(ch, consumer_tag)
        if not no_ack:
            raise PreconditionFailed("reply consumer cannot acknowledge")
        if ch.reply_consumer is not None:
            raise PreconditionFailed("reply consumer already set")
        if not secret or len(secret) > _MAX_SECRET or not secret.isascii():
            raise InvalidArgument("a reply address's secret must be 1 to 200 ASCII characters")
        ch.reply_consumer = (consumer_tag, secret, own_tags)
        return f"{REPLY_TO_PREFIX}{secret}.{channel_id}"

    def reply_cancel(self, channel_id: int, consumer_tag: str | None) -> bool:
        """End the channel's reply consumer if its tag is ``consumer_tag`` (None:
        whatever its tag, as a channel that is ending stops all its consumers):
        whether it was. Its address routes nowhere from now on."""
        ch = self._channels.get(channel_id)
        if ch is None or ch.reply_consumer is None:
            return False
        if consumer_tag is not None and ch.reply_consumer[0] != consumer_tag:
            return False
        ch.reply_consumer = None
        return True

    def reply_address(self, channel_id: int) -> str | None:
        """The channel's reply address (None: it has no reply consumer)."""
        ch = self._channels.get(channel_id)
        if ch is None or ch.reply_consumer is None:
            return None
        return f"{REPLY_TO_PREFIX}{ch.reply_consumer[1]}.{channel_id}"

    def reply_exists(self, name: str) -> bool:
        """Whether ``name`` is the pseudo-queue itself or a live reply address (a
        requester's way to check, ``queue.declare`` of it, as RabbitMQ answers)."""
        return name == REPLY_TO or self._requester(name) is not None

    def deliver_reply(self, exchange_name: str, routing_key: str, body: bytes, properties: dict[str, Any] | None) -> bool:
        """Hand a reply published to ``routing_key`` (a reply address) to its
        requester's consumer; False when nobody is there (the reply is dropped).

        The delivery tag is the channel's next one, not taken: RabbitMQ 3.10 does the
        same (a no-ack delivery is never settled by its tag); taken when the consumer
        asked for ``own_tags`` (an HTTP channel's). It spends the channel's
        credit like any delivery (the edge gives it back once sent), but is never held
        back for want of it: there is no queue to wait in. So that a requester that
        stops reading cannot make the broker hold replies without end, one that would
        take its credit more than ``backlog_bytes`` below zero is dropped (False), as a
        reply to a requester that has gone is: an RPC caller asks again."""
        ch = self._requester(routing_key)
        if ch is None:
            return False
        if ch.credit < -self._backlog_bytes:
            return False
        reply_consumer = ch.reply_consumer
        assert reply_consumer is not None
        ch.credit -= delivery_cost(body)
        tag = ch.next_tag
        if reply_consumer[2]:
            ch.next_tag = tag + 1
        message = StoredMessage(0, exchange_name, routing_key, body, properties)
        self._emit(Deliver(ch.id, reply_consumer[0], tag, False, message))
        return True

    def _requester(self, name: str) -> ChannelState | None:
        """The open channel whose reply address ``name`` is, if any."""
        if not name.startswith(REPLY_TO_PREFIX):
            return None
        secret, dot, number = name[len(REPLY_TO_PREFIX):].rpartition(".")
        if not dot or not number.isascii() or not number.isdigit() or len(number) > 18:
            return None
        ch = self._channels.get(int(number))
        if ch is None or ch.closed or ch.reply_consumer is None or ch.reply_consumer[1] != secret:
            return None
        return ch
