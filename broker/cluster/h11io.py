"""The one read loop of the cluster's HTTP/1.1 clients (etcd, peers, followers).

h11 answers ``NEED_DATA`` until enough bytes came; :func:`next_event` reads from the
stream until h11 has an event. An end of stream is either handed to h11 (which then
answers ``ConnectionClosed`` or raises ``RemoteProtocolError``), or, with ``closed``,
raised as the caller's own error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import h11
import trio

__all__ = ["READ_BYTES", "next_event"]

#: Bytes asked of the stream per read.
READ_BYTES: Final = 65536


async def next_event(
    conn: h11.Connection, stream: trio.abc.ReceiveStream, *, closed: Callable[[], Exception] | None = None
) -> Any:
    """The next h11 event of ``conn``, reading ``stream`` as needed. ``closed``: the
    exception to raise when the stream ends (None: let h11 see the end)."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await stream.receive_some(READ_BYTES)
        if not data and closed is not None:
            raise closed()
        conn.receive_data(bytes(data))
