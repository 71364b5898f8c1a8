"""A stand-in for the write-ahead log of an in-memory broker, and what it promises.

It numbers records as the real log does (``tests/storage/test_wal_conformance.py``
holds both to the same rules), and a test reports durability by hand through the
callbacks the real log calls, ``runtime._on_durable(lsn)`` and
``runtime._on_failure(first, last, exc)``.
"""

from __future__ import annotations

__all__ = ["FakeWAL"]


class FakeWAL:
    """Stands in for the write-ahead log of an in-memory broker (set it as
    ``runtime.wal`` before publishing): it numbers records, and the test reports
    durability by hand through the callbacks the real log calls,
    ``runtime._on_durable(lsn)`` and ``runtime._on_failure(first, last, exc)``."""

    def __init__(self) -> None:
        self.last_lsn = 0
        #: (first LSN, last LSN, lazy) of every append, in order.
        self.appends: list[tuple[int, int, bool]] = []

    def append_nowait(self, records: list[tuple[int, bytes]], *, lazy: bool = False, together: bool = False) -> int:
        self.appends.append((self.last_lsn + 1, self.last_lsn + len(records), lazy))
        self.last_lsn += len(records)
        return self.last_lsn
