"""Direct reply-to's check on an HTTP channel: ``declare_queue`` of a name that begins
with ``amq.rabbitmq.reply-to`` answers as the AMQP listener's ``queue.declare``
does (``broker/amqp/replyto.py``), in RabbitMQ 3.10's way, so that a requester asks
the same question over either protocol and gets the same answer:

- passive or not, before any other rule, and with no permission asked (no queue is
  touched, as for ``consume`` of the pseudo-queue);
- ``ok`` with ``created`` false, 0 messages and 1 consumer for the pseudo-queue itself
  and for a live reply address;
- ``not_found`` for any other such name: an address whose requester has gone (its
  channel ended or its reply consumer was cancelled), or one never given out.

The core answers which names exist (``DirectReplies.reply_exists``); in a cluster,
for the requesters of this node only, as over AMQP.
"""

from __future__ import annotations

from typing import Any

from broker.api.channel.opfields import reply
from broker.api.channel.session import ServedChannel
from broker.core import REPLY_TO, NotFound

__all__ = ["declare_reply", "is_reply_name"]


def is_reply_name(name: str) -> bool:
    """Whether a ``declare_queue`` of ``name`` is direct reply-to's check (every name
    that begins so, dot or not, as RabbitMQ takes them)."""
    return name.startswith(REPLY_TO)


def declare_reply(s: ServedChannel, op: dict[str, Any], name: str) -> None:
    """Answer ``op``, a ``declare_queue`` of ``name`` (a reply-to name): queue its
    ``ok``, or raise NotFound."""
    if not s.views.reply_exists(name):
        raise NotFound(f"no queue {name!r}")
    s.send_event(reply(op, "ok", op="declare_queue", queue=name, created=False, messages=0, consumers=1))
