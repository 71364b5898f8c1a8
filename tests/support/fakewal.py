"""A stand-in for the write-ahead log (``broker.runtime.LogPort``), and how to attach it.

:class:`FakeWAL` keeps records in memory and reports durability through the same
callbacks the real log does (``BrokerRuntime.log_callbacks()``): ``on_durable``,
``on_failure``, ``on_recovered``. It runs in one of two modes:

- ``hold=True`` (what :func:`attach_fake_wal` gives by default): nothing becomes
  durable until the test says so with :meth:`FakeWAL.make_durable` (a disk the test
  drives step by step) or :meth:`FakeWAL.fail` (a disk that failed). :meth:`sync`
  waits for that.
- ``hold=False``: :meth:`serve` makes every appended batch durable at the next
  checkpoint, as the real log under ``fsync=always`` does.

Either way it is held to the real log's rules by ``tests/storage/test_wal_conformance.py``
(one suite, run against both): numbering, durability reported in order and only
through the callbacks, what ``sync`` returns, what survives a crash
(:meth:`FakeWAL.crash`), statistics, reads, closing.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Any

import trio

from broker.storage import (
    DEFAULT_MAX_RECORD_BYTES,
    RecordTooLarge,
    WALClosed,
    WALFailed,
    WALStatistics,
)
from broker.storage.reader import ReadFailure, ReadResult

__all__ = ["FakeLogReader", "FakeWAL", "attach_fake_wal"]


def _ignore(*_args: Any) -> None:
    pass


class FakeLogReader:
    """Reads back what a :class:`FakeWAL` wrote (the durable records), by LSN; the
    records the log's one "segment" holds, as ``storage.LogReader`` answers them."""

    def __init__(self, wal: FakeWAL) -> None:
        self._wal = wal

    def read(self, lsns: Sequence[int]) -> list[ReadResult]:
        out: list[ReadResult] = []
        for lsn in lsns:
            record = self._wal.written.get(lsn)
            if record is None:
                out.append(ReadFailure(f"record {lsn} is in no WAL segment on disk", transient=False))
            else:
                out.append(record)
        return out

    def spans(self) -> list[tuple[int, int]]:
        written = self._wal.written
        if not written:
            return []
        return [(min(written), max(written) + 1)]

    def segments_holding(self, lsns: Iterable[int]) -> tuple[dict[int, int], list[int]]:
        first = self._wal.active_first_lsn
        found: dict[int, int] = {}
        unindexed: list[int] = []
        for lsn in lsns:
            if first is not None and lsn in self._wal.written:
                found[first] = found.get(first, 0) + 1
            else:
                unindexed.append(lsn)
        return found, unindexed

    def record_count(self, first_lsn: int) -> int:
        return len(self._wal.written) if first_lsn == self._wal.active_first_lsn else 0

    def drop(self, first_lsn: int) -> None:
        pass

    def close(self) -> None:
        pass


