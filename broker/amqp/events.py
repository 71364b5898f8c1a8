"""The events the connection state machine (``connection.py``) hands to the session:
what arrived, already checked against the protocol's rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broker.amqp.frames import Publish

__all__ = [
    "Acks",
    "ChannelClosedByPeer",
    "ChannelFailed",
    "ChannelOpened",
    "ConnectionEnded",
    "Content",
    "Login",
    "Method",
    "Opened",
]


@dataclass(slots=True)
class Login:
    """``start-ok`` arrived: check these credentials, then call
    :meth:`AMQPConnection.accept_login` or :meth:`AMQPConnection.refuse_login`."""

    mechanism: str
    username: str
    password: str
    client_properties: dict[str, Any]


@dataclass(slots=True)
class Opened:
    """``connection.open`` on vhost ``/``: the connection is open."""

    vhost: str


@dataclass(slots=True)
class ChannelOpened:
    channel: int


@dataclass(slots=True)
class ChannelClosedByPeer:
    """The client closed the channel: release it, then call
    :meth:`AMQPConnection.channel_close_ok` (close-ok follows what was queued)."""

    channel: int


@dataclass(slots=True)
class ChannelFailed:
    """The machine closed a channel on a protocol error (``channel.close`` is queued):
    release it in the broker."""

    channel: int
    code: int
    text: str


@dataclass(slots=True)
class Method:
    """A method on an open channel for the session (declares, consume, acks...)."""

    channel: int
    index: int
    method: Any


@dataclass(slots=True)
class Acks:
    """``basic.ack`` of one delivery each (``multiple`` off), received in a row on one
    channel: the session settles the run in one core call, as the HTTP channel's
    ``delivery_tags`` ack. The same as one :class:`Method` per tag, in order."""

    channel: int
    tags: list[int]


@dataclass(slots=True)
class Content:
    """A whole publish: the method, its properties and its body."""

    channel: int
    publish: Publish
    properties: dict[str, Any] | None
    body: bytes


@dataclass(slots=True)
class ConnectionEnded:
    """The connection is over: the client closed it (``by_peer``) or the machine or
    the caller closed it with ``code`` (0: a clean close). Close the socket once
    :meth:`data_to_send` is empty."""

    code: int
    text: str
    by_peer: bool
