"""The runtime's ports: what it needs from the things it talks to, as ``Protocol``s.

The runtime carries out the core's effects on three kinds of outside things: the log
(``storage.WriteAheadLog``, or a test's fake), the channels and streams of the API layer
(sinks for their events), and metrics. Naming only what it uses keeps the runtime from
depending on the API layer, lets tests stand in fakes, and gives mypy something to check
instead of ``Any``.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Protocol

import trio

from broker.core import Effect
from broker.storage import LogReader, WALStatistics

__all__ = ["ChannelSink", "Flushable", "LogPort", "MetricsPort"]


class ChannelSink(Protocol):
    """Where a channel's events go: the channel or stream handler's outbox."""

    def push(self, effect: Effect) -> None:
        """Queue an event effect (deliver, confirm, return, cancel, expired)."""

    def closing(self, reason: str) -> None:
        """The broker is shutting down: tell the client."""

    def shutdown(self) -> None:
        """Stop taking operations; end once what is queued is sent."""


class Flushable(Protocol):
    """A sink that can send its queued events in the caller's step (``want_flush``)."""

    def flush_nowait(self) -> bool:
        """Send what is queued now if the connection is idle; True if deliveries went
        out and their credit was granted (the core may deliver more)."""
        ...


class LogPort(Protocol):
    """The part of ``storage.WriteAheadLog`` the runtime uses."""

    @property
    def active_first_lsn(self) -> int | None: ...

    @property
    def reader(self) -> LogReader: ...

    def append_nowait(
        self, records: Sequence[tuple[int, bytes]], *, lazy: bool = False, together: bool = False
    ) -> int:
        """Append records; returns the LSN of the last one."""
        ...

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write and sync appended records until closed."""

    async def sync(self) -> int:
        """Make everything appended durable; returns the durable LSN."""
        ...

    def release_through(self, lsn: int, keep: Container[int] = ()) -> list[str]:
        """Delete the segments a checkpoint at ``lsn`` covers, except ``keep``."""
        ...

    def statistics(self) -> WALStatistics: ...

    def want_reserve(self) -> None:
        """Make the space reserve again when there is room."""
        ...

    async def aclose(self) -> None: ...


class MetricsPort(Protocol):
    """Latencies the runtime and the channels measure as they happen."""

    def observe_fsync(self, duration_s: float) -> None: ...

    def observe_checkpoint(self, duration_s: float) -> None: ...

    def observe_confirm(self, duration_s: float) -> None: ...

    def observe_tick_lateness(self, lateness_s: float) -> None: ...


