"""The HTTP server's resource limits, in one immutable value.

Every limit bounds something a client controls -- bytes, time, or connections -- so
that one misbehaving or malicious client cannot exhaust memory, file descriptors or
handler tasks and starve the others. Precedents for the defaults: h11's own 16 KiB
``max_incomplete_event_size`` (raised to 64 KiB so long ``X-Header-*`` property sets
fit), nginx's ``client_header_timeout`` (60 s; 10 s here because our clients are
programs, not people on slow links), nginx's ``keepalive_timeout`` (75 s) and
``client_max_body_size``, and Apache's lingering close.
"""

from __future__ import annotations

import dataclasses

__all__ = ["Limits"]


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """Bounds the server enforces on every connection.

    Sizes are in bytes, times in seconds. ``None`` is accepted only where noted.
    """

    #: Largest request head (request line + header block). Enforced incrementally by
    #: h11's ``max_incomplete_event_size`` and exactly once the head is parsed;
    #: over it the client gets ``431`` and the connection is closed.
    max_header_bytes: int = 64 * 1024
    #: Most header fields in one request head (``431`` over it).
    max_headers: int = 100
    #: Default maximum request body for ``Request.read_body`` / ``iter_body``
    #: (``413 payload_too_large``). Handlers may pass their own bound, or none.
    max_body_bytes: int = 16 * 1024 * 1024
    #: A connection must deliver a complete request head within this time after it
    #: is accepted, or after the first byte of a later keep-alive request arrives.
    #: Defeats slowloris-style clients that drip header bytes.
    header_timeout_s: float = 10.0
    #: An idle keep-alive connection (between requests, no bytes pending) is closed
    #: after this long.
    idle_timeout_s: float = 60.0
    #: While a request body is being read, each read must make progress within this
    #: time or the client gets ``408`` and the connection is closed. Handlers reading
    #: a long-lived stream (a channel) pass ``timeout_s=None`` instead.
    body_timeout_s: float = 30.0
    #: A single socket write that makes no progress for this long (the client stopped
    #: reading) aborts the connection with ``ClientDisconnected``. ``None`` disables.
    send_timeout_s: float | None = 60.0
    #: Concurrent connections; a connection over the limit is answered ``503`` and
    #: closed at once.
    max_connections: int = 10_000
    #: Concurrent connections from one client address (IP); over it, as over
    #: ``max_connections``. Keeps one flooding host from taking every connection
    #: (nginx's ``limit_conn`` per ``$binary_remote_addr`` is the precedent).
    max_connections_per_address: int = 1000
    #: File descriptors kept free for the rest of the process (the broker's log opens
    #: segment files to read paged-out messages back): a connection whose socket
    #: leaves fewer than this many under the soft ``RLIMIT_NOFILE`` is answered ``503``
    #: and closed, as over ``max_connections``. Clients can retry; the log cannot.
    reserved_fds: int = 64
    #: Bytes read per ``receive_some`` call.
    read_chunk_bytes: int = 64 * 1024
    #: After a response that leaves part of the request body unread, up to this many
    #: body bytes are read and discarded to keep the connection alive; beyond it the
    #: connection is closed instead.
    max_drain_bytes: int = 64 * 1024
    #: Lingering close (RFC 9112 section 9.6): before closing a connection whose
    #: client may still be sending, shut down our send side and discard input for up
    #: to this long (and at most ``max_linger_bytes``), so that the client reads our
    #: error response instead of a TCP reset.
    linger_s: float = 2.0
    max_linger_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        for name in (
            "max_header_bytes",
            "max_headers",
            "max_body_bytes",
            "max_connections",
            "max_connections_per_address",
            "read_chunk_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be positive")
        for name in ("max_drain_bytes", "max_linger_bytes", "linger_s", "reserved_fds"):
            if getattr(self, name) < 0:
                raise ValueError(f"Limits.{name} must not be negative")
        for name in ("header_timeout_s", "idle_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name} must be positive")
        if self.send_timeout_s is not None and not self.send_timeout_s > 0:
            raise ValueError("Limits.send_timeout_s must be positive or None")
