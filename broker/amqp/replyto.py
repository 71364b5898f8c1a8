"""Direct reply-to over AMQP: RabbitMQ's ``amq.rabbitmq.reply-to`` pseudo-queue.

The core keeps a channel's reply consumer and hands replies to it
(``broker/core/directreply.py``); this module is what the AMQP methods mean for it,
in RabbitMQ 3.10's words and codes:

- ``basic.consume`` of ``amq.rabbitmq.reply-to`` (no-ack only) makes the channel's
  reply consumer, with a secret drawn here (after this node's label in a cluster,
  so that any node can forward a reply to it);
- ``basic.cancel`` of its tag ends it;
- a publish on that channel with ``reply_to`` ``amq.rabbitmq.reply-to`` carries the
  channel's reply address instead (``406`` on a channel without a reply consumer);
- ``queue.declare`` (passive or not) of a name beginning with
  ``amq.rabbitmq.reply-to`` is the requester's check: ``declare-ok`` with 0 messages
  and 1 consumer while the address is live, ``404`` otherwise.
"""

from __future__ import annotations

import secrets
from typing import Any

from broker.amqp.frames import encode_consume_ok, encode_declare_ok
from broker.core import (
    REPLY_TO,
    ChannelError,
    ConsumerTagInUse,
    NotFound,
    PreconditionFailed,
    reply_secret,
)

__all__ = [
    "REPLY_TO", "reply_address_for", "reply_cancel", "reply_consume", "reply_declare", "is_reply_queue", "reused_tag",
]

# The session (``s``) and channel (``ch``) are ``session.py``'s, typed ``Any``:
# ``session.py`` imports this module. Refusals are the core's errors with RabbitMQ's
# texts; ``replies.reply_for`` gives their codes (406, 404, 530).


def reused_tag(tag: str) -> ChannelError:
    """RabbitMQ's refusal of a ``basic.consume`` whose tag a consumer of the channel
    has, of whatever kind (the core's ``ConsumerTagInUse``): 530, a connection
    exception. The one wording of it, for every kind of consume."""
    return ChannelError(f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'", code="not_allowed")


def is_reply_queue(name: str) -> bool:
    """Whether a ``queue.declare`` of ``name`` is direct reply-to's (RabbitMQ takes
    every name that begins so, dot or not)."""
    return name.startswith(REPLY_TO)


async def reply_consume(s: Any, ch: Any, m: Any, tag: str) -> None:
    """``basic.consume`` of ``amq.rabbitmq.reply-to`` with consumer tag ``tag``."""
    secret = reply_secret(secrets.token_urlsafe(16), s.bridge.node_name)
    try:
        s.bridge.run(lambda core: core.reply_consume(ch.core_id, tag, no_ack=bool(m.no_ack), secret=secret))
    except ConsumerTagInUse:  # (a consumer of any kind: relayed ones hold their tags in the core too)
        raise reused_tag(tag) from None
    except PreconditionFailed as exc:
        raise PreconditionFailed(f"PRECONDITION_FAILED - {exc.message}") from None
    if not m.nowait:
        s.reply_raw(ch, encode_consume_ok(ch.number, tag))


def reply_cancel(s: Any, ch: Any, consumer_tag: str) -> bool:
    """End the channel's reply consumer if ``consumer_tag`` is its: whether it was."""
    return bool(s.bridge.run(lambda core: core.reply_cancel(ch.core_id, consumer_tag)))


def reply_declare(s: Any, ch: Any, name: str, nowait: bool) -> None:
    """``queue.declare`` of a direct reply-to name (see the module docstring)."""
    if not s.views.reply_exists(name):
        raise NotFound(f"NOT_FOUND - no queue '{name}' in vhost '/'")
    ch.last_queue = name
    if not nowait:
        s.reply_raw(ch, encode_declare_ok(ch.number, name, 0, 1))


def reply_address_for(s: Any, ch: Any) -> str:
    """What a publish's ``reply_to`` of ``amq.rabbitmq.reply-to`` becomes on ``ch``."""
    address: str | None = s.views.reply_address(ch.core_id)
    if address is None:
        raise PreconditionFailed("PRECONDITION_FAILED - fast reply consumer does not exist")
    return address
