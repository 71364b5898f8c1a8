"""Browsing: looking at a queue's messages without consuming them.

Operators need to see what is stuck: ``browse`` lists a queue's messages in sequence
order (ready, paged out, delayed and out with consumers alike, every priority of a
priority queue merged), each with its state,
delivery count and properties, reading paged-out bodies back from the log. Nothing
changes: no delivery is counted, no message moves.

:class:`Browser` reads the queue store, the deliveries' unacked messages and, through
the pager, the log.
"""

from __future__ import annotations

import heapq
from itertools import islice
from typing import Any

from .delivery import Deliveries
from .errors import InvalidArgument
from .log import MessageLog
from .message import Entry
from .pager import Pager, logged_message
from .queues import QueueStore

__all__ = ["Browser", "MAX_BROWSE", "BrowsedMessage"]

#: Most messages one browse returns.
MAX_BROWSE = 1000

#: ``(seq, state, entry or None, reason the body could not be read or None, due)``
BrowsedMessage = tuple[int, str, "Entry | None", "str | None", "float | None"]


class Browser:
    """Browsing (see the module docstring)."""

    def __init__(self, queues: QueueStore, deliveries: Deliveries, pager: Pager, log: MessageLog) -> None:
        self._store = queues
        self._deliveries = deliveries
        self._pager = pager
        self._log = log

    def browse(self, queue_name: str, limit: int = 100, after: int = 0) -> list[BrowsedMessage]:
        """Up to ``limit`` messages of ``queue_name`` with a sequence number above
        ``after``, oldest first: ``(seq, state, entry, unreadable, due)`` where state
        is ``ready``, ``unacked`` or ``delayed``; ``entry`` is None (and
        ``unreadable`` says why) when a paged-out body cannot be read now; ``due``
        is a delayed message's wall-clock due time. Raises NotFound, ResourceLocked,
        InvalidArgument."""
        queue = self._store.queue(queue_name)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_BROWSE:
            raise InvalidArgument(f"limit must be an integer 1..{MAX_BROWSE}")
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise InvalidArgument("after must be a message sequence number (0 or more)")
        in_memory: list[tuple[int, str, Any]] = []
        for lane in queue.lanes:
            in_memory.extend((e.message.seq, "ready", e) for e in lane.held() if e.message.seq > after)
        in_memory.extend((s, "delayed", (e, d)) for d, s, e in queue.delayed.entries if s > after)
        # (there may be a million paged-out delayed ones: keep only the first few)
        in_memory.extend(
            heapq.nsmallest(
                limit,
                (
                    (s, "delayed_paged", (loc, due_ms / 1000.0))
                    for due_ms, s, loc in queue.delayed.paged_items()
                    if s > after
                ),
                key=lambda item: item[0],
            )
        )
        for ch in self._deliveries.channels.values():
            for d in ch.deliveries.values():
                if d.queue is queue and d.entry.message.seq > after:
                    in_memory.append((d.entry.message.seq, "unacked", d.entry))
        in_memory.sort(key=lambda item: item[0])
        paged = [((seq, "paged", loc) for seq, loc in lane.paged if seq > after) for lane in queue.lanes if lane.paged]
        chosen = list(islice(heapq.merge(in_memory[:limit], *paged, key=lambda item: item[0]), limit))
        # paged-out bodies (ready or delayed) are read back to be shown
        to_read = [
            (i, seq, item if state == "paged" else item[0])
            for i, (seq, state, item) in enumerate(chosen)
            if state in ("paged", "delayed_paged")
        ]
        read: dict[int, Entry | str] = {}
        if to_read:
            read_log = self._log.read_log
            assert read_log is not None
            results = read_log([loc >> 1 for _i, _seq, loc in to_read])
            for (i, seq, loc), result in zip(to_read, results):
                r = logged_message(result, seq, loc >> 1)
                read[i] = r if isinstance(r, str) else self._pager.entry_of(queue, loc, r)
        out: list[BrowsedMessage] = []
        for i, (seq, state, item) in enumerate(chosen):
            due = None
            entry: Entry | None
            if state in ("paged", "delayed_paged"):
                got = read[i]
                entry, unreadable = (None, got) if isinstance(got, str) else (got, None)
                if state == "delayed_paged":
                    due = item[1]
            else:
                entry, unreadable = (item[0], None) if state == "delayed" else (item, None)
                if state == "delayed":
                    due = item[1]
            shown = "ready" if state == "paged" else "delayed" if due is not None else state
            out.append((seq, shown, entry, unreadable, due))
        return out
