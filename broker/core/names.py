"""Entity names and their rules (AMQP 0-9-1 §4.2.5.3 shortstr: at most 255 bytes).

Exchange and queue names are UTF-8 strings of 1..255 bytes; names starting with
``amq.`` are reserved for the broker (AMQP 0-9-1 "access-refused" on declare).
"""

from __future__ import annotations

from .errors import AccessRefused, InvalidArgument

__all__ = ["MAX_NAME_BYTES", "RESERVED_PREFIX", "SERVER_NAMED_PREFIX", "check_name", "check_routing_key"]

MAX_NAME_BYTES = 255
RESERVED_PREFIX = "amq."
#: How the names the broker gives queues declared without one begin (RabbitMQ's).
SERVER_NAMED_PREFIX = "amq.gen-"


def check_name(kind: str, name: object, *, allow_reserved: bool = False) -> str:
    """Return ``name`` if it is a valid exchange/queue name.

    Raises InvalidArgument for a non-string, empty, too long or control-character name,
    and AccessRefused for a reserved ``amq.`` name unless ``allow_reserved``.
    """
    if not isinstance(name, str):
        raise InvalidArgument(f"{kind} name must be a string")
    if not name:
        raise InvalidArgument(f"{kind} name must not be empty")
    if len(name) > MAX_NAME_BYTES or len(_utf8(kind + " name", name)) > MAX_NAME_BYTES:
        raise InvalidArgument(f"{kind} name is longer than {MAX_NAME_BYTES} bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise InvalidArgument(f"{kind} name must not contain control characters")
    if not allow_reserved and name.startswith(RESERVED_PREFIX):
        raise AccessRefused(
            f"{kind} name {name!r} is reserved: names starting with 'amq.' belong to the broker"
        )
    return name


def check_routing_key(key: object) -> str:
    """Return ``key`` if it is a valid routing key (a string of at most 255 bytes)."""
    if not isinstance(key, str):
        raise InvalidArgument("routing_key must be a string")
    # A key of more than 255 characters is too long whatever its encoding; a
    # shorter one may still be over 255 bytes (multi-byte characters).
    if len(key) > MAX_NAME_BYTES or (not key.isascii() and len(_utf8("routing_key", key)) > MAX_NAME_BYTES):
        raise InvalidArgument(f"routing_key is longer than {MAX_NAME_BYTES} bytes")
    return key


def _utf8(what: str, text: str) -> bytes:
    # Lone surrogates cannot be encoded, so they could never reach the log
    # (orjson and the ENQUEUE codec refuse them): reject them up front.
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} is not valid UTF-8 text") from None
