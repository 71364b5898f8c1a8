"""Telling what broke, for error messages: the text of a network error, and a TLS
connection the broker refused after the handshake."""

from __future__ import annotations

import anyio.abc
from anyio.streams.tls import TLSAttribute

from .errors import TLSRefused

__all__ = ["network_error_text", "tls_refused"]


def network_error_text(exc: BaseException) -> str:
    """What broke, for a message: the error's text, or the first text in its causes
    (anyio's ``BrokenResourceError`` has none; the socket's error is its cause)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        text = str(seen)
        if text:
            return text
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def tls_refused(stream: anyio.abc.ByteStream, endpoint: str, exc: BaseException) -> TLSRefused | None:
    """The :class:`TLSRefused` that ``exc`` stands for when ``stream`` is a TLS
    connection that broke before the first byte of an answer (the caller knows it
    got none), else ``None``."""
    if stream.extra(TLSAttribute.ssl_object, None) is None:
        return None
    error = TLSRefused(
        f"the broker at {endpoint} refused the TLS connection right after the handshake, "
        f"before answering ({network_error_text(exc)}): a broker with mutual TLS does so "
        "when the client presents no certificate it trusts; give one with "
        "connect(ssl_context=...) after context.load_cert_chain(cert, key)"
    )
    error.__cause__ = exc
    return error
