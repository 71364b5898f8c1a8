"""A channel's transactions (the channel protocol's ``tx_select``, ``tx_commit``,
``tx_rollback``).

Rules: the broker makes a channel transactional on the session that received
``tx_select``, and it stays so (as in AMQP): from then on its publishes and settles are
allowed only inside a ``transaction()`` block (:meth:`Transactions.check_not_transactional`).
A transaction does not survive its session: when the session ends the broker
discards it, so its publishes fail with :class:`~client.errors.ConnectionLost`
(:meth:`Transactions.lose`) rather than being resent outside of it, and leaving the
block raises the same. The block itself is :meth:`Transactions.block`; the channel
waits for earlier confirms before entering it (the broker starts a transaction from a
clean slate).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from .codec import Event
from .errors import ClientError, ConnectionLost
from .publisher import PublishTracker
from .requester import Requester
from .session import SessionEnded, SessionLink
from .status import ChannelStatus

__all__ = ["Transactions"]

_DROPPED = "the connection dropped during the transaction"


class Transactions:
    """Whether a channel is transactional, and on which session; its open block."""

    def __init__(
        self, status: ChannelStatus, requests: Requester, tracker: PublishTracker, *, timeout_s: float
    ) -> None:
        self._status = status
        self._requests = requests
        self._tracker = tracker
        self._timeout_s = timeout_s
        #: The session generation on which the broker made the channel transactional.
        self.generation: int | None = None
        #: A ``transaction()`` block is open.
        self.open = False

    def check_not_nested(self) -> None:
        """Raises: ClientError when a block is open already."""
        if self.open:
            raise ClientError("transactions do not nest")

    @asynccontextmanager
    async def block(self) -> AsyncIterator[None]:
        """One transaction: select (once per session), then commit when the block
        ends, or roll back if it raises.

        Raises:
            ConnectionLost: the connection dropped during the transaction.
            ChannelClosedByBroker: the broker refused the commit.
        """
        self.check_not_nested()
        session = await self._status.wait_ready()
        if self.generation != session.generation:
            await self._request(session, {"op": "tx_select"})
            self.generation = session.generation
        self.open = True
        try:
            yield
        except BaseException:
            self.open = False
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout_s):
                if session.alive and self.generation == session.generation:
                    try:
                        await self._request(session, {"op": "tx_rollback"})
                    except ClientError:
                        pass  # (the session is gone: the broker discarded the transaction)
            raise
        self.open = False
        if not session.alive or self.generation != session.generation:
            raise ConnectionLost(f"{_DROPPED}: none of it was applied")
        await self._request(session, {"op": "tx_commit"})

    async def _request(self, session: SessionLink, op: dict[str, Any]) -> Event:
        """``op`` on ``session`` only: a transaction does not survive its session."""
        try:
            with anyio.fail_after(self._timeout_s):
                event: Event = await self._requests.send(session, op).wait()
                return event
        except (SessionEnded, TimeoutError):
            raise ConnectionLost(f"no reply to {op['op']!r}: {_DROPPED}") from None

    def lose(self) -> None:
        """The session ended: a transaction on it is gone (the broker discarded it), so
        its publishes must fail, not be resent outside of it."""
        if self.generation is not None:
            self.generation = None
            self._tracker.fail_all(lambda: ConnectionLost(f"{_DROPPED}: none of it was applied"))

    def check_not_transactional(self, what: str) -> None:
        """Raises: ClientError when the current session is transactional and no block
        is open (``what``: the operation refused)."""
        if self.open or self.generation is None:
            return
        session = self._status.session
        if session is not None and session.generation == self.generation:
            raise ClientError(f"this channel is transactional: {what} inside `async with ch.transaction()`")
