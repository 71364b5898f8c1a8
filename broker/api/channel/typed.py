"""The channel's per-message ops (``publish``, ``ack``) decoded into typed structures
in C (msgspec), their field names and types checked by the decoder.

This is a fast path only: it never decides an error of its own. A line the decoder
refuses (an unknown field, a wrong type, a value out of range, any other op, bad
JSON), or that it cannot judge exactly as the general path would (a line with
non-ASCII text or a ``\\u`` escape, whose property lengths count UTF-8 bytes;
message headers, which need the full JSON checks; a ``deadline_ms``), gets ``None`` from
:func:`decode_hot`, and the reader applies it through the general path
(``parse_op_line`` and the op's own checks), which answers exactly as before. So
every error a client can see keeps its code and message. What the decoder accepts,
the general path would have accepted with the same values: the types below are the
general path's checks written as types (``bool`` is no ``int``, integers in the
range orjson decodes as integers, property strings at most 255 characters, which
for ASCII text is 255 bytes).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

__all__ = ["UNSET", "AckOp", "PublishOp", "decode_hot", "decoder"]

# Integers orjson decodes as ``int`` (larger ones become floats, which the general
# path refuses or reads differently): the decoder refuses the rest, so they take
# the general path.
_Int64 = Annotated[int, Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
# A property string: at most 255 bytes of UTF-8, which for ASCII text is 255
# characters (lines with other text take the general path).
_Str255 = Annotated[str, Meta(max_length=255)]


class PublishProperties(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A publish's ``properties`` (``broker.core.check_properties`` as types; a null
    value is the same as an absent one, as there)."""

    content_type: _Str255 | None = None
    content_encoding: _Str255 | None = None
    correlation_id: _Str255 | None = None
    reply_to: _Str255 | None = None
    message_id: _Str255 | None = None
    type: _Str255 | None = None
    app_id: _Str255 | None = None
    user_id: _Str255 | None = None
    cluster_id: _Str255 | None = None
    delivery_mode: Literal[1, 2] | None = None
    priority: Annotated[int, Meta(ge=0, le=255)] | None = None
    expiration: Annotated[int, Meta(ge=0, le=(1 << 32) - 1)] | None = None
    timestamp: Annotated[int, Meta(ge=0, le=(1 << 63) - 1)] | None = None
    # Present: the general path takes the line (headers need the JSON value checks).
    headers: Raw | UnsetType = UNSET


class PublishOp(Struct, tag="publish", tag_field="op", forbid_unknown_fields=True):
    """``{"op":"publish",...}`` (``broker.api.channel.opfields.PUBLISH_FIELDS``)."""

    exchange: str = ""
    routing_key: str = ""
    body: str = ""
    body_b64: str | UnsetType = UNSET
    properties: PublishProperties | None = None
    mandatory: bool = False
    dedup: bool = True
    delay_s: _Int64 | float | None = None
    # Present: the general path takes the line (it checks the deadline's forms).
    deadline_ms: Raw | UnsetType = UNSET
    # A publish's id is not checked by the general path either; other JSON values
    # (objects, lists, floats) take the general path.
    id: str | _Int64 | None = None


class AckOp(Struct, tag="ack", tag_field="op", forbid_unknown_fields=True):
    """``{"op":"ack","delivery_tag":N[,"multiple":true]}`` or
    ``{"op":"ack","delivery_tags":[N,...]}``. No ``id``: an ack with one takes the
    general path, which checks it; so does one with both forms (an error)."""

    delivery_tag: _Int64 | None | UnsetType = UNSET
    multiple: bool | UnsetType = UNSET
    delivery_tags: list[_Int64] | UnsetType = UNSET


#: Decodes a line (or, ``decode_lines``, a block of lines) as a typed op.
decoder = msgspec.json.Decoder(PublishOp | AckOp)
_decode = decoder.decode
_BACKSLASH = 0x5C


def decode_hot(line: bytes) -> PublishOp | AckOp | None:
    """``line`` as a typed op, or None: the general path must take it."""
    if not line.isascii() or (line.find(_BACKSLASH) >= 0 and b"\\u" in line):
        return None
    try:
        op: PublishOp | AckOp = _decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    return op
