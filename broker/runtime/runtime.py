"""The broker's IO loop: carries out the core's effects with trio.

:class:`BrokerRuntime` owns the sans-IO :class:`~broker.core.Broker`, the write-ahead
log, the timers and the checkpoint schedule. Handlers call core commands through it
and then :meth:`BrokerRuntime.pump`, which takes the core's effects and acts on them:
channel events go to the outbox of the channel they address, log records to the WAL
(whose durability reports come back as :meth:`Broker.durable`), long-poll wake-ups to
parked getters. Every state change of the core happens on the trio thread.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from broker.core import (
    AppendRecords,
    Broker,
    Confirm,
    ConsumerCancelled,
    Deliver,
    DeliveryExpired,
    Effect,
    MessageLost,
    QueueReady,
    REST_CHANNEL,
    RecordType,
    Return,
    Unavailable,
)
from broker.core.records import ref_lsns

__all__ = ["BrokerRuntime", "ChannelSink", "RuntimeOptions"]

# Batches of at most this many WAL records are written and fsynced on the event loop
# thread instead of a worker thread: the thread hand-off costs about as much as the
# fsync (~150 us vs ~200 us on the benchmark machine), and a batch this small means
# there is little traffic to overlap with. One-at-a-time confirmed publish, raw client:
# p50 0.84 -> 0.59 ms, p99 3.9 -> 1.4 ms. Bigger batches (load) still go to the thread.
WAL_INLINE_MAX_RECORDS = 8
# A segment a checkpoint keeps only for its queued messages is compacted (those few
# messages logged again, so the next checkpoint can delete it) once at most one record
# in this many is a queued message: rewriting a segment's records costs at most a
# quarter of the space it frees.
COMPACT_LIVE_DIVISOR = 4
# Recoveries of at least this many records end with gc.freeze() (see _recover).
GC_FREEZE_MIN_RECORDS = 10_000

log = logging.getLogger("ackbus.runtime")


class ChannelSink(Protocol):
    """Where a channel's events go: the channel or stream handler's outbox."""

    def push(self, effect: Any) -> None: ...

    def closing(self, reason: str) -> None: ...

    def shutdown(self) -> None: ...


class Flushable(Protocol):
    """A sink that can send its queued events in the caller's step (``want_flush``)."""

    def flush_nowait(self) -> bool: ...


@dataclass
class RuntimeOptions:
    """The runtime's share of the settings (see broker.config for their meaning)."""

    data_dir: Path | None = None  # None: memory only, nothing written
    fsync: str = "always"
    segment_max_bytes: int = 64 << 20
    checkpoint_interval_s: float = 300.0
    checkpoint_wal_bytes: int = 256 << 20
    queue_memory_messages: int = 2048
    repair: bool = False
    dedup_window_s: float = 120.0
    default_lease_s: float = 30.0
    max_lease_s: float = 43200.0
    consumer_timeout_s: float = 1800.0
    channel_buffer_bytes: int = 1 << 20
    max_queues: int = 10000
    max_exchanges: int = 10000
    max_prefetch: int = 65535
    max_channels: int = 2048
    max_wait_s: float = 60.0
    max_body_bytes: int = 16 << 20


@dataclass
class _DurableWaiter:
    target: int
    event: trio.Event = field(default_factory=trio.Event)
    failure: str | None = None


@dataclass
class _RestPublish:
    event: trio.Event = field(default_factory=trio.Event)
    ack: bool = False
    reason: str | None = None
    returned: bool = False


