"""Publish deduplication window.

A publish carrying a ``message_id`` already seen on the same exchange within the
window is acknowledged again without being enqueued again. The window is by wall-clock
time (it must survive restarts, so it travels in the log).

Rules and layout (one entry per publish in the window: a million at 8k msgs/s over the
default two minutes, so memory per entry matters):

* Per exchange, one dict ``message_id -> packed int`` (``lsn << 44 | wall in ms``): no
  tuple, float or key tuple per entry (about 100 bytes an entry instead of 370).
* Dicts keep insertion order, and entries are inserted in time order (a message id is
  remembered only after a lookup missed; a refreshed id is removed and re-inserted at
  the end), so expired entries are a prefix of each dict.
* Expired entries are dropped in batches, at most every ``window_s / 64``, because
  popping a dict's front one entry at a time rescans the holes left by earlier
  deletions. :meth:`lookup` still applies the exact window (an expired hit is dropped
  and reported as unseen), so batching only delays when memory is freed.
"""

from __future__ import annotations

__all__ = ["DedupWindow"]

_MS_BITS = 44
_MS_MASK = (1 << _MS_BITS) - 1


def _ms(wall_s: float) -> int:
    return int(round(wall_s * 1000.0))


class DedupWindow:
    __slots__ = ("window_s", "_by_exchange", "_count", "_next_prune_ms")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        # exchange -> {message_id: lsn << 44 | wall_ms}, in insertion (= time) order
        self._by_exchange: dict[str, dict[str, int]] = {}
        self._count = 0
        self._next_prune_ms = 0

    def __len__(self) -> int:
        return self._count

    def lookup(self, exchange: str, message_id: str, wall_s: float) -> int | None:
        """The LSN the first publish of this id waited on, or None if not seen in the window."""
        now_ms = _ms(wall_s)
        if now_ms >= self._next_prune_ms:
            self._prune_ms(now_ms)
        seen = self._by_exchange.get(exchange)
        if seen is None:
            return None
        packed = seen.get(message_id)
        if packed is None:
            return None
        if (packed & _MS_MASK) < now_ms - _ms(self.window_s):
            del seen[message_id]
            self._count -= 1
            return None
        return packed >> _MS_BITS

    def remember(self, exchange: str, message_id: str, wall_s: float, lsn: int) -> None:
        if self.window_s <= 0:
            return
        seen = self._by_exchange.get(exchange)
        if seen is None:
            seen = self._by_exchange[exchange] = {}
        elif seen.pop(message_id, None) is not None:
            self._count -= 1  # refreshed: re-inserted at the end, keeping time order
        seen[message_id] = (lsn << _MS_BITS) | _ms(wall_s)
        self._count += 1

    def forget(self, exchange: str, message_id: str) -> None:
        seen = self._by_exchange.get(exchange)
        if seen is not None and seen.pop(message_id, None) is not None:
            self._count -= 1

    def prune(self, wall_s: float) -> None:
        """Drop every entry older than the window now."""
        self._prune_ms(_ms(wall_s))

    def _prune_ms(self, now_ms: int) -> None:
        horizon_ms = now_ms - _ms(self.window_s)
        for exchange, seen in list(self._by_exchange.items()):
            expired = []
            for message_id, packed in seen.items():
                if (packed & _MS_MASK) >= horizon_ms:
                    break
                expired.append(message_id)
            for message_id in expired:
                del seen[message_id]
            self._count -= len(expired)
            if not seen:
                del self._by_exchange[exchange]
        self._next_prune_ms = now_ms + max(1, _ms(self.window_s / 64))

    def batches(self, max_entries: int) -> list[tuple[str, list[tuple[str, float]]]]:
        """Live entries as (exchange, [(message_id, wall_s), ...]) with at most
        ``max_entries`` per batch, in time order per exchange, for checkpoints."""
        out: list[tuple[str, list[tuple[str, float]]]] = []
        for exchange, seen in self._by_exchange.items():
            batch: list[tuple[str, float]] = []
            for message_id, packed in seen.items():
                batch.append((message_id, (packed & _MS_MASK) / 1000.0))
                if len(batch) >= max_entries:
                    out.append((exchange, batch))
                    batch = []
            if batch:
                out.append((exchange, batch))
        return out

    def entries(self) -> list[tuple[str, str, float]]:
        """Live entries as (exchange, message_id, wall_s), in the order of :meth:`batches`."""
        return [
            (exchange, message_id, wall_s)
            for exchange, batch in self.batches(max(1, self._count))
            for message_id, wall_s in batch
        ]
