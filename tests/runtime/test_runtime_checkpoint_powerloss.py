"""Power loss at every step of a checkpoint, with publishes in flight.

A checkpoint refers to queued messages by the LSN of their log records, so it may be
put in place only once every record it refers to is on disk. These tests cut the
power (``SimulatedDisk``: unsynced writes and directory entries are dropped) at each
step of a checkpoint while publishers keep publishing, recover, and drain: every
confirmed message comes back, and no queue is left behind a reference to a record
that is not on disk.
"""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest
import trio

from broker import storage
from broker.core import Confirm, Effect, RecordType
from broker.core import records as rec
from broker.runtime import BrokerRuntime, RuntimeOptions
from broker.storage import faults
from broker.storage.testing import SimulatedCrash, SimulatedDisk

#: Where a checkpoint can be cut short, in the order it passes them. The snapshot
#: step is the first chunk being produced (the writer thread asked for it); the log
#: sync happens between ``before_log_sync`` and ``before_rename``.
CHECKPOINT_STEPS = [
    "checkpoint.after_tmp_write",  # snapshot taken and written, file not yet fsynced
    "checkpoint.before_log_sync",  # file fsynced, log not yet synced
    "checkpoint.before_rename",  # log synced, not yet renamed
    "checkpoint.after_rename",  # renamed, directory not yet fsynced
    "checkpoint.after_dir_fsync",  # durable, covered segments not yet released
    "checkpoint.after_release",  # segments released, compaction not yet done
]

PUBLISHERS = 3
WINDOW = 16


class ConfirmSink:
    """A channel's outbox that keeps the publisher confirms."""

    def __init__(self) -> None:
        self.acked: set[int] = set()
        self.nacked: set[int] = set()

    def push(self, effect: Effect) -> None:
        if isinstance(effect, Confirm):
            # tags are answered in order on a channel: a multiple confirm covers every
            # tag up to its own not yet answered
            tags = {effect.delivery_tag}
            if effect.multiple:
                answered = self.acked | self.nacked
                tags = {t for t in range(1, effect.delivery_tag + 1) if t not in answered}
            (self.acked if effect.ack else self.nacked).update(tags)

    def closing(self, reason: str) -> None:
        pass

    def shutdown(self) -> None:
        pass


def options(data_dir: Path) -> RuntimeOptions:
    # checkpoints only when the test asks; small segments, so that checkpoints
    # release some
    return RuntimeOptions(
        data_dir=data_dir,
        fsync="always",
        checkpoint_interval_s=0,
        checkpoint_wal_bytes=0,
        segment_max_bytes=4096,
        reserve_bytes=0,
    )


async def publish_until_crash(
    data_dir: Path, disk: SimulatedDisk, checkpoints: int
) -> tuple[dict[bytes, int], bool]:
    """Several pipelined publishers, each keeping ``WINDOW`` publishes in flight,
    while checkpoints are written one after another. Returns every confirmed body
    (with the number of times it was confirmed) and whether the power was cut."""
    runtime = BrokerRuntime(options(data_dir), fs=disk)
    confirmed: dict[bytes, int] = {}
    crashed = False
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.serve)
            await runtime.ready_event.wait()
            core = runtime.core
            core.declare_queue("q", durable=True)
            runtime.pump()
            await runtime.wait_durable()
            done = trio.Event()
            remaining = PUBLISHERS

            async def publisher(n: int) -> None:
                nonlocal remaining
                channel = core.open_channel()
                sink = ConfirmSink()
                runtime.add_sink(channel, sink)
                bodies: dict[int, bytes] = {}
                for i in range(400):
                    while len(bodies) - len(sink.acked) - len(sink.nacked) >= WINDOW:
                        await trio.sleep(0)
                    result = core.publish(channel, "", "q", b"p%d-%d" % (n, i), {"delivery_mode": 2})
                    bodies[result[0]] = b"p%d-%d" % (n, i)
                    runtime.pump()
                    for tag in list(sink.acked):
                        body = bodies.pop(tag, None)
                        if body is not None:
                            confirmed[body] = confirmed.get(body, 0) + 1
                    if i % 5 == 0:
                        await trio.sleep(0)
                remaining -= 1
                if not remaining:
                    done.set()

            for n in range(PUBLISHERS):
                nursery.start_soon(publisher, n)
            # the checkpoints begin once something is confirmed (the publishers go on
            # meanwhile): a power cut before any confirm would test nothing, and on a
            # loaded machine the first fsync can come after the first checkpoint's step
            with trio.fail_after(30):
                while not confirmed:
                    await trio.sleep(0.001)
            for _ in range(checkpoints):
                await trio.sleep(0)
                await runtime.checkpoint()
            await done.wait()
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if group.split(SimulatedCrash)[0] is None:
            raise
        crashed = True
    except SimulatedCrash:
        crashed = True
    return confirmed, crashed


