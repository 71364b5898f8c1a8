"""Recovery at start: read the log back into the core, then open the log for appends.

The read phase (``storage.recover``: the last checkpoint, then the log after it) runs in
a worker thread and replays every record into the core there: the trio thread is free to
answer ``/healthz`` with "recovering" meanwhile, and nothing else touches the core until
recovery has finished. The append phase opens the write-ahead log on what was read.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from broker import storage
from broker.core import Broker

__all__ = ["GC_FREEZE_MIN_RECORDS", "Recovered", "WALCallbacks", "WAL_INLINE_MAX_RECORDS", "WAL_INLINE_WRITE_MAX_BYTES", "recover_broker"]

log = logging.getLogger("ackbus.runtime")

# Batches of at most this many WAL records are written and fsynced on the event loop
# thread instead of a worker thread: the thread hand-off costs about as much as the
# fsync (~150 us vs ~200 us on the benchmark machine), and a batch this small means
# there is little traffic to overlap with. One-at-a-time confirmed publish, raw client:
# p50 0.84 -> 0.59 ms, p99 3.9 -> 1.4 ms. Bigger batches (load) still go to the thread.
# But not while consumers are being served (the runtime's inline_allowed): the ~150 us
# the loop spends in an inline fsync is then time their acks and deliveries wait (at
# 1,000 msgs/s publish->deliver p50 0.40 -> 0.36 ms, p99 0.82 -> 0.65 ms without it).
WAL_INLINE_MAX_RECORDS = 8
# A batch the log writes without an fsync (a consumer's delivery marks and settles,
# written lazily under "always"; every batch under "interval" and "never") of at most
# this many bytes is written on the event loop whatever inline_allowed says: a write
# into the page cache takes microseconds, the hand-off to a worker thread and back
# tens of them. Consume + ack, prefetch 100, 100 B: the hand-off was a third of the
# broker's samples.
WAL_INLINE_WRITE_MAX_BYTES = 256 * 1024
# Recoveries of at least this many records end with gc.freeze() (see recover_broker).
GC_FREEZE_MIN_RECORDS = 10_000


@dataclass
class Recovered:
    """What recovery produced: the log, open for appends, and a report for people."""

    wal: storage.WriteAheadLog
    checkpoint_lsn: int
    info: dict[str, Any]
    #: queued-message references dropped because their records are not on disk
    #: (unconfirmed publishes; see Broker.finish_recovery)
    unconfirmed_dropped: int = 0


@dataclass
class WALCallbacks:
    """How the log reports back to the runtime (see ``storage.WriteAheadLog.open``)."""

    on_durable: Callable[[int], None]
    on_failure: Callable[[int, int, OSError], None]
    on_recovered: Callable[[], None]
    on_fsync: Callable[[float], None]
    on_reserve: Callable[[bool], None]
    #: Whether a small batch may be written and fsynced on the event loop now (see
    #: WAL_INLINE_MAX_RECORDS).
    inline_allowed: Callable[[], bool] | None = None


async def recover_broker(
    core: Broker,
    data_dir: Path,
    *,
    repair: bool,
    fsync: str,
    segment_max_bytes: int,
    reserve_bytes: int,
    callbacks: WALCallbacks,
    fs: storage.FileSystem | None = None,
) -> Recovered:
    """Replay ``data_dir``'s checkpoint and log into ``core`` and open the log.

    Raises: ``storage.StorageError`` for a log that cannot be recovered (corruption
    before its tail, unless ``repair``); ``OSError`` when the directory cannot be used.
    """
    started = time.perf_counter()

    def recover_sync() -> tuple[storage.Recovery, int, int]:
        os.makedirs(data_dir, exist_ok=True)
        recovery = storage.recover(data_dir, repair=repair, fs=fs)
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
        # With repair, a damaged segment is indexed only up to the damage: what lies
        # beyond was confirmed, and is given up when its turn comes (MessageLost).
        core.finish_recovery(
            recovery.last_lsn,
            assume_delivered=n_wal > 0,
            log_spans=None if repair else recovery.reader.spans(),
        )
        return recovery, n_ckpt, n_wal

    # Recovery builds millions of long-lived objects and no garbage cycles: the cyclic
    # collector would only re-scan them again and again (1M messages: 8.3 s with it,
    # 6.6 s without). Afterwards they are moved out of its way (gc.freeze) so that
    # serving does not re-scan them either; they are still freed by reference counting
    # once consumed.
    gc_enabled = gc.isenabled()
    gc.disable()
    try:
        recovery, n_ckpt, n_wal = await trio.to_thread.run_sync(recover_sync)
    finally:
        if gc_enabled:
            gc.enable()
    if n_ckpt + n_wal >= GC_FREEZE_MIN_RECORDS:
        gc.freeze()
    wal = storage.WriteAheadLog.open(
        recovery,
        fsync_policy=storage.parse_fsync_policy(fsync),
        segment_max_bytes=segment_max_bytes,
        reserve_bytes=reserve_bytes,
        inline_max_records=WAL_INLINE_MAX_RECORDS,
        inline_write_max_bytes=WAL_INLINE_WRITE_MAX_BYTES,
        inline_allowed=callbacks.inline_allowed,
        on_durable=callbacks.on_durable,
        on_failure=callbacks.on_failure,
        on_recovered=callbacks.on_recovered,
        on_fsync=callbacks.on_fsync,
        on_reserve=callbacks.on_reserve,
    )
    dropped = 0
    for queue, count, lowest in core.dropped_references:
        dropped += count
        log.warning(
            "recovery dropped references to records that are not on disk (unconfirmed "
            "publishes); the queue keeps serving",
            extra={"fields": {"queue": queue, "messages": count, "lowest_lsn": lowest}},
        )
    if dropped:
        log.warning(
            "the deduplication window read from the checkpoint was emptied: a resend of a "
            "dropped publish is taken again",
            extra={"fields": {"unconfirmed_dropped": dropped}},
        )
    totals = core.totals()
    info: dict[str, Any] = {
        "checkpoint_records": n_ckpt,
        "wal_records": n_wal,
        "last_lsn": core.last_lsn,
        "messages": totals["messages_ready"],
        "queues": totals["queues"],
        "duration_s": round(time.perf_counter() - started, 3),
    }
    report = recovery.report
    if report.truncated:
        info["truncated"] = [str(t) for t in report.truncated]
    if report.voided:
        info["voided"] = [str(v) for v in report.voided]
    if dropped:
        info["unconfirmed_dropped"] = dropped
    return Recovered(wal, recovery.checkpoint_lsn, info, dropped)
