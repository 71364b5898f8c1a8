"""The runtime's one book of publishes waiting for their confirm.

The core decides *when* a publish is confirmed (its ``ConfirmTracker`` releases
confirms in tag order once the log record is durable); this book keeps what only the
IO side knows about each publish still waiting: the bytes it charges against its
channel's bound on unconfirmed publishes (a publisher that outruns the disk is slowed
down), the moment it arrived (the confirm-latency metric), and for a REST publish the
waiter its HTTP request parks on. Every ``Confirm`` and ``Return`` effect passes
through :meth:`PendingConfirms.confirmed` / :meth:`PendingConfirms.returned` before
it reaches its channel, so channels and REST share one rule: a confirm settles every
tag up to its own (confirms never skip), and its latency is observed once.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import trio

from broker.core import Confirm, Return
from broker.runtime.ports import MetricsPort

__all__ = ["PendingConfirms", "PublishWaiter"]


@dataclass
class PublishWaiter:
    """A REST publish parked until its confirm: ``event`` fires with ``ack`` (and the
    nack's ``reason``) set; ``returned``: a mandatory publish that routed nowhere."""

    event: trio.Event = field(default_factory=trio.Event)
    ack: bool = False
    reason: str | None = None
    returned: bool = False


class _ChannelBook:
    __slots__ = ("entries", "bytes", "waiters")

    def __init__(self) -> None:
        #: (publish tag, charged bytes, perf_counter at publish), in tag order.
        self.entries: collections.deque[tuple[int, int, float]] = collections.deque()
        self.bytes = 0
        #: The parked REST requests among them, by tag.
        self.waiters: dict[int, PublishWaiter] = {}


class PendingConfirms:
    """Publishes handed to the core and not yet confirmed, per channel (see the
    module docstring)."""

    def __init__(self, metrics: MetricsPort | None = None) -> None:
        self.metrics = metrics
        self._books: dict[int, _ChannelBook] = {}

    def track(self, channel_id: int, tag: int, charge: int, waiter: PublishWaiter | None = None) -> None:
        """Publish ``tag`` of ``channel_id`` waits for its confirm; it charges
        ``charge`` bytes to its channel until then."""
        book = self._books.get(channel_id)
        if book is None:
            book = self._books[channel_id] = _ChannelBook()
        book.entries.append((tag, charge, time.perf_counter()))
        book.bytes += charge
        if waiter is not None:
            book.waiters[tag] = waiter

    def unconfirmed_bytes(self, channel_id: int) -> int:
        """Bytes charged by the channel's publishes still waiting for their confirm."""
        book = self._books.get(channel_id)
        return book.bytes if book is not None else 0

    def confirmed(self, effect: Confirm) -> None:
        """The core confirmed (acked or nacked) ``effect.delivery_tag``: it and every
        earlier tag of its channel are settled."""
        book = self._books.get(effect.channel_id)
        if book is None:
            return
        entries = book.entries
        tag = effect.delivery_tag
        metrics = self.metrics
        waiters = book.waiters
        now = time.perf_counter()
        while entries and entries[0][0] <= tag:
            settled, charge, published_at = entries.popleft()
            book.bytes -= charge
            if metrics is not None:
                metrics.observe_confirm(now - published_at)
            if waiters:
                waiter = waiters.pop(settled, None)
                if waiter is not None:
                    waiter.ack = effect.ack
                    waiter.reason = effect.reason
                    waiter.event.set()

    def returned(self, effect: Return) -> None:
        """A mandatory publish routed nowhere (its confirm follows)."""
        book = self._books.get(effect.channel_id)
        waiter = book.waiters.get(effect.delivery_tag) if book is not None else None
        if waiter is not None:
            waiter.returned = True

    def forget(self, channel_id: int) -> None:
        """The channel has ended: nobody waits for its confirms any more."""
        self._books.pop(channel_id, None)