async def drain(data_dir: Path) -> tuple[list[bytes], BrokerRuntime]:
    """Recover ``data_dir`` (on the real file system, which now holds only what was
    durable) and take every message of ``q``."""
    runtime = BrokerRuntime(options(data_dir))
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.serve)
        await runtime.ready_event.wait()
        core = runtime.core
        while True:
            taken = core.get("q", 100)
            runtime.pump()
            if not taken:
                break
            got.extend(delivery.entry.message.body for _lease, delivery, _redelivered in taken)
            core.ack_leases([lease for lease, _d, _r in taken])
            runtime.pump()
        assert not runtime.read_blocked_queues(), "a queue waits on a record that is not on disk"
        nursery.cancel_scope.cancel()
    await runtime.aclose(checkpoint=False)
    return got, runtime


@pytest.fixture(autouse=True)
def _no_faults_left() -> object:
    yield
    faults.reset()


@pytest.mark.parametrize("skip", [0, 2])
@pytest.mark.parametrize("step", CHECKPOINT_STEPS)
async def test_power_loss_at_each_checkpoint_step_keeps_every_confirmed_message(
    tmp_path: Path, step: str, skip: int
) -> None:
    disk = SimulatedDisk()
    faults.set_kill_handler(disk.kill_handler)
    faults.activate(step, skip=skip, count=1)
    confirmed, crashed = await publish_until_crash(tmp_path, disk, checkpoints=skip + 3)
    assert crashed, f"the power was never cut at {step}"
    faults.reset()
    disk.lose_power()
    got, runtime = await drain(tmp_path)
    assert confirmed, "nothing was confirmed before the power cut"
    lost = set(confirmed) - set(got)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:3]}"
    # With the ordering rule kept, a checkpoint never refers to a record that a power
    # cut can take: recovery has nothing to drop.
    assert runtime.unconfirmed_dropped == 0


async def test_recovery_drops_references_to_records_not_on_disk_and_keeps_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Defence in depth: a checkpoint (written by a broker without the ordering rule)
    refers to records past the end of the log. Recovery drops those references,
    warns, counts them, and the messages behind them are delivered."""
    runtime = BrokerRuntime(options(tmp_path))
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.serve)
        await runtime.ready_event.wait()
        core = runtime.core
        core.declare_queue("q", durable=True)
        channel = core.open_channel()
        runtime.add_sink(channel, ConfirmSink())
        for i in range(20):
            core.publish(channel, "", "q", b"m%d" % i, {"delivery_mode": 2})
        runtime.pump()
        await runtime.wait_durable()
        nursery.cancel_scope.cancel()
    await runtime.aclose(checkpoint=True)
    # Rewrite the checkpoint so that its queue's first five references (m0..m4, as
    # if consumed) point at records after the log's end instead: what the old
    # ordering left after a power cut, unconfirmed publishes at the head.
    loaded = storage.read_latest_checkpoint(tmp_path)
    assert loaded is not None
    last, records = loaded.lsn, list(loaded.records)
    patched = []
    for rtype, payload in records:
        if rtype == RecordType.QUEUE_REFS:
            qid, pairs = rec.decode_refs(payload)
            refs = array("q", pairs)
            for k in range(5):
                refs[2 * k + 1] = (last + 1 + k) << 1
            payload = rec.encode_refs(qid, refs)
        patched.append((rtype, payload))
    storage.write_checkpoint(tmp_path, last, iter(patched))

    got, recovered = await drain(tmp_path)
    assert sorted(got) == sorted(b"m%d" % i for i in range(5, 20))
    assert recovered.unconfirmed_dropped == 5
    assert "not on disk" in caplog.text
