"""Pending-confirm bookkeeping: publishes sent but not yet confirmed, by delivery tag.

Pure (no trio). Rules, from docs/protocol.md "Confirm guarantees":

- A channel numbers its publishes 1, 2, 3 …; :meth:`PendingConfirms.add` hands out
  the next tag, so tags are increasing by construction.
- Every tag is settled exactly once, by an ``ack`` or a ``nack`` for that tag or by a
  ``multiple`` one covering it ("every unsettled tag up to and including this one").
  Entries live in a :class:`sortedcontainers.SortedDict`, so a ``multiple`` settle of
  *k* entries costs O(log n + k), not a scan of the whole buffer.
- Settling a tag that is not pending (already settled, or a ``multiple`` range with
  gaps) is harmless; settling a tag that was never handed out is a protocol error.
- After a reconnect the new channel numbers from 1 again: :meth:`restart` returns
  every entry still pending in the original order and renumbers them 1..n, ready to be
  resent in exactly that order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from sortedcontainers import SortedDict  # type: ignore[import-untyped]

__all__ = ["PendingConfirms", "UnknownDeliveryTag"]

T = TypeVar("T")


class UnknownDeliveryTag(ValueError):
    """A confirm named a tag this channel never used."""


class PendingConfirms(Generic[T]):
    """Unconfirmed entries keyed by delivery tag, in tag order."""

    def __init__(self) -> None:
        self._entries: SortedDict = SortedDict()
        self._next_tag = 1

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[tuple[int, T]]:
        """``(tag, entry)`` pairs in tag order."""
        return iter(self._entries.items())

    @property
    def next_tag(self) -> int:
        """The tag the next :meth:`add` will use."""
        return self._next_tag

    def first(self) -> tuple[int, T] | None:
        """The pending entry with the lowest tag, if any."""
        if not self._entries:
            return None
        tag = self._entries.keys()[0]
        return tag, self._entries[tag]

    def get(self, tag: int) -> T | None:
        """The entry pending under ``tag``, if any."""
        entry: T | None = self._entries.get(tag)
        return entry

    def add(self, entry: T) -> int:
        """Record ``entry`` under the next tag and return that tag."""
        tag = self._next_tag
        self._next_tag += 1
        self._entries[tag] = entry
        return tag

    def settle(self, tag: int, *, multiple: bool) -> list[tuple[int, T]]:
        """Remove and return the entries a confirm of ``tag`` settles, in tag order.

        With ``multiple`` that is every pending tag ≤ ``tag``; without, just ``tag``
        (an empty list when it is not pending, e.g. already settled).

        Raises:
            UnknownDeliveryTag: ``tag`` was never handed out (< 1 or ≥ next_tag).
        """
        if tag < 1 or tag >= self._next_tag:
            raise UnknownDeliveryTag(f"confirm for delivery tag {tag}, last used {self._next_tag - 1}")
        if not multiple:
            entry = self._entries.pop(tag, None)
            return [] if entry is None else [(tag, entry)]
        # Every pending tag <= tag is a prefix of the sorted keys: find its length by
        # bisection, then copy and delete it as slices (sortedcontainers deletes a
        # slice of its sorted list in one pass), O(log n + k) overall.
        entries = self._entries
        k = entries.bisect_right(tag)
        if k == 0:
            return []
        settled: list[tuple[int, T]] = entries.items()[:k]
        del entries.keys()[:k]
        return settled

    def remove(self, tag: int) -> T | None:
        """Drop one entry without a confirm (the caller settles it otherwise)."""
        entry: T | None = self._entries.pop(tag, None)
        return entry

    def restart(self) -> list[T]:
        """Renumber for a new channel: return every pending entry in order, re-added
        under tags 1..n (so the caller resends them in this order)."""
        entries = list(self._entries.values())
        self._entries.clear()
        self._next_tag = 1
        for entry in entries:
            self.add(entry)
        return entries
