"""The client's exception hierarchy: every error the library raises on purpose.

Everything derives from :class:`ClientError`, so ``except client.ClientError`` catches
all of it. Errors carry their data as attributes (codes, tags, reasons) rather than only
in the message text, so callers can branch on them. Network causes are chained
(``raise ConnectionLost(...) from OSError(...)``), never swallowed.

Anything else escaping from the library (``TypeError`` for a wrong argument type aside)
is a bug.
"""

from __future__ import annotations

from typing import Any, Protocol


class Returned(Protocol):
    """What :class:`PublishReturned` carries: a ``client.ReturnedMessage`` (the codec
    builds it; this module names only its shape, so that it imports nothing back)."""

    @property
    def exchange(self) -> str: ...

    @property
    def routing_key(self) -> str: ...

    @property
    def body(self) -> bytes: ...

    @property
    def properties(self) -> Any: ...

__all__ = [
    "ClientError",
    "ConnectionLost",
    "TLSRefused",
    "ClientClosed",
    "ProtocolError",
    "ConfirmTimeout",
    "PublishFailed",
    "PublishNacked",
    "PublishReturned",
    "PublishRefused",
    "SomePublishesFailed",
    "BrokerError",
    "ChannelClosedByBroker",
    "BrokerRequestError",
    "ConsumerCancelled",
    "MessageAlreadySettled",
]


class ClientError(Exception):
    """Base of every error raised by the ackbus client library."""


class ConnectionLost(ClientError, ConnectionError):
    """The broker could not be reached, or a connection dropped and was not recovered.

    Raised by REST calls when the request could not be completed, by
    :meth:`Connection.channel` when the first channel could not be opened within the
    reconnect policy, and by every operation of a channel whose reconnect policy gave up.
    The network error that caused it is chained as ``__cause__``.
    """


class TLSRefused(ConnectionLost):
    """The broker ended a TLS connection right after the handshake, before answering
    anything: a broker with mutual TLS does so when the client presents no certificate,
    or one it does not trust (TLS 1.3 checks the client's certificate after the client
    considers the handshake done). Opening a channel does not retry it: the same TLS
    settings cannot do better."""


class ClientClosed(ClientError):
    """The connection, channel or consumer was closed by this program.

    Also raised by a publish that was still unconfirmed when its channel was closed:
    the broker may or may not have taken such a message.
    """


class ProtocolError(ClientError):
    """The broker sent something this client cannot understand (malformed NDJSON,
    an unknown delivery tag in a confirm, a bad HTTP response)."""


class ConfirmTimeout(ClientError):
    """A publish was not confirmed within its ``timeout_s``.

    ``enqueued`` tells whether the message made it into the pending buffer. If it did,
    the outcome is unknown: the message stays pending, is still resent after a
    reconnect and may still be confirmed later; its :class:`PendingPublish` handle is
    settled then. If it did not (the buffer stayed full), nothing was sent.
    Raised by :meth:`Channel.wait_for_confirms` too, with ``message_id`` ``None``.
    """

    def __init__(self, message: str, *, message_id: str | None = None, enqueued: bool = True) -> None:
        super().__init__(message)
        self.message_id = message_id
        self.enqueued = enqueued


class PublishFailed(ClientError):
    """Base of the definite publish failures: the broker did not take the message."""

    def __init__(self, text: str, *, message_id: str) -> None:
        super().__init__(text)
        self.message_id = message_id


class PublishNacked(PublishFailed):
    """The broker answered the publish with a ``nack``: it did not take the message
    (queue overflow with reject-publish, disk full, internal error). Resend or give up.
    """

    def __init__(self, delivery_tag: int, reason: str, *, message_id: str) -> None:
        super().__init__(f"publish {message_id!r} nacked: {reason}", message_id=message_id)
        self.delivery_tag = delivery_tag
        self.reason = reason


class PublishReturned(PublishFailed):
    """A ``mandatory`` publish could not be routed to any queue and was returned."""

    def __init__(
        self, reply_code: int, reason: str, message: Returned, *, message_id: str
    ) -> None:
        super().__init__(
            f"publish {message_id!r} returned: {reply_code} {reason}", message_id=message_id
        )
        self.reply_code = reply_code
        self.reason = reason
        self.message = message


class PublishRefused(PublishFailed):
    """The broker closed the channel because of this publish (for example: the body is
    too large, the routing key is over 255 bytes; an unknown exchange is a nack, see
    :class:`PublishNacked`). The client reopened the channel
    and went on with the other publishes; this one is dropped."""

    def __init__(self, code: str, text: str, *, message_id: str) -> None:
        super().__init__(f"publish {message_id!r} refused: {code}: {text}", message_id=message_id)
        self.code = code
        self.text = text


class SomePublishesFailed(ClientError):
    """Raised by :meth:`Channel.wait_for_confirms` when publishes it waited for failed
    and nobody has seen their failure yet (by awaiting their handle)."""

    def __init__(self, failures: list[ClientError]) -> None:
        super().__init__(f"{len(failures)} publish(es) failed; first: {failures[0]}")
        self.failures = failures


class BrokerError(ClientError):
    """Base of errors the broker reported, with its machine ``code`` and text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ChannelClosedByBroker(BrokerError):
    """A channel operation failed: the broker answered with an ``error`` event and
    closed that channel session. The client reopens the channel automatically; only
    the call that caused the error sees this exception."""


class BrokerRequestError(BrokerError):
    """A REST call got a non-2xx answer. ``status`` is the HTTP status; ``code`` and
    ``message`` come from the JSON error body (or describe a non-JSON one)."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(code, message)
        self.status = status
        #: the answer's ``Retry-After`` (a 429 or a 503): when to try again
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        text = f"HTTP {self.status} {self.code}: {self.message}"
        if self.retry_after_s is not None:
            text += f" (retry after {self.retry_after_s:g} s)"
        return text


class ConsumerCancelled(ClientError):
    """The broker cancelled a consumer (for example its queue was deleted), or it
    could not be re-established after a reconnect."""

    def __init__(self, consumer_tag: str, reason: str) -> None:
        super().__init__(f"consumer {consumer_tag!r} cancelled by the broker: {reason}")
        self.consumer_tag = consumer_tag
        self.reason = reason


class MessageAlreadySettled(ClientError):
    """``ack``/``nack``/``reject`` on a message that was already settled (or that came
    from a ``no_ack`` consumer). Nothing was sent: acking twice would be a channel
    error on the broker."""