class BrokerRuntime:
    """The trio side of one broker: core + log + timers + checkpoints."""

    def __init__(
        self,
        options: RuntimeOptions,
        *,
        clock: Callable[[], float] = trio.current_time,
        wall_clock: Callable[[], float] = time.time,
        metrics: Any = None,
    ) -> None:
        self.options = options
        self.boot_id = secrets.token_hex(4)
        self.core = Broker(
            clock=clock,
            wall_clock=wall_clock,
            boot_id=self.boot_id,
            dedup_window_s=options.dedup_window_s,
            consumer_timeout_s=options.consumer_timeout_s,
            default_lease_s=options.default_lease_s,
            max_lease_s=options.max_lease_s,
            channel_credit_bytes=options.channel_buffer_bytes,
            max_queues=options.max_queues,
            max_exchanges=options.max_exchanges,
            max_prefetch=options.max_prefetch,
            memory_messages_per_queue=options.queue_memory_messages,
        )
        self.metrics = metrics
        self.started_at = time.time()
        self.ready = False
        self.shutting_down = False
        self.wal: Any = None
        self.sinks: dict[int, ChannelSink] = {}
        # Sinks that queued events since the last pump: it tries to send them at once.
        self._to_flush: list[Flushable] = []
        self._rest_publishes: dict[int, _RestPublish] = {}
        self._queue_events: dict[str, trio.Event] = {}
        self._timer_wakeup = trio.Event()
        self._timer_at = math.inf
        self._checkpoint_lock = trio.Lock()
        self._wal_bytes_at_checkpoint = 0
        self._last_checkpoint_time = 0.0
        self.checkpoints = 0
        self.last_checkpoint_lsn = 0
        self.segments_kept = 0  # covered by the last checkpoint, kept for message bodies
        self.compacted_segments = 0
        self.messages_lost = 0  # paged-out messages whose record could not be read back
        self.last_checkpoint_duration_s = 0.0
        self.recovery_info: dict[str, Any] = {}
        self._durable_waiters: list[_DurableWaiter] = []
        self.ready_event = trio.Event()

    # --------------------------------------------------------------- lifecycle

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Recover, then run the WAL writer, timers and checkpoints until cancelled.

        ``task_status.started()`` is called at once (before recovery) so the HTTP
        server can answer ``/healthz`` with not-ready while recovery runs.
        """
        async with trio.open_nursery() as nursery:
            task_status.started()
            if self.options.data_dir is not None:
                await self._recover()
                await nursery.start(self.wal.serve)
                nursery.start_soon(self._serve_checkpoints)
            nursery.start_soon(self._serve_timers)
            self.ready = True
            self.ready_event.set()
            log.info("broker ready", extra={"fields": self.recovery_info})

    async def _recover(self) -> None:
        from broker import storage

        data_dir = self.options.data_dir
        assert data_dir is not None
        started = time.perf_counter()

        def recover_sync() -> Any:
            os.makedirs(data_dir, exist_ok=True)
            recovery = storage.recover(data_dir, repair=self.options.repair)
            core = self.core
            # Recovered messages stay in the log segments (paged out) and are read back
            # from them by LSN when their turn comes.
            core.read_log = recovery.reader.read
            core.begin_recovery()
            n_ckpt = n_wal = 0
            for rtype, payload in recovery.checkpoint_records:
                core.replay(rtype, payload, 0)
                n_ckpt += 1
            core.last_lsn = max(core.last_lsn, recovery.checkpoint_lsn)
            for lsn, rtype, payload in recovery.wal_records:
                core.replay(rtype, payload, lsn)
                n_wal += 1
            # Records after the checkpoint mean the broker did not stop cleanly (a clean
            # stop ends with a checkpoint covering everything).
            core.finish_recovery(recovery.last_lsn, assume_delivered=n_wal > 0)
            return recovery, n_ckpt, n_wal

        # Recovery builds millions of long-lived objects and no garbage cycles: the
        # cyclic collector would only re-scan them again and again (1M messages:
        # 8.3 s with it, 6.6 s without). Afterwards they are moved out of its way
        # (gc.freeze) so that serving does not re-scan them either; they are still
        # freed by reference counting once consumed.
        gc_enabled = gc.isenabled()
        gc.disable()
        try:
            recovery, n_ckpt, n_wal = await trio.to_thread.run_sync(recover_sync)
        finally:
            if gc_enabled:
                gc.enable()
        if n_ckpt + n_wal >= GC_FREEZE_MIN_RECORDS:
            gc.freeze()
        self.wal = storage.WriteAheadLog.open(
            recovery,
            fsync_policy=storage.parse_fsync_policy(self.options.fsync),
            segment_max_bytes=self.options.segment_max_bytes,
            inline_max_records=WAL_INLINE_MAX_RECORDS,
            on_durable=self._on_durable,
            on_failure=self._on_failure,
            on_recovered=self._on_recovered,
            on_fsync=self._on_fsync,
        )
        self.last_checkpoint_lsn = recovery.checkpoint_lsn
        self._last_checkpoint_time = trio.current_time()
        totals = self.core.totals()
        self.recovery_info = {
            "checkpoint_records": n_ckpt,
            "wal_records": n_wal,
            "last_lsn": self.core.last_lsn,
            "messages": totals["messages_ready"],
            "queues": totals["queues"],
            "duration_s": round(time.perf_counter() - started, 3),
        }
        report = recovery.report
        if report.truncated:
            self.recovery_info["truncated"] = [str(t) for t in report.truncated]
        if report.voided:
            self.recovery_info["voided"] = [str(v) for v in report.voided]

    # -------------------------------------------------------------- the pump

    def want_flush(self, sink: Flushable) -> None:
        """``sink`` has events queued: the next :meth:`pump` calls its ``flush_nowait``
        (a sink asks once per flush)."""
        self._to_flush.append(sink)

    def pump(self) -> None:
        """Carry out every effect the core has produced, then let the sinks that
        queued events send them now (see ``ChannelSession.flush_nowait``)."""
        effects = self.core.take_effects()
        if effects:
            self._carry_out(effects)
        while self._to_flush:
            sinks, self._to_flush = self._to_flush, []
            if any([sink.flush_nowait() for sink in sinks]):  # a list: flush every one
                # Deliveries went out and their credit came back: the core may deliver more.
                effects = self.core.take_effects()
                if effects:
                    self._carry_out(effects)

    def _carry_out(self, effects: list[Effect]) -> None:
        core = self.core
        sinks = self.sinks
        again = False
        for effect in effects:
            kind = type(effect)
            if kind is Deliver or kind is Confirm or kind is Return or kind is ConsumerCancelled or kind is DeliveryExpired:
                channel_id = effect.channel_id  # type: ignore[attr-defined]
                if channel_id == REST_CHANNEL:
                    self._rest_effect(effect)
                    continue
                sink = sinks.get(channel_id)
                if sink is not None:
                    sink.push(effect)
            elif kind is AppendRecords:
                assert isinstance(effect, AppendRecords)
                if self.wal is None:
                    core.durable(effect.last_lsn)
                    again = True
                else:
                    last = self.wal.append_nowait(effect.records, lazy=effect.lazy)
                    if last != effect.last_lsn:  # pragma: no cover - would be a bug
                        raise RuntimeError(f"LSN mismatch: core {effect.last_lsn}, wal {last}")
            elif kind is QueueReady:
                assert isinstance(effect, QueueReady)
                event = self._queue_events.pop(effect.queue, None)
                if event is not None:
                    event.set()
            elif kind is MessageLost:
                assert isinstance(effect, MessageLost)
                self.messages_lost += 1
                log.error(
                    "message lost: its record cannot be read back from the log",
                    extra={"fields": {"queue": effect.queue, "seq": effect.seq, "lsn": effect.lsn, "reason": effect.reason}},
                )
        if again:
            self.pump()
        earliest = core.earliest_timer()
        if earliest is not None and earliest < self._timer_at:
            self._timer_wakeup.set()

    def _rest_effect(self, effect: Any) -> None:
        if isinstance(effect, Confirm):
            waiters = self._rest_publishes
            if effect.multiple:
                done = [tag for tag in waiters if tag <= effect.delivery_tag]
            else:
                done = [effect.delivery_tag] if effect.delivery_tag in waiters else []
            for tag in done:
                waiter = waiters.pop(tag)
                waiter.ack = effect.ack
                waiter.reason = effect.reason
                waiter.event.set()
        elif isinstance(effect, Return):
            returned = self._rest_publishes.get(effect.delivery_tag)
            if returned is not None:
                returned.returned = True

    # ------------------------------------------------------------ REST helpers

    def check_ready(self) -> None:
        if not self.ready:
            raise Unavailable("the broker is recovering", code="not_ready")
        if self.shutting_down:
            raise Unavailable("the broker is shutting down", code="shutting_down")

    async def publish_and_confirm(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        mandatory: bool,
    ) -> tuple[bool, str | None, int, bool]:
        """One REST publish: (acked, nack reason, queues routed to, returned)."""
        tag, routed = self.core.publish(
            REST_CHANNEL, exchange, routing_key, body, properties, mandatory=mandatory
        )
        waiter = _RestPublish()
        self._rest_publishes[tag] = waiter
        published_at = time.perf_counter()
        self.pump()
        await waiter.event.wait()
        if self.metrics is not None:
            self.metrics.observe_confirm(time.perf_counter() - published_at)
        return waiter.ack, waiter.reason, routed, waiter.returned

    async def wait_durable(self) -> None:
        """Wait until every record produced so far is durable (for durable declares).

        Raises Unavailable if those records could not be written."""
        self.pump()
        target = self.core.last_lsn
        if self.core.durable_lsn >= target:
            return
        waiter = _DurableWaiter(target)
        self._durable_waiters.append(waiter)
        await waiter.event.wait()
        if waiter.failure is not None:
            raise Unavailable(f"storage failure: {waiter.failure}", code="storage_failed")

    def queue_event(self, queue: str) -> trio.Event:
        """An event set when ``queue`` gets ready messages (for long-polls)."""
        event = self._queue_events.get(queue)
        if event is None:
            event = self._queue_events[queue] = trio.Event()
        return event

    # ------------------------------------------------------------ WAL callbacks

    def _on_durable(self, lsn: int) -> None:
        self.core.durable(lsn)
        self._release_durable_waiters(lsn, None)
        self.pump()

    def _release_durable_waiters(self, lsn: int, failure: str | None) -> None:
        if self._durable_waiters:
            still = []
            for waiter in self._durable_waiters:
                if waiter.target <= lsn:
                    waiter.failure = failure
                    waiter.event.set()
                else:
                    still.append(waiter)
            self._durable_waiters = still

    def _on_failure(self, first_lsn: int, last_lsn: int, exc: BaseException) -> None:
        log.error(
            "log write failed; refusing persistent publishes until writes succeed",
            extra={"fields": {"first_lsn": first_lsn, "last_lsn": last_lsn, "error": str(exc)}},
        )
        self.core.storage_failed(first_lsn, last_lsn, str(exc))
        self._release_durable_waiters(last_lsn, str(exc))
        self.pump()

    def _on_recovered(self) -> None:
        log.warning("log writes succeed again; accepting persistent publishes")
        self.core.storage_recovered()
        self.pump()

    def _on_fsync(self, duration_s: float) -> None:
        if self.metrics is not None:
            self.metrics.observe_fsync(duration_s)

    # ----------------------------------------------------------------- timers

    async def _serve_timers(self) -> None:
        while True:
            deadline = self.core.next_deadline()
            self._timer_at = deadline if deadline is not None else math.inf
            self._timer_wakeup = trio.Event()
            with trio.move_on_at(self._timer_at):
                await self._timer_wakeup.wait()
                continue
            self.core.advance()
            self.pump()

    # ------------------------------------------------------------- checkpoints

    async def _serve_checkpoints(self) -> None:
        interval_s = self.options.checkpoint_interval_s or math.inf  # 0 disables
        size_bytes = self.options.checkpoint_wal_bytes or math.inf  # 0 disables
        while True:
            await trio.sleep(min(1.0, interval_s))
            stats = self.wal.statistics()
            grown = stats.bytes_written - self._wal_bytes_at_checkpoint
            due_by_time = trio.current_time() - self._last_checkpoint_time >= interval_s
            if grown >= size_bytes or (due_by_time and grown > 0):
                try:
                    await self.checkpoint()
                except OSError as exc:
                    log.error("checkpoint failed; will retry", extra={"fields": {"error": str(exc)}})
                    self._last_checkpoint_time = trio.current_time()

    async def checkpoint(self, *, compact: bool = True) -> None:
        """Write a checkpoint of the durable state and drop the log it covers.
        ``compact``: then log again the messages of mostly consumed kept segments.

        The snapshot is produced chunk by chunk on the trio thread (each chunk when the
        writer thread asks for it) while the file is written and fsynced in a worker
        thread, so serving continues throughout.
        """
        if self.wal is None:
            return
        from broker import storage

        async with self._checkpoint_lock:
            started = time.perf_counter()
            self.pump()
            bytes_before = self.wal.statistics().bytes_written
            lsn, chunks = self.core.snapshot()
            sentinel: list[tuple[int, bytes]] = []
            # Segments the checkpoint covers but must keep: they hold the bodies of
            # the queued messages it refers to.
            keep = storage.SegmentsToKeep(self.wal.reader)

            def next_chunk() -> list[tuple[int, bytes]]:
                return next(chunks, sentinel)

            def records() -> Any:
                while True:
                    chunk = trio.from_thread.run_sync(next_chunk)
                    if chunk is sentinel:
                        return
                    for rtype, payload in chunk:
                        if rtype == RecordType.QUEUE_REFS:
                            keep.add(ref_lsns(payload))
                    yield from chunk

            assert self.options.data_dir is not None
            data_dir = Path(self.options.data_dir)
            await trio.to_thread.run_sync(storage.write_checkpoint, data_dir, lsn, records())
            # The checkpoint refers to records by LSN: they must be on disk before the
            # segments it no longer needs go (under fsync=always they already are).
            try:
                await self.wal.sync()
            except storage.WALFailed as exc:
                log.warning(
                    "checkpoint written, but the log cannot be synced: no segment deleted",
                    extra={"fields": {"lsn": lsn, "error": str(exc)}},
                )
            else:
                self.wal.release_through(keep.release_limit(lsn), keep.counts)
                self.segments_kept = len(keep.counts)
                if compact:
                    self._compact(keep.counts, lsn)
            self._wal_bytes_at_checkpoint = bytes_before
            self._last_checkpoint_time = trio.current_time()
            self.checkpoints += 1
            self.last_checkpoint_lsn = lsn
            self.last_checkpoint_duration_s = time.perf_counter() - started
            if self.metrics is not None:
                self.metrics.observe_checkpoint(self.last_checkpoint_duration_s)
            log.info(
                "checkpoint written",
                extra={"fields": {"lsn": lsn, "duration_s": round(self.last_checkpoint_duration_s, 3)}},
            )

    def _compact(self, kept: dict[int, int], covered: int) -> None:
        """Log again the few queued messages of mostly consumed segments the checkpoint
        just written covers and kept, so that the next checkpoint can delete those
        segments (see docs/durability.md). Never the segment being appended to: the
        copies would land in it again."""
        reader = self.wal.reader
        active = self.wal.active_first_lsn
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
        self.pump()
        self.compacted_segments += len(sparse)
        log.info(
            "compacting WAL segments",
            extra={"fields": {"segments": len(sparse), "messages_logged_again": logged}},
        )

    # --------------------------------------------------------------- shutdown

    async def drain(self, timeout_s: float) -> bool:
        """Begin a graceful shutdown: stop deliveries, send ``closing`` to every
        channel, wait (at most ``timeout_s``) until every record is durable and so
        every confirm is sent, then tell every channel to end. Returns whether
        everything drained in time."""
        self.shutting_down = True
        self.core.delivering = False
        for sink in list(self.sinks.values()):
            sink.closing("broker shutting down")
        drained = False
        with trio.move_on_after(timeout_s):
            try:
                await self.wait_durable()
            except Unavailable as exc:
                # The log cannot sync what it holds: those publishes stay unconfirmed
                # (their clients resend them); the shutdown goes on regardless.
                log.error("shutdown drain: storage failed", extra={"fields": {"error": str(exc)}})
            else:
                drained = True
        for sink in list(self.sinks.values()):
            sink.shutdown()
        return drained

    def wake_getters(self) -> None:
        """Wake every parked long-poll (they answer at once when shutting down)."""
        events = list(self._queue_events.values())
        self._queue_events.clear()
        for event in events:
            event.set()

    async def aclose(self, *, checkpoint: bool = True) -> None:
        """Close the log, after a final checkpoint when asked (clean shutdown)."""
        for channel_id in list(self.core.channels):
            self.core.close_channel(channel_id, "broker shut down")
        self.pump()
        if self.wal is not None:
            if checkpoint and self.ready:
                try:
                    # nothing may follow the final checkpoint: records after it would
                    # make the next start treat this stop as a crash
                    await self.checkpoint(compact=False)
                except OSError as exc:
                    log.error("final checkpoint failed", extra={"fields": {"error": str(exc)}})
            await self.wal.aclose()

    def overview(self) -> dict[str, Any]:
        from broker import __version__

        info: dict[str, Any] = {
            "version": __version__,
            "uptime_s": round(time.time() - self.started_at, 3),
            "ready": self.ready,
            "boot_id": self.boot_id,
            "totals": self.core.totals(),
            "stats": dict(self.core.stats),
            "storage": {
                "enabled": self.wal is not None,
                "ok": self.core.storage_ok,
                "last_lsn": self.core.last_lsn,
                "durable_lsn": self.core.durable_lsn,
                "checkpoints": self.checkpoints,
                "last_checkpoint_lsn": self.last_checkpoint_lsn,
                "fsync": self.options.fsync,
                # messages whose bodies are only in the WAL segments (see docs/durability.md)
                "messages_paged_out": sum(len(q.paged) for q in self.core.queues.values()),
                "segments_kept": self.segments_kept,
                "segments_compacted": self.compacted_segments,
            },
            "recovery": self.recovery_info,
        }
        if self.wal is not None:
            st = self.wal.statistics()
            info["storage"].update(
                {
                    "wal_bytes_written": st.bytes_written,
                    "wal_fsyncs": st.fsyncs,
                    "wal_segments": st.segments,
                }
            )
        return info
