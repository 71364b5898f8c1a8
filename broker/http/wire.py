"""What the reading and the writing half of one connection share: the wire.

One job: hold one client's stream and its h11 state machine, with the two facts both
halves may learn and both must respect: the connection is ``broken`` (a read or a write
failed: nothing more goes over it), and it ``must_close`` after the current response (a
limit or an error doomed it). Everything else belongs to one half (``reading.py``,
``writing.py``) or to the connection's lifecycle (``connection.py``).
"""

from __future__ import annotations

from typing import Final

import h11
import trio

from broker.http.limits import Limits

__all__ = ["GONE", "Wire"]

#: What a stream raises once the client is gone (or the stream was closed under us).
GONE: Final = (trio.BrokenResourceError, trio.ClosedResourceError)


class Wire:
    """One client's stream and h11 state machine, and what both halves set."""

    __slots__ = ("broken", "h11", "limits", "must_close", "stream")

    def __init__(self, stream: trio.abc.Stream, limits: Limits) -> None:
        self.stream = stream
        self.limits = limits
        # h11 bounds the *incomplete* head it buffers; a complete head is re-checked
        # by the connection (RFC 9110 section 5.4 leaves the limit to the server).
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        #: Close after the current response (set by limits and errors mid-exchange).
        self.must_close = False
        #: A read or a write failed: the stream is unusable.
        self.broken = False

    @property
    def remote(self) -> str | None:
        """``"host:port"`` of the client, when the stream is a socket."""
        stream = self.stream
        if isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        sock = getattr(stream, "socket", None)
        if sock is None:
            return None
        try:
            peer = sock.getpeername()
        except OSError:
            return None
        if isinstance(peer, tuple):
            return f"{peer[0]}:{peer[1]}"
        return str(peer)
