"""Cluster mode: an AMQP channel's consumers and gets of queues another node owns.

They go through the HTTP channel's relayed consumers (``RelayedConsumers``,
docs/cluster.md "Any node serves any queue"): the owner delivers on a channel this
node opened to it, each delivery gets a delivery tag of the AMQP channel, and the
client's ``basic.ack``/``nack``/``reject``/``recover`` of those tags, ``basic.cancel``
and the channel's end are carried back to the owner. This module turns the relay's
events into AMQP frames and AMQP's settle methods into the relay's ops, and maps the
owner's refusals to RabbitMQ's reply codes: a queue whose owner is down answers
``404 NOT_FOUND`` "home node ... is down or inaccessible" (RabbitMQ's answer for a
classic queue whose node is down), and a relayed consumer whose owner goes down, or
whose queue the owner deletes, or of a queue its user may no longer read (a
permission revoked on any node), is cancelled with ``basic.cancel`` from the server.

A consumer of a quorum queue goes on from the queue's next leader instead, without a
``basic.cancel``, whether it was relayed or on this node when this node stopped
leading the queue (:func:`quorum_of` keeps those; ``broker/api/channel/relay_resume.py``).
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from broker.amqp.frames import (
    encode_cancel,
    encode_consume_ok,
    encode_deliver,
    encode_get_ok,
    encode_sent_properties,
)
from broker.amqp.replies import (
    ACCESS_REFUSED,
    NOT_ALLOWED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
)
from broker.amqp.replyto import reused_tag
from broker.amqp.session import AMQPChannel, AMQPException, AMQPSession
from broker.api import LocalQuorumConsumers, RelayedConsumers
from broker.core import ChannelError, ConsumerTagInUse, ErrorReply, Unavailable

__all__ = ["quorum_of", "relay_consume", "relay_get", "remote_owner", "settle_relayed"]

log = logging.getLogger("ackbus.amqp")

#: The owner's error codes (the channel protocol's) as AMQP reply codes.
_REPLY_CODES = {
    "not_found": (NOT_FOUND, "NOT_FOUND"),
    "access_refused": (ACCESS_REFUSED, "ACCESS_REFUSED"),
    "resource_locked": (RESOURCE_LOCKED, "RESOURCE_LOCKED"),
    "not_allowed": (NOT_ALLOWED, "NOT_ALLOWED"),
}


def relays_of(s: AMQPSession, ch: AMQPChannel) -> RelayedConsumers | None:
    """The channel's relayed consumers (made on first use); None on a single node."""
    if ch.relayed is None:
        cluster = s.bridge.runtime.cluster
        if cluster is None or s.tasks is None:
            return None
        ch.relayed = RelayedConsumers(
            ch.core_id, s.bridge.gateway, lambda ev: _event(s, ch, ev), lambda: ch.closed, s.tasks, cluster,
            s.principal, quorum_of(s, ch),
        )
    return ch.relayed


def quorum_of(s: AMQPSession, ch: AMQPChannel) -> LocalQuorumConsumers | None:
    """The channel's consumers here of quorum queues (made on first use; the
    channel's relays, which resume them, only when one loses its leader: until then
    its settles stay on the fast path); None on a single node."""
    if ch.quorum is None:
        cluster = s.bridge.runtime.cluster
        if cluster is None:
            return None

        def resume(queue: str, consumer_tag: str, consume_op: dict[str, Any], reason: str) -> bool:
            relayed = relays_of(s, ch)
            return relayed is not None and relayed.resume(queue, consumer_tag, consume_op, reason)

        ch.quorum = LocalQuorumConsumers(ch.core_id, s.bridge.gateway, cluster, resume)
    return ch.quorum


def consume_fields(tag: str, m: Any) -> dict[str, Any]:
    """A ``basic.consume``'s fields as a channel's consume op has them."""
    op: dict[str, Any] = {"consumer_tag": tag, "no_ack": bool(m.no_ack), "exclusive": bool(m.exclusive)}
    if m.arguments and "x-priority" in m.arguments:
        op["arguments"] = {"x-priority": m.arguments["x-priority"]}
    return op


def remote_owner(s: AMQPSession, ch: AMQPChannel, queue: str) -> tuple[RelayedConsumers, str, str | None] | None:
    """(the channel's relays, owner, its URL or None while down) when ``queue`` is
    another node's; None when it is this node's (or there is no cluster)."""
    cluster = s.bridge.runtime.cluster
    located = cluster.owner_of(queue) if cluster is not None and queue else None
    if located is None or cluster is None or located[0] == cluster.node_name:
        return None  # (a channel without relays keeps its settles on the fast path)
    relayed = relays_of(s, ch)
    return None if relayed is None else (relayed, located[0], located[1])


