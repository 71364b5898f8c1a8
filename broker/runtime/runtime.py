"""The broker's IO loop: carries out the core's effects with trio.

:class:`BrokerRuntime` owns the sans-IO :class:`~broker.core.Broker`, the write-ahead
log, the timers and the checkpoint schedule. The API does not call it directly: it
goes through the :class:`~broker.runtime.gateway.CommandGateway`, which runs a core
command and then :meth:`BrokerRuntime.pump`, which takes the core's effects and acts on
them through a table from effect type to handler: channel events go to the outbox of
the channel they address (confirms and returns first through the one book of pending
publishes, :class:`~broker.runtime.confirms.PendingConfirms`), log records to the WAL
(whose reports come back through :class:`~broker.runtime.logreports.LogReports`),
long-poll wake-ups and lock answers to the REST calls parked for them
(:class:`~broker.runtime.waits.Waits`), what only the operator is told to the log
(:class:`~broker.runtime.notices.Notices`). Every state change of the core happens on
the trio thread.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable
from typing import Any

import trio

from broker import storage
from broker.core import (
    REST_CHANNEL,
    AppendRecords,
    Broker,
    Confirm,
    ConsumerActive,
    ConsumerCancelled,
    DeadLetterDropped,
    Deliver,
    DeliveryExpired,
    Effect,
    LockGranted,
    LockWaitEnded,
    LogReadFailed,
    MessageLost,
    QueueAutoDeleted,
    QueueReady,
    Return,
    TickFired,
    Unavailable,
)
from broker.runtime.checkpoints import Checkpointer
from broker.runtime.confirms import PendingConfirms
from broker.runtime.flow import FlowControl
from broker.runtime.history import RateHistory
from broker.runtime.logreports import LogReports
from broker.runtime.memory import MemoryMonitor, process_rss_bytes
from broker.runtime.notices import Notices
from broker.runtime.options import RuntimeOptions
from broker.runtime.ports import (
    ChannelSink,
    ClusterPort,
    Flushable,
    LogPort,
    MetricsPort,
)
from broker.runtime.recovery import recover_broker
from broker.runtime.space import DiskSpaceAlarm
from broker.runtime.waits import Waits

__all__ = ["BrokerRuntime"]

log = logging.getLogger("ackbus.runtime")


class BrokerRuntime:
    """The trio side of one broker: core + log + timers + checkpoints."""

    def __init__(
        self,
        options: RuntimeOptions,
        *,
        clock: Callable[[], float] = trio.current_time,
        wall_clock: Callable[[], float] = time.time,
        metrics: MetricsPort | None = None,
        fs: storage.FileSystem | None = None,
        memory_probe: Callable[[], int] | None = None,
    ) -> None:
        """``fs``: the file system under the data directory (a test's simulated
        disk; the real one by default); ``memory_probe``: reads the resident size
        (a test's fake; ``/proc/self/statm`` by default)."""
        self.options = options
        self._fs = fs
        self.boot_id = secrets.token_hex(4)
        self.core = Broker(clock=clock, wall_clock=wall_clock, boot_id=self.boot_id, config=options)
        self.metrics = metrics
        self.started_at = time.time()
        self.ready = False
        self.shutting_down = False
        self.wal: LogPort | None = None
        self.sinks: dict[int, ChannelSink] = {}
        # Set (and replaced) whenever a sink goes: the drain waits on it.
        self._sink_removed = trio.Event()
        # Sinks that queued events since the last pump: it tries to send them at once.
        self._to_flush: list[Flushable] = []
        #: Every publish waiting for its confirm, channels' and REST's alike.
        self.confirms = PendingConfirms(metrics)
        #: Cluster mode (``broker.cluster``): forwarding, metadata through etcd; None
        #: on a single node.
        self.cluster: ClusterPort | None = None
        #: REST calls parked until the core answers (durability, locks, long-polls).
        self.waits = waits = Waits()
        self.queue_event = waits.queue_event
        self.lock_wait = waits.lock_wait
        self.forget_lock_wait = waits.forget_lock_wait
        self.wake_getters = waits.wake_getters
        self._timer_wakeup = trio.Event()
        self._timer_at = math.inf
        #: Whether publishers must wait (memory or disk alarm): one signal for every protocol.
        self.flow = FlowControl()
        self.memory = MemoryMonitor(self.flow, options.memory_high_watermark, probe=memory_probe or process_rss_bytes)
        self.space = DiskSpaceAlarm(self.core, self.flow, self.pump, lambda: self.wal)
        #: Short history of rates and depths for the UI's charts (GET /overview/history).
        self.history = RateHistory(self.core.views, self.memory)
        self.checkpointer: Checkpointer | None = None
        if options.data_dir is not None:
            self.checkpointer = Checkpointer(
                self.core,
                options.data_dir,
                interval_s=options.checkpoint_interval_s,
                wal_bytes=options.checkpoint_wal_bytes,
                metrics=metrics,
                pump=self.pump,
                on_reserve_used=self.space.on_reserve_used if options.reserve_bytes else None,
                fs=fs,
                space_wanted=self.space.space_wanted,
            )
        #: The effects only told to the operator (log lines), and their counts.
        self.notices = notices = Notices(metrics)
        #: The answers to the log's reports (durable, failed, recovered, fsynced).
        self.log_reports = reports = LogReports(
            self.core, waits, self.space, self.checkpointer, metrics, pump=self.pump, inline_allowed=self._inline_allowed
        )
        self.log_callbacks = reports.callbacks
        #: references to records not on disk dropped by recovery (unconfirmed publishes)
        self.unconfirmed_dropped = 0
        self.recovery_info: dict[str, Any] = {}
        self.ready_event = trio.Event()
        # A store written by AppendRecords with no log: the pump goes round again.
        self._again = False
        # A delivery went out since the log last asked (see _inline_allowed).
        self._delivered = False
        #: How each kind of effect is carried out (see _carry_out; taps.py wraps one).
        self.effect_handlers: dict[type[Effect], Callable[[Any], None]] = {
            Deliver: self._deliver,
            Confirm: self._confirm,
            Return: self._return,
            ConsumerCancelled: self._to_channel,
            ConsumerActive: self._to_channel,
            DeliveryExpired: self._to_channel,
            AppendRecords: self._append_records,
            QueueReady: waits.queue_ready,
            QueueAutoDeleted: notices.queue_auto_deleted,
            MessageLost: notices.message_lost,
            LogReadFailed: notices.log_read_failed,
            DeadLetterDropped: self._dead_letter_dropped,
            LockGranted: self._lock_answer,
            LockWaitEnded: self._lock_answer,
            TickFired: notices.tick_fired,
        }

    # --------------------------------------------------------------- lifecycle

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover, then run the WAL writer, timers and checkpoints until cancelled.

        ``task_status.started()`` is called at once (before recovery) so the HTTP
        server can answer ``/healthz`` with not-ready while recovery runs.
        """
        lock = storage.DataDirLock(self.options.data_dir) if self.options.data_dir is not None else None
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                await self._serve(nursery, lock)
        finally:
            if lock is not None:
                lock.release()

    async def _serve(self, nursery: trio.Nursery, lock: storage.DataDirLock | None) -> None:
        """Recovery (holding the data directory), then the tasks that serve."""
        if self.options.data_dir is not None and self.checkpointer is not None:
            assert lock is not None
            # held until serve ends: the offline tools refuse to write meanwhile
            await trio.to_thread.run_sync(lock.acquire)
            recovered = await recover_broker(
                self.core,
                self.options.data_dir,
                repair=self.options.repair,
                fsync=self.options.fsync,
                segment_max_bytes=self.options.segment_max_bytes,
                reserve_bytes=self.options.reserve_bytes,
                callbacks=self.log_callbacks(),
                fs=self._fs,
            )
            self.unconfirmed_dropped = recovered.unconfirmed_dropped
            self.wal = recovered.wal
            self.recovery_info = recovered.info
            self.checkpointer.started(recovered.wal, recovered.checkpoint_lsn)
            await nursery.start(recovered.wal.serve)
            nursery.start_soon(self.checkpointer.serve)
        # what recovery replayed starts now (queue timers, lock expiries, schedules
        # due while the broker was down), not at the first request
        self.pump()
        nursery.start_soon(self._serve_timers)
        nursery.start_soon(self.memory.serve)
        nursery.start_soon(self.history.serve)
        self.ready = True
        self.ready_event.set()
        log.info("broker ready", extra={"fields": self.recovery_info})

    # ------------------------------------------------------------------ sinks

    def check_channel_room(self) -> None:
        """Raises ``Unavailable`` (``limit_reached``) when ``max_channels`` channels and
        streams are open: one limit for both, since each holds a core channel."""
        if len(self.sinks) >= self.options.max_channels:
            raise Unavailable(
                f"channel limit reached ({self.options.max_channels})", code="limit_reached"
            )

    def add_sink(self, channel_id: int, sink: ChannelSink) -> None:
        """Send the events of ``channel_id`` to ``sink`` from now on."""
        self.sinks[channel_id] = sink

    def remove_sink(self, channel_id: int) -> None:
        """The channel or stream of ``channel_id`` has ended."""
        self.confirms.forget(channel_id)
        if self.sinks.pop(channel_id, None) is not None:
            self._sink_removed.set()
            self._sink_removed = trio.Event()

    # -------------------------------------------------------------- the pump

    def want_flush(self, sink: Flushable) -> None:
        """``sink`` has events queued: the next :meth:`pump` calls its ``flush_nowait``
        (a sink asks once per flush)."""
        self._to_flush.append(sink)

    def pump(self) -> None:
        """Carry out every effect the core has produced, then let the sinks that
        queued events send them now (see ``ServedChannel.flush_nowait``)."""
        effects = self.core.take_effects()
        if effects:
            self._carry_out(effects)
        else:
            # A command may set a deadline without any effect (a lease handed out on a
            # non-durable queue writes nothing): the timer task must still hear of it.
            self._wake_timer_if_earlier()
        while self._to_flush:
            sinks, self._to_flush = self._to_flush, []
            if any([sink.flush_nowait() for sink in sinks]):  # a list: flush every one
                # Deliveries went out and their credit came back: the core may deliver more.
                effects = self.core.take_effects()
                if effects:
                    self._carry_out(effects)

    def _carry_out(self, effects: list[Effect]) -> None:
        handlers = self.effect_handlers
        for effect in effects:
            handlers[type(effect)](effect)
        if self._again:
            self._again = False
            self.pump()
        self._wake_timer_if_earlier()

    def _wake_timer_if_earlier(self) -> None:
        earliest = self.core.earliest_timer()
        if earliest is not None and earliest < self._timer_at:
            self._timer_wakeup.set()

    def _deliver(self, effect: Deliver) -> None:
        self._delivered = True
        self._to_channel(effect)

    def _inline_allowed(self) -> bool:
        """Whether the log may write and fsync a small batch on the event loop: not
        when a delivery went out since it last asked. A consumer is being served
        then, and its ack or the next delivery would wait out the fsync (~150 us)
        behind it; with publishers alone the inline fsync saves a thread hand-off."""
        delivered, self._delivered = self._delivered, False
        return not delivered

    def _to_channel(self, effect: Deliver | Confirm | Return | ConsumerCancelled | DeliveryExpired) -> None:
        sink = self.sinks.get(effect.channel_id)
        if sink is not None:
            sink.push(effect)

    def _confirm(self, effect: Confirm) -> None:
        """Settle the publishes it covers in the book (REST waiters wake), then tell
        the channel."""
        self.confirms.confirmed(effect)
        if effect.channel_id != REST_CHANNEL:
            self._to_channel(effect)

    def _return(self, effect: Return) -> None:
        self.confirms.returned(effect)
        if effect.channel_id != REST_CHANNEL:
            self._to_channel(effect)

    def _append_records(self, effect: AppendRecords) -> None:
        if self.wal is None:
            self.core.durable(effect.last_lsn)
            self._again = True
            return
        last = self.wal.append_nowait(effect.records, lazy=effect.lazy, together=effect.together)
        if last != effect.last_lsn:  # pragma: no cover - would be a bug
            raise RuntimeError(f"LSN mismatch: core {effect.last_lsn}, wal {last}")

    def _lock_answer(self, effect: LockGranted | LockWaitEnded) -> None:
        """The end of a lock wait: to the parked REST call, or to its channel."""
        if effect.channel_id == REST_CHANNEL:
            self.waits.lock_answered(effect)
            return
        sink = self.sinks.get(effect.channel_id)
        if sink is not None:
            sink.push(effect)

    def _dead_letter_dropped(self, effect: DeadLetterDropped) -> None:
        if effect.forward is not None and self.cluster is not None and self.cluster.forward_dead_letter(*effect.forward):
            return  # cluster mode: forwarded to the nodes owning its dead-letter queues
        fields = {"queue": effect.queue, "seq": effect.seq, "reason": effect.reason, "why": effect.why}
        log.warning("message dropped instead of dead-lettered", extra={"fields": fields})

    def read_blocked_queues(self) -> dict[str, str]:
        """Queues waiting to read their next message back from the log, and why (for
        ``/healthz``: an operator must see it)."""
        return self.core.views.read_blocked_queues()

    # ------------------------------------------------------------ REST helpers

    def check_ready(self) -> None:
        """Raises ``Unavailable`` while recovering or shutting down."""
        if not self.ready:
            raise Unavailable("the broker is recovering", code="not_ready")
        if self.shutting_down:
            raise Unavailable("the broker is shutting down", code="shutting_down")

    async def wait_durable(self, target: int | None = None) -> None:
        """Wait until every record produced so far (or up to LSN ``target``) is durable.

        Raises Unavailable if those records could not be written."""
        self.pump()
        if target is None:
            target = self.core.last_lsn
        if self.core.durable_lsn >= target:
            return
        await self.waits.wait_durable(target)

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

    async def checkpoint(self, *, compact: bool = True) -> None:
        """Write a checkpoint now (see :meth:`Checkpointer.checkpoint`); nothing
        without a log."""
        if self.checkpointer is not None:
            await self.checkpointer.checkpoint(compact=compact)

    @property
    def checkpoints(self) -> int:
        """Checkpoints written since start."""
        return self.checkpointer.count if self.checkpointer is not None else 0

    @property
    def last_checkpoint_lsn(self) -> int:
        return self.checkpointer.last_lsn if self.checkpointer is not None else 0

    # --------------------------------------------------------------- shutdown

    async def drain(self, timeout_s: float) -> bool:
        """Begin a graceful shutdown: stop deliveries, send ``closing`` to every
        channel, wait (at most ``timeout_s``) until every record is durable and so
        every confirm is sent, and until every channel has ended: a channel ends when
        its client closes it or has nothing left to settle, so acks sent in answer to
        ``closing`` still land. Then tell the channels still open to end. Returns
        whether the log synced everything in time."""
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
            while self.sinks:
                await self._sink_removed.wait()
        for sink in list(self.sinks.values()):
            sink.shutdown()
        return drained

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
        """``GET /overview``: version, uptime, totals, storage and recovery state."""
        from broker import __version__

        ckpt = self.checkpointer
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
                "messages_paged_out": self.core.views.paged_out_total(),
                "segments_kept": ckpt.segments_kept if ckpt is not None else 0,
                "segments_compacted": ckpt.compacted_segments if ckpt is not None else 0,
                "last_fsync_s": self.log_reports.last_fsync_s,
                "last_checkpoint_at": ckpt.last_at if ckpt is not None else None,
                "last_checkpoint_duration_s": ckpt.last_duration_s if ckpt is not None and ckpt.count else None,
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
