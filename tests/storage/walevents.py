"""What the storage tests share: :class:`Events`, the WAL's callbacks collected so
that a test can wait for a condition on them, and :func:`serving`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from broker.storage import WriteAheadLog

__all__ = ["Events", "serving"]


class Events:
    """Collects the WAL's callbacks and lets a test wait for a condition on them."""

    def __init__(self) -> None:
        self.durable: list[int] = []
        self.failures: list[tuple[int, int, OSError]] = []
        self.recovered = 0
        self.fsync_durations: list[float] = []
        self._changed = trio.Event()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def on_durable(self, lsn: int) -> None:
        self.durable.append(lsn)
        self._poke()

    def on_failure(self, first: int, last: int, exc: OSError) -> None:
        self.failures.append((first, last, exc))
        self._poke()

    def on_recovered(self) -> None:
        self.recovered += 1
        self._poke()

    def on_fsync(self, duration_s: float) -> None:
        self.fsync_durations.append(duration_s)
        self._poke()

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_durable": self.on_durable,
            "on_failure": self.on_failure,
            "on_recovered": self.on_recovered,
            "on_fsync": self.on_fsync,
        }

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        while not condition():
            await self._changed.wait()

    async def wait_durable(self, lsn: int) -> None:
        await self.wait_for(lambda: bool(self.durable) and self.durable[-1] >= lsn)


@asynccontextmanager
async def serving(wal: WriteAheadLog) -> AsyncIterator[WriteAheadLog]:
    """Run ``wal``'s writer for the block, and close it at the end."""
    async with trio.open_nursery() as nursery:
        await nursery.start(wal.serve)
        yield wal
        await wal.aclose()
