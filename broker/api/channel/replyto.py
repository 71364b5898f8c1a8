"""Direct reply-to on an HTTP channel: the channel as a requester of RabbitMQ's
``amq.rabbitmq.reply-to`` (docs/protocol.md, "Direct reply-to"; the core keeps the
reply consumer and hands replies to it: ``broker/core/directreply.py``).

What the channel's ops mean for it, with the AMQP listener's rules
(``broker/amqp/replyto.py``) and the channel's error codes:

- ``consume`` of ``amq.rabbitmq.reply-to`` (``no_ack`` only) makes the channel's
  reply consumer, with a secret drawn here (after this node's label in a cluster, so
  that any node can forward a reply to it). No queue, so no permission is asked. Its
  replies are ``deliver`` events that each take a delivery tag of their own, as every
  delivery of an HTTP channel does;
- ``cancel`` of its tag ends it;
- a publish whose ``reply_to`` is exactly ``amq.rabbitmq.reply-to`` carries the
  channel's reply address instead (``precondition_failed`` on a channel without a
  reply consumer, before anything of the publish is taken); not on a peer's
  forwarding channel, which carries what its node decided (there the literal name
  was an ordinary property: a REST publish's).
"""

from __future__ import annotations

import secrets
from typing import Any

from broker.api.channel.session import ServedChannel
from broker.core import REPLY_TO, PreconditionFailed, reply_secret

__all__ = ["REPLY_TO", "cancel_reply", "consume_reply", "reply_properties"]


def consume_reply(s: ServedChannel, consume_ok: dict[str, Any], consumer_tag: str, no_ack: bool) -> None:
    """A ``consume`` of ``amq.rabbitmq.reply-to`` with ``consumer_tag`` (empty: one is
    generated, in RabbitMQ's ``amq.ctag-`` form): make the reply consumer, then queue
    ``consume_ok`` (the op's reply event, its tag and ``active`` filled in here).
    Raises the core's ``not_allowed`` (a tag in use, of any kind: relayed consumers
    hold theirs in the core too) and ``precondition_failed`` errors."""
    tag = consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
    cluster = s.runtime.cluster
    secret = reply_secret(secrets.token_urlsafe(16), cluster.node_name if cluster is not None else None)
    cid = s.channel_id
    s.batch.run(lambda core: core.reply_consume(cid, tag, no_ack=no_ack, secret=secret, own_tags=True))
    consume_ok["consumer_tag"] = tag
    consume_ok["active"] = True
    s.send_event(consume_ok)


def cancel_reply(s: ServedChannel, consumer_tag: str) -> bool:
    """End the channel's reply consumer if ``consumer_tag`` is its: whether it was."""
    cid = s.channel_id
    return bool(s.batch.run(lambda core: core.reply_cancel(cid, consumer_tag)))


def reply_properties(s: ServedChannel, properties: dict[str, Any]) -> dict[str, Any]:
    """``properties`` (checked; their ``reply_to`` is ``amq.rabbitmq.reply-to``) with
    the channel's reply address as ``reply_to`` (a copy). Raises PreconditionFailed
    on a channel without a reply consumer."""
    address = s.views.reply_address(s.channel_id)
    if address is None:
        raise PreconditionFailed("fast reply consumer does not exist")
    return {**properties, "reply_to": address}
