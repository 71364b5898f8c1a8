"""The runtime's checkpoint: references to records are on disk before segments go."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.runtime import BrokerRuntime, RuntimeOptions


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
        with trio.fail_after(10):
            while runtime.wal.statistics().last_durable_lsn < core.last_lsn:
                await trio.sleep(0.01)
        before = runtime.wal.statistics()
        assert before.last_synced_lsn < core.last_lsn  # written, not yet fsynced
        await runtime.checkpoint()
        after = runtime.wal.statistics()
        assert after.last_synced_lsn >= runtime.last_checkpoint_lsn == before.last_lsn
        assert after.fsyncs > before.fsyncs
        nursery.cancel_scope.cancel()
    await runtime.aclose(checkpoint=False)
