"""Publish deduplication window.

A publish carrying a ``message_id`` already seen on the same exchange within the
window is acknowledged again without being enqueued again. The window is by wall-clock
time (it must survive restarts, so it travels in the log), and entries expire in
arrival order, so a deque suffices.
"""

from __future__ import annotations

from collections import deque

__all__ = ["DedupWindow"]


class DedupWindow:
    __slots__ = ("window_s", "_seen", "_order")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        # (exchange, message_id) -> (wall_s, lsn the original publish waited on)
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}
        self._order: deque[tuple[float, tuple[str, str]]] = deque()

    def __len__(self) -> int:
        return len(self._seen)

    def lookup(self, exchange: str, message_id: str, wall_s: float) -> int | None:
        """The LSN the first publish of this id waited on, or None if not seen in the window."""
        self.prune(wall_s)
        hit = self._seen.get((exchange, message_id))
        if hit is None:
            return None
        return hit[1]

    def remember(self, exchange: str, message_id: str, wall_s: float, lsn: int) -> None:
        if self.window_s <= 0:
            return
        key = (exchange, message_id)
        self._seen[key] = (wall_s, lsn)
        self._order.append((wall_s, key))

    def forget(self, exchange: str, message_id: str) -> None:
        self._seen.pop((exchange, message_id), None)

    def prune(self, wall_s: float) -> None:
        horizon = wall_s - self.window_s
        order = self._order
        seen = self._seen
        while order and order[0][0] < horizon:
            t, key = order.popleft()
            hit = seen.get(key)
            if hit is not None and hit[0] == t:
                del seen[key]

    def entries(self) -> list[tuple[str, str, float]]:
        """Live entries as (exchange, message_id, wall_s), for checkpoints."""
        return [(key[0], key[1], t) for key, (t, _lsn) in self._seen.items()]
