"""Checkpoints: when to write one, how, and what the log can then let go.

A checkpoint is the core's durable state (its snapshot) written to a file, after which
the log segments it covers can be deleted, except those still holding the bodies of
queued messages it refers to by LSN. :class:`Checkpointer` decides when (every
``checkpoint_interval_s`` if the log grew, or as soon as it grew by
``checkpoint_wal_bytes``), writes it while serving goes on, and then compacts: the few
queued messages of mostly consumed kept segments are logged again, so that the next
checkpoint can delete those segments too.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import trio

from broker import storage
from broker.core import Broker, RecordType, ref_lsns
from broker.runtime.ports import LogPort, MetricsPort

__all__ = ["CHECK_INTERVAL_S", "COMPACT_LIVE_DIVISOR", "Checkpointer"]

# A segment a checkpoint keeps only for its queued messages is compacted (those few
# messages logged again, so the next checkpoint can delete it) once at most one record
# in this many is a queued message: rewriting a segment's records costs at most a
# quarter of the space it frees.
COMPACT_LIVE_DIVISOR = 4

#: How often the triggers are looked at (seconds).
CHECK_INTERVAL_S = 1.0

log = logging.getLogger("ackbus.runtime")


class Checkpointer:
    """Writes checkpoints of one core to one data directory, and keeps their numbers."""

    def __init__(
        self,
        core: Broker,
        data_dir: Path,
        *,
        interval_s: float,
        wal_bytes: int,
        metrics: MetricsPort | None,
        pump: Callable[[], None],
        on_reserve_used: Callable[[], None] | None = None,
        fs: storage.FileSystem | None = None,
        space_wanted: Callable[[], bool] | None = None,
    ) -> None:
        """``on_reserve_used``: called when a checkpoint had to use the space reserve
        (the disk is full) - None when the broker keeps none. ``fs``: the file system
        (a test's simulated disk; the real one by default). ``space_wanted``: whether
        the broker is refusing publishes for want of disk space; while it is, a
        checkpoint is written as soon as the log has grown (settles of consumed
        messages), since only a checkpoint lets their segments go."""
        self.core = core
        self.data_dir = data_dir
        self.interval_s = interval_s or math.inf  # 0 disables
        self.wal_bytes = wal_bytes or math.inf  # 0 disables
        self.metrics = metrics
        self._pump = pump
        self._on_reserve_used = on_reserve_used
        self._space_wanted = space_wanted
        self.fs = fs
        self.wal: LogPort | None = None
        self._lock = trio.Lock()
        self._wal_bytes_at_checkpoint = 0
        self._last_time = 0.0
        self.count = 0
        self.last_lsn = 0
        self.segments_kept = 0  # covered by the last checkpoint, kept for message bodies
        self.compacted_segments = 0
        self.last_duration_s = 0.0
        #: Wall-clock time (Unix seconds) the last checkpoint of this run was written.
        self.last_at: float | None = None
        # asked for at once (the disk is full): the next check writes one
        self._requested = False

    def started(self, wal: LogPort, checkpoint_lsn: int) -> None:
        """The log is open (recovery finished at a checkpoint of ``checkpoint_lsn``)."""
        self.wal = wal
        self.last_lsn = checkpoint_lsn
        self._last_time = trio.current_time()

    def request(self) -> None:
        """Write a checkpoint at the next check (within a second), whatever the
        triggers say: the log filled the disk, and only a checkpoint frees it."""
        self._requested = True

    async def serve(self) -> None:
        """Write a checkpoint whenever one is due, until cancelled."""
        assert self.wal is not None
        while True:
            await trio.sleep(min(CHECK_INTERVAL_S, self.interval_s))
            stats = self.wal.statistics()
            grown = stats.bytes_written - self._wal_bytes_at_checkpoint
            due_by_time = trio.current_time() - self._last_time >= self.interval_s
            # On a full disk, consumption frees space only through a checkpoint: one
            # runs at once (each second while consumers keep settling).
            due_for_space = grown > 0 and self._space_wanted is not None and self._space_wanted()
            if grown >= self.wal_bytes or (due_by_time and grown > 0) or due_for_space or self._requested:
                self._requested = False
                try:
                    await self.checkpoint()
                except OSError as exc:
                    log.error("checkpoint failed; will retry", extra={"fields": {"error": str(exc)}})
                    self._last_time = trio.current_time()

    async def checkpoint(self, *, compact: bool = True) -> None:
        """Write a checkpoint of the durable state and drop the log it covers.
        ``compact``: then log again the messages of mostly consumed kept segments.

        The snapshot is produced chunk by chunk on the trio thread (each chunk when the
        writer thread asks for it) while the file is written and fsynced in a worker
        thread, so serving continues throughout.

        Raises: ``OSError`` when the checkpoint cannot be written (the previous one and
        the log stay as they were).
        """
        wal = self.wal
        if wal is None:
            return
        async with self._lock:
            started = time.perf_counter()
            self._pump()
            bytes_before = wal.statistics().bytes_written
            lsn, chunks = self.core.snapshot()
            sentinel: list[tuple[int, bytes]] = []
            # Segments the checkpoint covers but must keep: they hold the bodies of
            # the queued messages it refers to.
            keep = storage.SegmentsToKeep(wal.reader)

            def next_chunk() -> list[tuple[int, bytes]]:
                return next(chunks, sentinel)

            def records() -> Iterator[tuple[int, bytes]]:
                while True:
                    chunk = trio.from_thread.run_sync(next_chunk)
                    if chunk is sentinel:
                        return
                    for rtype, payload in chunk:
                        if rtype == RecordType.QUEUE_REFS or rtype == RecordType.PRIORITY_REFS:
                            keep.add(ref_lsns(rtype, payload))
                    yield from chunk

            def log_durable_before_rename() -> None:
                # In the writer thread, between the file's fsync and its rename.
                trio.from_thread.run(self._sync_log_for_checkpoint, wal)

            try:
                await trio.to_thread.run_sync(
                    functools.partial(
                        storage.write_checkpoint,
                        self.data_dir,
                        lsn,
                        records(),
                        fs=self.fs,
                        before_rename=log_durable_before_rename,
                    )
                )
            except storage.WALFailed as exc:
                log.warning(
                    "checkpoint not written: the log cannot be synced through the records it refers to",
                    extra={"fields": {"lsn": lsn, "error": str(exc)}},
                )
                self._last_time = trio.current_time()
                return
            if self._on_reserve_used is not None and not storage.reserve_present(self.data_dir):
                self._on_reserve_used()
            # Every record the checkpoint refers to is durable (log_durable_before_rename):
            # the segments it covers and no longer needs can go.
            wal.release_through(keep.release_limit(lsn), keep.counts)
            self.segments_kept = len(keep.counts)
            storage.faults.hit("checkpoint.after_release")
            if compact:
                self._compact(wal, keep.counts, lsn)
            self._wal_bytes_at_checkpoint = bytes_before
            self._last_time = trio.current_time()
            self.count += 1
            self.last_lsn = lsn
            self.last_duration_s = time.perf_counter() - started
            self.last_at = time.time()
            if self.metrics is not None:
                self.metrics.observe_checkpoint(self.last_duration_s)
            log.info(
                "checkpoint written",
                extra={"fields": {"lsn": lsn, "duration_s": round(self.last_duration_s, 3)}},
            )

    async def _sync_log_for_checkpoint(self, wal: LogPort) -> None:
        """Make the log durable through every record the checkpoint being written can
        refer to. Its cut of the queues was taken after the snapshot's LSN, while
        serving went on, so it may refer to later records than that LSN: everything
        the core has produced so far is handed to the log, and ``sync`` returns once
        each of those records is on disk or was reported failed (and nacked; recovery
        drops a reference to such a record, see docs/durability.md).

        Raises: ``storage.WALFailed`` when the log cannot be synced."""
        self._pump()
        await wal.sync()

    def _compact(self, wal: LogPort, kept: dict[int, int], covered: int) -> None:
        """Log again the few queued messages of mostly consumed segments the checkpoint
        just written covers and kept, so that the next checkpoint can delete those
        segments (see docs/durability.md). Never the segment being appended to: the
        copies would land in it again."""
        reader = wal.reader
        active = wal.active_first_lsn
        sparse = []
        for first, live in kept.items():
            records = reader.record_count(first)
            if (
                records
                and first != active
                and first + records - 1 <= covered
                and live * COMPACT_LIVE_DIVISOR <= records
            ):
                sparse.append((first, first + records))
        if not sparse:
            return
        logged = self.core.relocate(sorted(sparse))
        self._pump()
        self.compacted_segments += len(sparse)
        log.info(
            "compacting WAL segments",
            extra={"fields": {"segments": len(sparse), "messages_logged_again": logged}},
        )