class FakeWAL:
    """An in-memory ``LogPort`` (see the module docstring).

    Attributes a test reads: ``last_lsn``; ``durable_lsn``; ``appends`` ((first LSN,
    last LSN, lazy) of every append, in order); ``written`` (LSN -> (rtype, payload)
    of the records that reached the "disk"); ``reserve_wanted`` (calls of
    :meth:`want_reserve`).
    """

    def __init__(
        self,
        *,
        on_durable: Any = _ignore,
        on_failure: Any = _ignore,
        on_recovered: Any = _ignore,
        hold: bool = True,
        next_lsn: int = 1,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    ) -> None:
        self._on_durable = on_durable
        self._on_failure = on_failure
        self._on_recovered = on_recovered
        self.hold = hold
        self._max_record_bytes = max_record_bytes
        self._first_lsn = next_lsn
        self.last_lsn = next_lsn - 1
        self.durable_lsn = next_lsn - 1
        self.appends: list[tuple[int, int, bool]] = []
        #: records appended and not yet durable, by LSN
        self.buffered: dict[int, tuple[int, bytes]] = {}
        #: records durable ("on disk"), by LSN
        self.written: dict[int, tuple[int, bytes]] = {}
        self.reserve_wanted = 0
        self.failure: OSError | None = None
        self._closed = False
        self._bytes_written = 0
        self._syncs = 0
        self._changed = trio.Event()
        self.reader = FakeLogReader(self)

    # ------------------------------------------------------------------ LogPort

    @property
    def active_first_lsn(self) -> int | None:
        """First LSN of the one segment, once anything was written."""
        return self._first_lsn if self.written else None

    def append_nowait(
        self, records: Sequence[tuple[int, bytes]], *, lazy: bool = False, together: bool = False
    ) -> int:
        """Number the records after the last ones; nothing is numbered if one is bad."""
        if self._closed:
            raise WALClosed("the write-ahead log is closed")
        for rtype, payload in records:
            if not 0 <= rtype <= 255:
                raise ValueError(f"record type must be in 0..255, got {rtype}")
            if len(payload) + 1 > self._max_record_bytes:
                raise RecordTooLarge(len(payload) + 1, self._max_record_bytes)
        if not records:
            return self.last_lsn
        first = self.last_lsn + 1
        for offset, record in enumerate(records):
            self.buffered[first + offset] = (record[0], bytes(record[1]))
        self.last_lsn += len(records)
        self.appends.append((first, self.last_lsn, lazy))
        if self.failure is not None:
            self._fail_buffered()
        self._wake()
        return self.last_lsn

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Without ``hold``: make each appended batch durable, until closed."""
        task_status.started()
        while not self._closed:
            if not self.hold and self.buffered and self.failure is None:
                self._make_durable(self.last_lsn)
            await self._wait_change()

    async def sync(self) -> int:
        """Everything appended so far, durable: at once without ``hold``; with it, when
        the test has made it so (:meth:`make_durable`). Returns the durable LSN."""
        await trio.lowlevel.checkpoint()
        target = self.last_lsn
        while True:
            if self._closed:
                raise WALClosed("the write-ahead log is closed")
            if self.failure is not None:
                self._fail_buffered()
                raise WALFailed(f"the write-ahead log is failed: {self.failure}")
            if not self.hold and self.buffered:
                self._make_durable(self.last_lsn)
            if not any(lsn <= target for lsn in self.buffered):
                self._syncs += 1
                return self.durable_lsn
            await self._wait_change()

    def release_through(self, lsn: int, keep: Container[int] = ()) -> list[str]:
        """Nothing to delete: the fake's one segment is the active one, never deleted."""
        return []

    def statistics(self) -> WALStatistics:
        return WALStatistics(
            bytes_written=self._bytes_written,
            records_written=len(self.written),
            fsyncs=self._syncs,
            segments=1 if self.written else 0,
            failed=self.failure is not None,
            last_durable_lsn=self.durable_lsn,
            last_synced_lsn=self.durable_lsn,
            last_lsn=self.last_lsn,
            buffered_records=len(self.buffered),
            buffered_bytes=sum(len(payload) for _rtype, payload in self.buffered.values()),
            active_segment="fake" if self.written else None,
        )

    def want_reserve(self) -> None:
        self.reserve_wanted += 1

    async def aclose(self) -> None:
        """Make what is appended durable (as the real log's close writes and syncs
        what is buffered, ``hold`` or not), then close. Idempotent."""
        if self._closed:
            return
        if self.failure is not None:
            self._fail_buffered()
        elif self.buffered:
            self._make_durable(self.last_lsn)
        self._closed = True
        self._wake()
        await trio.lowlevel.checkpoint()

    # ------------------------------------------------------------ the test's disk

    def make_durable(self, lsn: int | None = None) -> None:
        """The disk catches up through ``lsn`` (everything appended by default):
        reported through ``on_durable``, as the real log reports a synced batch."""
        target = self.last_lsn if lsn is None else lsn
        if target > self.last_lsn:
            raise ValueError(f"LSN {target} was never appended (last is {self.last_lsn})")
        if target > self.durable_lsn:
            self._make_durable(target)

    def fail(self, exc: OSError | None = None, *, through: int | None = None) -> None:
        """The disk fails: what is appended and not durable is reported through
        ``on_failure``, and so is everything appended until :meth:`recover`.

        ``through``: one failed write of the records not durable up to that LSN (as the
        real log reports a failed batch), after which the disk goes on: later records
        can still be made durable, with no ``recover``."""
        failure = exc if exc is not None else OSError(5, "Input/output error (fake)")
        if through is None:
            self.failure = failure
            self._fail_buffered()
        else:
            failed = sorted(lsn for lsn in self.buffered if lsn <= through)
            for lsn in failed:
                del self.buffered[lsn]
            if failed:
                self._on_failure(failed[0], failed[-1], failure)
        self._wake()

    def recover(self) -> None:
        """The disk works again: reported through ``on_recovered``."""
        self.failure = None
        self._on_recovered()
        self._wake()

    def crash(self) -> dict[int, tuple[int, bytes]]:
        """A power cut: what was not durable is gone, and the log closes. Returns what
        survives (LSN -> record), as recovery would read it back."""
        self.buffered.clear()
        self.last_lsn = self.durable_lsn
        self._closed = True
        self._wake()
        return dict(self.written)

    # ----------------------------------------------------------------- internals

    def _make_durable(self, target: int) -> None:
        for lsn in range(self.durable_lsn + 1, target + 1):
            record = self.buffered.pop(lsn, None)
            if record is not None:  # None: reported failed, never written
                self.written[lsn] = record
                self._bytes_written += len(record[1])
        self.durable_lsn = target
        self._on_durable(target)
        self._wake()

    def _fail_buffered(self) -> None:
        if not self.buffered:
            return
        first, last = min(self.buffered), max(self.buffered)
        self.buffered.clear()
        assert self.failure is not None
        self._on_failure(first, last, self.failure)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()


def attach_fake_wal(runtime: Any, *, hold: bool = True) -> FakeWAL:
    """Give an in-memory ``BrokerRuntime`` a :class:`FakeWAL` reporting through the
    runtime's own log callbacks (``log_callbacks()``), as recovery wires the real log."""
    callbacks = runtime.log_callbacks()
    wal = FakeWAL(
        on_durable=callbacks.on_durable,
        on_failure=callbacks.on_failure,
        on_recovered=callbacks.on_recovered,
        hold=hold,
        next_lsn=runtime.core.last_lsn + 1,  # numbering goes on from the core's
    )
    runtime.wal = wal
    return wal
