"""Pending-confirm bookkeeping: publishes sent but not yet confirmed, by delivery tag.

Pure (no trio). Rules, from docs/protocol.md "Confirm guarantees":

- A channel numbers its publishes 1, 2, 3 …; :meth:`PendingConfirms.add` hands out
  the next tag, so tags are increasing by construction.
- Every tag is settled exactly once, by an ``ack`` or a ``nack`` for that tag or by a
  ``multiple`` one covering it ("every unsettled tag up to and including this one").
  Since tags only grow, the pending ones are a dict in tag order (insertion order)
  plus a deque of the tags in that order, from which a ``multiple`` settle pops its
  prefix: *k* entries cost O(k). A tag settled alone leaves its place in the deque
  until the front reaches it (the front is cleaned at once, so a run of single
  settles keeps the deque short).
- Settling a tag that is not pending (already settled, or a ``multiple`` range with
  gaps) is harmless; settling a tag that was never handed out is a protocol error.
- After a reconnect the new channel numbers from 1 again: :meth:`restart` returns
  every entry still pending in the original order and renumbers them 1..n, ready to be
  resent in exactly that order.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["PendingConfirms", "UnknownDeliveryTag"]

T = TypeVar("T")


class UnknownDeliveryTag(ValueError):
    """A confirm named a tag this channel never used."""


class PendingConfirms(Generic[T]):
    """Unconfirmed entries keyed by delivery tag, in tag order."""

    def __init__(self) -> None:
        self._entries: dict[int, T] = {}
        #: Tags in tag order; may still hold tags settled alone (behind the front).
        self._order: collections.deque[int] = collections.deque()
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
        self._clean_front()
        if not self._order:
            return None
        tag = self._order[0]
        return tag, self._entries[tag]

    def get(self, tag: int) -> T | None:
        """The entry pending under ``tag``, if any."""
        return self._entries.get(tag)

    def add(self, entry: T) -> int:
        """Record ``entry`` under the next tag and return that tag."""
        tag = self._next_tag
        self._next_tag = tag + 1
        self._entries[tag] = entry
        self._order.append(tag)
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
        entries = self._entries
        if not multiple:
            if tag not in entries:
                return []
            entry = entries.pop(tag)
            self._clean_front()
            return [(tag, entry)]
        settled: list[tuple[int, T]] = []
        order = self._order
        while order and order[0] <= tag:
            t = order.popleft()
            if t in entries:
                settled.append((t, entries.pop(t)))
        self._clean_front()
        return settled

    def remove(self, tag: int) -> T | None:
        """Drop one entry without a confirm (the caller settles it otherwise)."""
        entry = self._entries.pop(tag, None)
        self._clean_front()
        return entry

    def restart(self) -> list[T]:
        """Renumber for a new channel: return every pending entry in order, re-added
        under tags 1..n (so the caller resends them in this order)."""
        entries = list(self._entries.values())
        self._entries.clear()
        self._order.clear()
        self._next_tag = 1
        for entry in entries:
            self.add(entry)
        return entries

    def _clean_front(self) -> None:
        """Drop the tags settled alone from the front of the order."""
        order, entries = self._order, self._entries
        while order and order[0] not in entries:
            order.popleft()
