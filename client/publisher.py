"""Publish handles and the bounded buffer of unconfirmed publishes of one channel.

Rules:

- A publish is *pending* from the moment it is accepted until it is settled; while
  pending it sits in :class:`~client.pending.PendingConfirms` in publish order, with
  its encoded op line kept for resending.
- The buffer is bounded by count and by bytes. A publish that does not fit waits
  (:meth:`PublishTracker.wait_for_room`) instead of growing memory; when nothing is
  pending, any single publish fits, so a large message cannot deadlock.
- Settling is synchronous and exactly-once: every handle ends either confirmed, or
  failed with one :class:`~client.errors.ClientError`.
- A ``return`` marks its publish; the ``ack`` that follows it then fails the handle with
  :class:`~client.errors.PublishReturned`. The mark survives a resend.
- Failures nobody has seen (nobody awaited the handle) are collected for
  :meth:`~client.channel.Channel.wait_for_confirms` to report.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import anyio
import anyio.lowlevel

from .codec import ReturnedMessage
from .errors import ClientError, PublishNacked, PublishRefused, PublishReturned
from .pending import PendingConfirms

__all__ = ["PendingPublish", "PublishTracker"]


class PendingPublish:
    """The confirm of one publish, awaitable: ``await handle`` returns the message id
    once the broker acked it.

    Raises (when awaited):
        PublishNacked, PublishReturned, PublishRefused: the broker did not take it.
        ConnectionLost: the channel gave up reconnecting first.
        ClientClosed: the channel was closed first.
    """

    __slots__ = (
        "message_id", "seq", "line", "size", "_settled", "_event", "_error", "_observed", "_returned",
    )

    def __init__(self, message_id: str, seq: int, line: bytes) -> None:
        self.message_id = message_id
        #: Position in the channel's publish order (stable across resends).
        self.seq = seq
        #: The encoded ``publish`` op, resent as is after a reconnect.
        self.line = line
        self.size = len(line)
        self._settled = False
        # Made only when somebody waits: most handles of a publishing loop are settled
        # before anyone looks, and an event costs as much as the rest of a publish.
        self._event: anyio.Event | None = None
        self._error: ClientError | None = None
        self._observed = False
        self._returned: tuple[int, str, ReturnedMessage] | None = None

    def done(self) -> bool:
        """Settled (confirmed or failed)."""
        return self._settled

    def exception(self) -> ClientError | None:
        """The failure, once settled (``None`` when confirmed or still pending)."""
        return self._error

    async def wait(self) -> str:
        """Wait for the confirm; return the message id.

        Raises:
            PublishFailed, ConnectionLost, ClientClosed: see the class docstring.
        """
        if not self._settled:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        else:
            await anyio.lowlevel.checkpoint()
        self._observed = True
        if self._error is not None:
            raise self._error
        return self.message_id

    def __await__(self) -> Generator[Any, None, str]:
        return self.wait().__await__()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._error else "confirmed")
        return f"<PendingPublish {self.message_id!r} {state}>"


class PublishTracker:
    """The pending publishes of one channel, their window, and their settling."""

    def __init__(self, *, max_pending: int, max_pending_bytes: int) -> None:
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.pending: PendingConfirms[PendingPublish] = PendingConfirms()
        self.pending_bytes = 0
        self.confirmed = 0
        self.failed = 0
        self._unobserved: list[PendingPublish] = []
        self._prune_at = 1024
        self._changed = anyio.Event()
        self._closed_error: Callable[[], ClientError] | None = None

    def __len__(self) -> int:
        return len(self.pending)

    # --- admission --------------------------------------------------------------------

    def has_room(self, size: int) -> bool:
        if not self.pending:
            return True
        return len(self.pending) < self.max_pending and self.pending_bytes + size <= self.max_pending_bytes

    async def wait_for_room(self, size: int) -> None:
        """Wait until a publish of ``size`` bytes fits.

        Raises:
            ClientError: the tracker was closed (see :meth:`close`) meanwhile.
        """
        while True:
            self._raise_if_closed()
            if self.has_room(size):
                return
            await self.wait_changed()

    def add(self, handle: PendingPublish) -> int:
        """Accept ``handle``; return its delivery tag on the current session."""
        self.pending_bytes += handle.size
        return self.pending.add(handle)

    # --- settling ---------------------------------------------------------------------

    def on_ack(self, tag: int, multiple: bool) -> None:
        """Raises: UnknownDeliveryTag (a protocol violation)."""
        for _, handle in self.pending.settle(tag, multiple=multiple):
            returned = handle._returned
            if returned is None:
                self._settle(handle, None)
            else:
                code, reason, message = returned
                self._settle(handle, PublishReturned(code, reason, message, message_id=handle.message_id))
        self._pulse()

    def on_nack(self, tag: int, multiple: bool, reason: str) -> None:
        """Raises: UnknownDeliveryTag (a protocol violation)."""
        for t, handle in self.pending.settle(tag, multiple=multiple):
            self._settle(handle, PublishNacked(t, reason, message_id=handle.message_id))
        self._pulse()

    def on_return(self, tag: int, reply_code: int, reason: str, message: ReturnedMessage) -> None:
        handle = self.pending.get(tag)
        if handle is not None:
            handle._returned = (reply_code, reason, message)

    def refuse(self, message_id: str, code: str, text: str) -> bool:
        """Fail the first pending publish with ``message_id``: the broker closed the
        channel over it, so resending it would only fail again. Returns whether one was
        found. O(n), but only on a channel error."""
        for tag, handle in self.pending:
            if handle.message_id == message_id:
                self.pending.remove(tag)
                self._settle(handle, PublishRefused(code, text, message_id=message_id))
                self._pulse()
                return True
        return False

    def restart(self) -> list[PendingPublish]:
        """Renumber for a new session; return the publishes to resend, in order."""
        return self.pending.restart()

    def fail_all(self, make_error: Callable[[], ClientError]) -> None:
        """Fail every pending publish (one fresh exception each)."""
        for _, handle in list(self.pending):
            self._settle(handle, make_error())
        self.pending = PendingConfirms()
        self._pulse()

    def close(self, make_error: Callable[[], ClientError]) -> None:
        """From now on, waiting for room raises ``make_error()``."""
        self._closed_error = make_error
        self._pulse()

    def _settle(self, handle: PendingPublish, error: ClientError | None) -> None:
        self.pending_bytes -= handle.size
        handle._error = error
        if error is None:
            self.confirmed += 1
        else:
            self.failed += 1
            self._unobserved.append(handle)
            if len(self._unobserved) >= self._prune_at:
                # Drop failures their callers have seen; amortised O(1) per failure.
                self._unobserved = [h for h in self._unobserved if not h._observed]
                self._prune_at = max(1024, 2 * len(self._unobserved))
        handle._settled = True
        if handle._event is not None:
            handle._event.set()

    # --- waiting ----------------------------------------------------------------------

    def _raise_if_closed(self) -> None:
        if self._closed_error is not None:
            raise self._closed_error()

    def _pulse(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_changed(self) -> None:
        """Wait for the next settle (or close)."""
        await self._changed.wait()

    async def wait_settled(self, up_to_seq: int) -> None:
        """Wait until every publish with ``seq <= up_to_seq`` is settled. Publishes are
        pending in seq order, so that is: the first pending one is later."""
        while True:
            first = self.pending.first()
            if first is None or first[1].seq > up_to_seq:
                return
            await self.wait_changed()

    def take_unobserved_failures(self, up_to_seq: int | None = None) -> list[ClientError]:
        """The failures nobody has awaited yet (of publishes up to ``up_to_seq``);
        they count as seen afterwards."""
        keep: list[PendingPublish] = []
        errors: list[ClientError] = []
        for handle in self._unobserved:
            if handle._observed:
                continue
            if up_to_seq is not None and handle.seq > up_to_seq:
                keep.append(handle)
                continue
            handle._observed = True
            assert handle._error is not None
            errors.append(handle._error)
        self._unobserved = keep
        return errors
