"""The ``ackbus`` CLI's output: messages as text or JSON, a closed output pipe, and
the library's log records of failures the CLI prints itself (each error shows once)."""

from __future__ import annotations

import logging
import select
from typing import IO, Any

import orjson

from .codec import encode_body
from .consumer import Message
from .rest import LeasedMessage

__all__ = ["message_json", "print_message", "pipe_reader_gone", "drop_raised"]


def message_json(message: Message | LeasedMessage) -> bytes:
    """``--format json``: exchange, routing key, redelivered, properties, and the body
    (``body``, or ``body_b64`` when it is not UTF-8)."""
    obj: dict[str, Any] = {
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "redelivered": message.redelivered,
        "properties": message.properties.to_json(),
    }
    obj.update(encode_body(message.body))
    return orjson.dumps(obj)


def print_message(out: IO[str], message: Message | LeasedMessage, fmt: str) -> None:
    """One message on ``out``, as ``fmt`` (``text``: the body; ``json``), flushed."""
    if fmt == "json":
        out.write(message_json(message).decode() + "\n")
    else:
        out.write(message.body.decode("utf-8", "replace") + "\n")
    out.flush()


def pipe_reader_gone(out: IO[str]) -> bool:
    """``out`` is a pipe whose reader went away (``ackbus queues | head``): polling
    its write end reports an error."""
    try:
        poller = select.poll()
        poller.register(out.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # not a file (tests: StringIO)
        return False


def drop_raised(record: logging.LogRecord) -> bool:
    """A log filter: not the records of failures the CLI prints itself (the library
    marks them: they reach the caller as exceptions), so each error shows once."""
    return not getattr(record, "ackbus_raised", False)
