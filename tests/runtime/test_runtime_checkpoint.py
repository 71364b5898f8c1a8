"""The runtime's checkpoint: references to records are on disk before segments go."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.runtime import BrokerRuntime, RuntimeOptions
from broker.storage.testing import SimulatedDisk
from tests.support.wait import wait_until


async def test_checkpoint_syncs_the_log_before_releasing_segments(tmp_path: Path) -> None:
    """A checkpoint refers to queued messages by the LSN of their records, and the
    segments it no longer needs are deleted: so every record up to the checkpoint must
    be fsynced first, even under fsync=never (where writes are otherwise synced only at
    rollover and close)."""
    runtime = BrokerRuntime(
        RuntimeOptions(data_dir=tmp_path, fsync="never", checkpoint_interval_s=0, checkpoint_wal_bytes=0)
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.serve)
        await runtime.ready_event.wait()
        core = runtime.core
        core.declare_queue("q", durable=True)
        ch = core.open_channel()
        for i in range(50):
            core.publish(ch, "", "q", b"m%d" % i, {"delivery_mode": 2})
        runtime.pump()
        await wait_until(lambda: runtime.wal.statistics().last_durable_lsn >= core.last_lsn)
        before = runtime.wal.statistics()
        assert before.last_synced_lsn < core.last_lsn  # written, not yet fsynced
        await runtime.checkpoint()
        after = runtime.wal.statistics()
        assert after.last_synced_lsn >= runtime.last_checkpoint_lsn == before.last_lsn
        assert after.fsyncs > before.fsyncs
        nursery.cancel_scope.cancel()
    await runtime.aclose(checkpoint=False)


async def test_the_space_reserve_is_made_and_a_full_disk_asks_for_a_checkpoint_at_once(
    tmp_path: Path,
) -> None:
    """The runtime makes the WAL keep its space reserve, and a write that fails with
    ENOSPC makes the checkpointer write a checkpoint at its next check, without
    waiting for the size or time trigger (a checkpoint is what frees a full disk)."""
    import errno

    disk = SimulatedDisk()
    runtime = BrokerRuntime(
        RuntimeOptions(
            data_dir=tmp_path, checkpoint_interval_s=3600, checkpoint_wal_bytes=1 << 40, reserve_bytes=1 << 20
        ),
        fs=disk,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.serve)
        await runtime.ready_event.wait()
        await wait_until(lambda: (tmp_path / "reserve").exists())
        assert (tmp_path / "reserve").stat().st_size >= 1 << 20
        assert runtime.checkpoints == 0
        core = runtime.core
        core.declare_queue("q", durable=True)
        disk.fail_writes(count=1, err=errno.ENOSPC)  # the log's next write finds the disk full
        core.publish(core.open_channel(), "", "q", b"m", {"delivery_mode": 2})
        runtime.pump()
        await wait_until(lambda: runtime.checkpoints > 0, what="a checkpoint after ENOSPC")
        nursery.cancel_scope.cancel()
    await runtime.aclose(checkpoint=False)


async def test_overview_reports_the_last_fsync_and_checkpoint(tmp_path: Path) -> None:
    """``GET /overview``'s storage section says how long the latest fsync took and when
    the latest checkpoint was written (the management UI shows both)."""
    runtime = BrokerRuntime(RuntimeOptions(data_dir=tmp_path, checkpoint_interval_s=0, checkpoint_wal_bytes=0))
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.serve)
        await runtime.ready_event.wait()
        storage = runtime.overview()["storage"]
        assert storage["last_checkpoint_at"] is None and storage["last_checkpoint_duration_s"] is None
        core = runtime.core
        core.declare_queue("q", durable=True)
        core.publish(core.open_channel(), "", "q", b"m", {"delivery_mode": 2})
        runtime.pump()
        await runtime.wait_durable()
        assert runtime.overview()["storage"]["last_fsync_s"] >= 0
        await runtime.checkpoint()
        storage = runtime.overview()["storage"]
        assert storage["last_checkpoint_at"] > 0 and storage["last_checkpoint_duration_s"] >= 0
        assert storage["checkpoints"] == 1
        nursery.cancel_scope.cancel()
    await runtime.aclose(checkpoint=False)


async def test_small_batches_leave_the_event_loop_while_consumers_are_served(tmp_path: Path) -> None:
    """A lone publisher's record is written and fsynced on the event loop (no thread
    hand-off); once a delivery went out since the log last asked, the next small batch
    goes to a worker thread, so the consumer's ack or next delivery does not wait out
    an fsync behind it."""
    import threading
    from typing import Any

    runtime = BrokerRuntime(RuntimeOptions(data_dir=tmp_path, checkpoint_interval_s=3600))
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.serve)
        await runtime.ready_event.wait()
        wal = runtime.wal
        on_loop: list[bool] = []
        io_write = wal._committer._io_write

        def recording_io_write(*args: Any) -> Any:
            on_loop.append(threading.current_thread() is threading.main_thread())
            return io_write(*args)

        wal._committer._io_write = recording_io_write  # type: ignore[method-assign]
        core = runtime.core
        core.declare_queue("q", durable=True)
        ch = core.open_channel()

        async def publish() -> None:
            core.publish(ch, "", "q", b"m", {"delivery_mode": 2})
            runtime.pump()
            await wait_until(lambda: wal.statistics().last_durable_lsn >= core.last_lsn, interval_s=0.001)

        await publish()  # (opens the first segment: never inline)
        on_loop.clear()
        await publish()
        assert on_loop == [True]  # publishers alone: inline
        core.consume(ch, "q", prefetch=10)
        on_loop.clear()
        await publish()  # delivered at once to the consumer
        assert on_loop and not on_loop[-1]
        nursery.cancel_scope.cancel()
    await runtime.aclose(checkpoint=False)