def _amqp_error(exc: ErrorReply, queue: str, owner: str) -> AMQPException | ErrorReply:
    """The owner's refusal as the error the AMQP channel closes with."""
    if isinstance(exc, ConsumerTagInUse):  # (this node's refusal, before the owner is asked)
        return reused_tag(exc.tag)
    if isinstance(exc, Unavailable) and exc.code == "queue_unavailable":
        return AMQPException(
            NOT_FOUND, f"NOT_FOUND - home node '{owner}' of durable queue '{queue}' in vhost '/' is down or inaccessible")
    if isinstance(exc, ChannelError) and exc.code in _REPLY_CODES:
        code, name = _REPLY_CODES[exc.code]
        return AMQPException(code, f"{name} - {exc.message}")
    return exc


async def relay_consume(s: AMQPSession, ch: AMQPChannel, queue: str, tag: str, m: Any, located: tuple[RelayedConsumers, str, str | None]) -> None:
    """``basic.consume`` of another node's queue: consumed there, its deliveries
    passed on after the consume-ok."""
    relayed, owner, url = located
    op = consume_fields(tag, m)
    s.bridge.flush()
    try:
        await relayed.consume(queue, owner, url, op)
    except ErrorReply as exc:
        raise _amqp_error(exc, queue, owner) from None
    if not m.nowait:
        s.reply_raw(ch, encode_consume_ok(ch.number, tag))
    relayed.started(tag)
    s.wake()


async def relay_get(s: AMQPSession, ch: AMQPChannel, queue: str, no_ack: bool, located: tuple[RelayedConsumers, str, str | None]) -> bool:
    """``basic.get`` of another node's queue: True when a get-ok was sent, False when
    the queue was empty."""
    relayed, owner, url = located
    s.bridge.flush()
    try:
        got = await relayed.get(queue, owner, url, no_ack)
    except ErrorReply as exc:
        raise _amqp_error(exc, queue, owner) from None
    if got is None:
        return False
    tag = int(got["delivery_tag"])
    ch.max_tag = max(ch.max_tag, tag)
    body, props = _message(got, s.conn.frame_max)
    s.conn.send_raw(encode_get_ok(
        ch.number, tag, bool(got.get("redelivered")), str(got.get("exchange") or ""), str(got.get("routing_key") or ""),
        int(got.get("message_count") or 0), props, body, s.conn.frame_max,
    ))
    return True


def _message(ev: dict[str, Any], frame_max: int) -> tuple[bytes, bytes]:
    """The body and the encoded properties (for a connection of ``frame_max``) of a
    relayed event's ``message``."""
    message = ev.get("message") or {}
    if "body_b64" in message:
        body = base64.b64decode(message["body_b64"])
    else:
        body = str(message.get("body") or "").encode("utf-8")
    properties = message.get("properties") or None
    count = ev.get("delivery_count")
    if properties and count and isinstance(properties.get("headers"), dict):
        # the channel protocol's x-delivery-count: not in a local AMQP delivery either
        headers = {k: v for k, v in properties["headers"].items() if k != "x-delivery-count"}
        properties = {**properties, "headers": headers} if headers else {k: v for k, v in properties.items() if k != "headers"}
    return body, encode_sent_properties(properties, frame_max)


def _event(s: AMQPSession, ch: AMQPChannel, ev: dict[str, Any]) -> None:
    """An event of the channel's relays (called by their tasks), as AMQP frames."""
    if ch.closed or ch.number not in s.conn.channels:
        return
    kind = ev.get("ev")
    if kind == "deliver":
        tag = int(ev["delivery_tag"])
        ch.max_tag = max(ch.max_tag, tag)
        body, props = _message(ev, s.conn.frame_max)
        s.conn.send_raw(encode_deliver(
            ch.number, str(ev.get("consumer_tag")), tag, bool(ev.get("redelivered")), str(ev.get("exchange") or ""),
            str(ev.get("routing_key") or ""), props, body, s.conn.frame_max,
        ))
    elif kind == "cancel":
        log.info("amqp relayed consumer cancelled", extra={"fields": {
            "channel": ch.number, "consumer_tag": ev.get("consumer_tag"), "reason": str(ev.get("reason"))[:200]}})
        if s.cancel_notify:
            s.conn.send_raw(encode_cancel(ch.number, str(ev.get("consumer_tag"))))
    elif kind == "expired":
        s.fail_later(
            ch, PRECONDITION_FAILED,
            f"delivery acknowledgement on channel {ch.number} timed out (delivery tag {ev.get('delivery_tag')})",
        )
    s.wake()


async def settle_relayed(s: AMQPSession, ch: AMQPChannel, op: dict[str, Any], tag: int, multiple: bool) -> int | None:
    """Settle the relayed deliveries an ack, nack or reject names on their owners;
    the tag this node's core must settle next (None: nothing here)."""
    relayed = ch.relayed
    if relayed is None:
        return tag
    if tag == 0 and multiple:
        tag = ch.max_tag  # everything delivered so far
    if relayed.owns(tag):
        await relayed.settle(op, tag, multiple)
        if not multiple:
            return None
    elif multiple:
        await relayed.settle(op, tag, True)
    if not multiple:
        return tag
    # the newest of this node's own unacked deliveries up to tag
    return s.views.newest_unacked_tag(ch.core_id, tag) or None
