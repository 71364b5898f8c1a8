"""The channel's reader task: request-body bytes -> op lines -> ops applied in order.

All complete lines of one received chunk are applied before the core's effects are
carried out (one ``flush`` of the session's command batch), so the confirms of a
chunk's publishes leave together after one fsync. An op with a reply first flushes
what earlier ops caused, so its reply follows them (a barrier); ``publish`` and the
settling ops do not. Unknown ops and unknown fields are channel errors
(``broker.api.channel.opfields``).
"""

from __future__ import annotations

from typing import Any

import trio

from broker.api.channel.chunk import apply_typed, split_block
from broker.api.channel.opfields import (
    OP_FIELDS,
    PUBLISH_FIELDS,
    ChannelClosed,
    check_fields,
    check_id,
    op_delay,
)
from broker.api.channel.ops import OPS, SETTLE_OPS
from broker.api.channel.replyto import REPLY_TO, reply_properties
from broker.api.channel.session import ServedChannel
from broker.api.codec import body_from_json, parse_op_line
from broker.api.fields import (
    DEFAULT_EXCHANGE_ALIAS,
    deadline_ms,
    exchange_name,
    unknown_fields,
)
from broker.api.userid import check_user_id
from broker.core import (
    ChannelError,
    InvalidArgument,
    check_properties,
    delivery_cost,
)
from broker.http import ClientDisconnected, Request

__all__ = ["apply", "serve_reader"]

_PUBLISH_ALLOWED = OP_FIELDS["publish"]
assert _PUBLISH_ALLOWED >= PUBLISH_FIELDS


async def serve_reader(s: ServedChannel, request: Request) -> None:
    """Apply operations from the request body until close, end of body or error.

    Raises: ``ErrorReply`` (a channel error: the caller reports it in-band),
    ``ClientDisconnected``.
    """
    # Bytes of an unfinished line. Only the newly received chunk is searched for
    # a newline, so a long line arriving in many pieces costs linear time.
    pending = bytearray()
    max_line = s.runtime.options.max_body_bytes * 2 + 65536
    batch = s.batch
    flow = s.runtime.flow
    try:
        async for chunk in request.iter_body(max_bytes=None, timeout_s=None):
            end = chunk.rfind(b"\n")
            if end < 0:
                pending += chunk
                if len(pending) > max_line:
                    raise InvalidArgument("operation line too long", code="payload_too_large")
                continue
            if pending:
                pending += chunk[:end]
                block = bytes(pending)
                pending = bytearray(chunk[end + 1 :])
            else:
                block = chunk[:end]
                pending = bytearray(chunk[end + 1 :])
            try:
                # runs of publishes and acks in one compiled call (chunk.py); each
                # other line through the general path, in order
                lines, ops = split_block(block)
                i = apply_typed(s, lines, ops, 0)
                while i < len(lines):
                    op = parse_op_line(lines[i])
                    if op.get("op") == "publish":
                        # apply()'s publish branch without a coroutine per message
                        s.current_op = op
                        if flow.blocked:
                            await publish_when_allowed(s, op)
                        else:
                            publish(s, op)
                        s.current_op = None
                    else:
                        await apply(s, op)
                    i = apply_typed(s, lines, ops, i + 1)
            finally:
                batch.flush()
            if s.closing_reason is not None:
                s.end_if_quiet()  # the acks sent in answer to closing may be the last
            await s.wait_outbox_room()
        if pending.strip():
            try:
                await apply(s, parse_op_line(bytes(pending)))
            finally:
                batch.flush()
        # End of input: finish the confirms, then end the channel unless it still
        # consumes (curl piping one consume op keeps receiving), its replies too.
        await s.flush_confirms()
        consuming = s.views.consumer_tags(s.channel_id) or s.views.reply_address(s.channel_id) is not None
        if consuming and s.closing_reason is None:
            await _until_closing_or_gone(s, request)
        s.stop_consumers()
        s.send_final({"ev": "close_ok"})
    except ChannelClosed:
        pass


async def _until_closing_or_gone(s: ServedChannel, request: Request) -> None:
    """Keep a consuming channel whose input ended until the broker closes it; raises
    ClientDisconnected if the client leaves first."""
    disconnected = False
    async with trio.open_nursery() as nursery:

        async def until_closing() -> None:
            await s.closing_event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(until_closing)
        await request.wait_disconnected()
        disconnected = True
        nursery.cancel_scope.cancel()
    if disconnected:
        # Raised outside the nursery, so the caller sees it unwrapped.
        raise ClientDisconnected("client closed the connection")


