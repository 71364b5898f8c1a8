"""Where the broker is and how to reach it: :class:`Endpoint` (its URL, credentials
and trust), and :func:`open_tcp`, the byte stream every request and channel runs over
(a :data:`StreamOpener`; tests substitute in-memory streams).

The credentials and the SSL context never appear in an endpoint's ``str`` or ``repr``,
so logging an endpoint never logs a secret.
"""

from __future__ import annotations

import base64
import socket
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

__all__ = ["Endpoint", "StreamOpener", "open_tcp"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the broker is: parsed from ``http://host:port/prefix``; and how to prove
    who we are (an ``Authorization`` header value) and whom to trust (an SSL context:
    None means the system's CAs, always verified). Neither appears in ``str`` or
    ``repr``, so logging an endpoint never logs a secret."""

    scheme: str
    host: str
    port: int
    prefix: str = ""
    authorization: str | None = field(default=None, repr=False, compare=False)
    ssl_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    def with_credentials(
        self, *, username: str | None = None, password: str | None = None, token: str | None = None
    ) -> Endpoint:
        """This endpoint authenticating with HTTP Basic (``username``/``password``) or
        a Bearer ``token``.

        Raises:
            ValueError: both, or a user name with ``:`` (RFC 7617 forbids it).
        """
        if token is not None and username is not None:
            raise ValueError("give a username and password, or a token, not both")
        if token is not None:
            return _replace(self, authorization=f"Bearer {token}")
        if username is not None:
            if ":" in username:
                raise ValueError("a user name must not contain ':'")
            pair = f"{username}:{password or ''}".encode()
            return _replace(self, authorization="Basic " + base64.b64encode(pair).decode("ascii"))
        return self

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """Parse a broker URL (``http`` or ``https``; default ports 80 / 443).

        Raises:
            ValueError: not an http(s) URL with a host.
        """
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"broker URL must be http:// or https://, got {url!r}")
        if not parts.hostname:
            raise ValueError(f"broker URL has no host: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        endpoint = cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))
        if parts.username is not None:  # http://user:password@host (percent-encoded)
            endpoint = endpoint.with_credentials(
                username=urllib.parse.unquote(parts.username), password=urllib.parse.unquote(parts.password or "")
            )
        return endpoint

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def target(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        """The request target for ``path`` (already percent-encoded) and ``query``."""
        target = self.prefix + path
        if query:
            pairs = {k: _query_value(v) for k, v in query.items() if v is not None}
            if pairs:
                target += "?" + urllib.parse.urlencode(pairs)
        return target

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.prefix}"


def _replace(endpoint: Endpoint, **changes: Any) -> Endpoint:
    fields = {name: getattr(endpoint, name) for name in Endpoint.__dataclass_fields__}
    fields.update(changes)
    return Endpoint(**fields)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


StreamOpener = Callable[[Endpoint], Awaitable[anyio.abc.ByteStream]]
"""How to get a byte stream to the broker; tests substitute in-memory streams."""


async def open_tcp(endpoint: Endpoint) -> anyio.abc.ByteStream:
    """Open a TCP (or TLS) stream to ``endpoint`` with TCP keepalive enabled.

    Keepalive is the only way a half-open connection (broker host gone without a FIN)
    is ever noticed on an idle consumer channel; the probes below notice it within
    about half a minute.

    Raises:
        OSError: the connection could not be made.
    """
    stream: anyio.abc.ByteStream
    try:
        # https is always verified: the system's CAs, or the endpoint's own context (a
        # CA bundle given to connect()); there is no switch that turns checking off.
        if endpoint.scheme == "https":
            stream = await anyio.connect_tcp(
                endpoint.host, endpoint.port, ssl_context=endpoint.ssl_context or ssl.create_default_context(), tls=True,
                tls_hostname=endpoint.host,
            )
        else:
            stream = await anyio.connect_tcp(endpoint.host, endpoint.port)
    except OSError as exc:
        # anyio tries every address and raises "All connection attempts failed"
        # from the real cause (or a group of them): surface it ("Connection refused").
        cause = exc.__cause__
        if isinstance(cause, BaseExceptionGroup):
            cause = cause.exceptions[0]
        if isinstance(cause, OSError):
            raise cause from None
        raise
    _enable_keepalive(stream)
    return stream


def _enable_keepalive(stream: anyio.abc.ByteStream) -> None:
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if sock is None:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
