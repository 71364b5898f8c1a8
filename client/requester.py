"""A channel's requests: the ops the broker answers (``ok``, ``consume_ok``,
``cancel_ok`` or ``error``), matched to their answer by an integer id.

Requests use integer ids and publishes their (string) message id, so an ``error``
event's ``id`` says unambiguously which of the two it is about. A declaration sent
with :meth:`Requester.request` outlives a session: if the session ends before the
answer, it is sent again on the next one (declarations are idempotent).
"""

from __future__ import annotations

from typing import Any

import anyio

from .codec import Event
from .errors import ConnectionLost
from .messages import Reply
from .session import SessionEnded, SessionLink
from .status import ChannelStatus

__all__ = ["Requester"]


class Requester:
    """Numbers a channel's requests and waits for their replies."""

    def __init__(self, status: ChannelStatus, *, timeout_s: float) -> None:
        self._status = status
        self._timeout_s = timeout_s
        self._last_id = 0

    def send(self, session: SessionLink, op: dict[str, Any]) -> Reply:
        """Queue ``op`` on ``session`` with a fresh id; return its awaitable reply."""
        self._last_id += 1
        return session.request(op, self._last_id)

    async def request(self, op: dict[str, Any]) -> Event:
        """Send ``op`` on a ready session and return its reply event; if the session
        ends first, send it again on the next one.

        Raises:
            ChannelClosedByBroker: the broker answered ``error``.
            ConnectionLost: no reply within the request timeout.
            ClientClosed: the channel was closed first.
        """
        try:
            with anyio.fail_after(self._timeout_s):
                while True:
                    session = await self._status.wait_ready()
                    reply = self.send(session, op)
                    try:
                        event: Event = await reply.wait()
                        return event
                    except SessionEnded:
                        continue
        except TimeoutError:
            raise ConnectionLost(f"no reply to {op.get('op')!r} within {self._timeout_s} s") from None
