"""A received chunk's op lines: split, decoded and, for the per-message ops
(``publish``, ``ack``), applied in one call per run of them (compiled in the compiled
build; docs/architecture.md, "The compiled build").

The reader (``reader.serve_reader``) hands over a chunk's complete lines;
:func:`split_block` splits them and, when the whole block is ASCII without ``\\u``
escapes, decodes every line with one msgspec call (``typed.py``'s types); a block
with any line those types refuse leaves the decoding to one line at a time, as
``typed.decode_hot`` does. :func:`apply_typed` then applies lines in order while each
is a typed ``publish`` or ``ack`` it can take exactly as the general path would, and
returns the index of the first line it leaves to the general path (any other op, a
publish with headers, a ``deadline_ms`` or direct reply-to's ``reply_to``,
publishing blocked, an ack in cluster mode). It never decides an error of its own:
an error raised here is the general path's (same checks, same order), and the
failing op becomes ``current_op`` so its ``id`` is echoed.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET

from broker.api.channel.session import ServedChannel
from broker.api.channel.typed import AckOp, PublishOp, decode_hot, decoder
from broker.api.codec import body_from_b64, parse_op_line
from broker.api.fields import DEFAULT_EXCHANGE_ALIAS
from broker.api.userid import check_user_id
from broker.core import (
    REPLY_TO,
    ErrorReply,
    InvalidArgument,
    check_delay,
    delivery_cost,
)

__all__ = ["apply_typed", "split_block"]

_decode_lines = decoder.decode_lines
_to_builtins = msgspec.to_builtins


def split_block(block: bytes) -> tuple[list[bytes], list[PublishOp | AckOp] | None]:
    """The block's non-blank lines and, when one msgspec call could decode them all
    as typed ops, those ops (one per line); else None (decode per line)."""
    lines = [line for line in block.split(b"\n") if line and not line.isspace()]
    if not block.isascii() or (block.find(b"\\") >= 0 and b"\\u" in block):
        return lines, None
    try:
        ops: list[PublishOp | AckOp] = _decode_lines(block)
    except (msgspec.DecodeError, RecursionError):
        return lines, None
    # (decode_lines skips blank lines as the list above does; a line of other white
    # space, which the list skips, makes it raise)
    return lines, ops if len(ops) == len(lines) else None


def apply_typed(s: ServedChannel, lines: list[bytes], ops: list[PublishOp | AckOp] | None, start: int) -> int:
    """Apply ``lines[start:]`` (``ops``: their decoded ops, or None) while each is a
    typed op this path takes; the index of the first line it left (``len(lines)``
    when it took them all). Raises the general path's ``ErrorReply``."""
    end = len(lines)
    if start >= end:
        return end
    runtime = s.runtime
    flow = runtime.flow
    clustered = runtime.cluster is not None
    channel_ops = s.channel_ops
    gateway = s.gateway
    channel_id = s.channel_id
    access = s.access
    max_body = runtime.options.max_body_bytes
    allowed_exchange: str | None = None  # the last exchange the access allowed (this call)
    i = start
    failed = False
    try:
        while i < end:
            op = decode_hot(lines[i]) if ops is None else ops[i]
            if op is None or flow.blocked:  # (blocked: publishes wait on the general path)
                return i
            if type(op) is AckOp:
                if s.relayed is not None:
                    return i  # cluster mode: its deliveries may be settled on other nodes
                tags = op.delivery_tags
                if tags is UNSET:
                    # a null tag goes to the core as the general path sends it (which refuses it)
                    tag: object = None if op.delivery_tag is UNSET else op.delivery_tag
                    channel_ops.ack(tag, op.multiple is True)
                elif op.delivery_tag is UNSET and op.multiple is UNSET:
                    assert isinstance(tags, list)
                    channel_ops.ack_each(tags)
                else:
                    return i
                i += 1
                continue
            assert type(op) is PublishOp
            if op.deadline_ms is not UNSET:
                return i
            props = op.properties
            properties: dict[str, Any] | None = None
            if props is not None:
                if props.headers is not UNSET:
                    return i  # headers need the general path's JSON checks
                reply_to = props.reply_to
                if reply_to is not None and reply_to == REPLY_TO:
                    return i  # direct reply-to: the general path gives the channel's address
                properties = _to_builtins(props) or None
            exchange = op.exchange
            if exchange != allowed_exchange:
                access.require("publish", exchange or DEFAULT_EXCHANGE_ALIAS)
                allowed_exchange = exchange
            body_b64 = op.body_b64
            if body_b64 is UNSET:
                body = op.body.encode("utf-8", "surrogatepass")
            else:
                assert isinstance(body_b64, str)
                body = body_from_b64(body_b64)
            if len(body) > max_body:
                raise InvalidArgument(f"message body over {max_body} bytes", code="payload_too_large")
            if props is not None and props.user_id is not None and not s.entry_checked:
                check_user_id(props.user_id, access)  # (where the general path checks it)
            delay = op.delay_s
            delay_s = None if delay is None else check_delay(delay)
            if exchange == DEFAULT_EXCHANGE_ALIAS:
                exchange = ""
            if clustered:
                gateway.publish(
                    channel_id, exchange, op.routing_key, body, properties,
                    mandatory=op.mandatory, delay_s=delay_s, charge=delivery_cost(body), dedup=op.dedup,
                )
            else:
                channel_ops.publish(exchange, op.routing_key, body, properties, op.mandatory, delay_s,
                                    delivery_cost(body), op.dedup)
            i += 1
        return i
    except ErrorReply:
        failed = True
        s.current_op = parse_op_line(lines[i])
        raise
    finally:
        if i > start and not failed:
            s.current_op = None  # as after the general path's publish and ack