async def apply(s: ServedChannel, op: dict[str, Any]) -> None:
    """Apply one operation. Raises ``ErrorReply`` (a channel error)."""
    s.current_op = op
    name = op.get("op")
    if name == "publish":
        if s.runtime.flow.blocked:
            await publish_when_allowed(s, op)
        else:
            publish(s, op)
        s.current_op = None
        return
    handler = OPS.get(name) if isinstance(name, str) else None
    if handler is None:
        raise ChannelError(f"unknown op {str(name)[:64]!r}", code="unknown_op")
    assert isinstance(name, str)
    check_fields(op, name, OP_FIELDS[name])
    check_id(op)
    if name not in SETTLE_OPS:
        # Events caused by earlier ops go out before this op's reply (a barrier).
        s.batch.flush()
    await handler(s, op)


def publish(s: ServedChannel, op: dict[str, Any]) -> None:
    """A publish op: decoded, authorized, handed to the core (its effects leave with
    the chunk's; its confirm arrives later as an ``ack``/``nack`` event)."""
    exchange, routing_key, body, properties, mandatory, dedup = _decode_publish(s, op)
    s.gateway.publish(
        s.channel_id, exchange, routing_key, body, properties,
        mandatory=mandatory, delay_s=op_delay(op), charge=delivery_cost(body), dedup=dedup,
    )


async def publish_when_allowed(s: ServedChannel, op: dict[str, Any]) -> None:
    """A publish while publishing is blocked (a memory or disk alarm): what came
    before it leaves, then it waits (and the channel reads nothing more meanwhile)
    until publishing resumes, or is refused with a ``nack``: once the channel has
    waited ``blocked_publish_wait_s`` in this alarm (the alarm's reason), or at its
    own ``deadline_ms`` (reason ``deadline``). A malformed publish is still a
    channel error first."""
    _decode_publish(s, op)
    op_delay(op)
    s.batch.flush()
    now = trio.current_time()
    deadline = now + deadline_ms(op["deadline_ms"], "deadline_ms") / 1000 if "deadline_ms" in op else None
    if s.blocked_since is None:
        s.blocked_since = now
    refusal = await s.gateway.wait_publishable(since=s.blocked_since, deadline=deadline)
    if refusal is None or s.gateway.refuse_publish(s.channel_id, refusal) is None:
        publish(s, op)


def _decode_publish(
    s: ServedChannel, op: dict[str, Any]
) -> tuple[str, str, bytes, dict[str, Any] | None, bool, bool]:
    """A publish op's exchange, routing key, body, properties, mandatory flag and
    ``dedup`` flag (default true: deduplicated by ``message_id``), checked and
    authorized. Raises ``ErrorReply`` (a channel error)."""
    if not _PUBLISH_ALLOWED.issuperset(op):
        raise unknown_fields(op, _PUBLISH_ALLOWED, "publish op")
    exchange = op.get("exchange", "")
    routing_key = op.get("routing_key", "")
    if not isinstance(exchange, str) or not isinstance(routing_key, str):
        raise InvalidArgument("exchange and routing_key must be strings")
    s.access.require("publish", exchange or DEFAULT_EXCHANGE_ALIAS)
    body = body_from_json(op)
    max_body = s.runtime.options.max_body_bytes
    if len(body) > max_body:
        raise InvalidArgument(f"message body over {max_body} bytes", code="payload_too_large")
    if s.entry_checked:  # (a node's forwarding channel: see ServedChannel.entry_checked)
        properties = check_properties(op.get("properties"), amqp_limits=False)
    else:
        properties = check_properties(op.get("properties"))
        if properties is not None:
            check_user_id(properties.get("user_id"), s.access)
    if properties is not None and properties.get("reply_to") == REPLY_TO and not s.forwarded:
        # direct reply-to (replyto.py); a peer's forwarding channel carries what its
        # node decided: there the literal name is an ordinary property (REST's)
        properties = reply_properties(s, properties)
    mandatory = op.get("mandatory", False)
    if not isinstance(mandatory, bool):
        raise InvalidArgument("mandatory must be true or false")
    dedup = op.get("dedup", True)
    if not isinstance(dedup, bool):
        raise InvalidArgument("dedup must be true or false")
    if "deadline_ms" in op:
        deadline_ms(op["deadline_ms"], "deadline_ms")
    return exchange_name(exchange), routing_key, body, properties, mandatory, dedup
