"""Disk use stays bounded under a steady publish/consume/ack workload.

With small checkpoint thresholds, the data directory must hover around live data plus
the configured slack while many times that much is written to the log: checkpoints are
taken, the segments they cover are deleted, and old checkpoints go too.

The bound is derived from the settings (docs/durability.md, "Checkpoints and disk
use"): the WAL holds at most ``checkpoint_wal_bytes`` plus what is written between two
trigger checks and while a checkpoint is written (measured here from the broker's own
counters and log, not guessed), plus the segment that holds the checkpoint's LSN and
the active one; the checkpoint directory holds at most two checkpoints of the live
data, which this workload keeps below one batch of messages.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.rawchannel import RawChannel

pytestmark = pytest.mark.slow

SEGMENT_MAX_BYTES = 8 * 1024
CHECKPOINT_WAL_BYTES = 32 * 1024
CHECKPOINT_INTERVAL_S = 0.25
# The checkpoint task looks at its triggers every min(1 s, checkpoint_interval_s).
TRIGGER_CHECK_S = min(1.0, CHECKPOINT_INTERVAL_S)
ARGS = (
    "--segment-max-bytes",
    str(SEGMENT_MAX_BYTES),
    "--checkpoint-wal-bytes",
    str(CHECKPOINT_WAL_BYTES),
    "--checkpoint-interval-s",
    str(CHECKPOINT_INTERVAL_S),
    # The space reserve is one fixed, preallocated file (its own tests are in
    # tests/storage/test_storage_reserve.py); this test bounds the log's growth.
    "--reserve-bytes",
    "0",
)
RUN_S = 4.0
# The load runs in rounds of RUN_S until the log has written well past the bound (the
# test proves nothing before that), at most this long: on a loaded machine fewer bytes
# are written in a round and checkpoints take longer (a larger bound), so one round
# may not be enough.
MAX_RUN_S = 30.0
SAMPLE_S = 0.02
BATCH = 100
BODY = "b" * 200
# A checkpoint record of one message: frame header + ENQUEUE fields (about 60 bytes
# here) + body, generously.
CHECKPOINT_BYTES_PER_MESSAGE = len(BODY) + 128
CHECKPOINT_FIXED_BYTES = 4096  # header, trailer, queue declaration, META


@dataclass
class Sample:
    t: float
    disk_bytes: int
    wal_bytes_written: int
    segments: frozenset[str]
    checkpoints: frozenset[str]


def data_dir_usage(data_dir: Path) -> tuple[int, frozenset[str], frozenset[str]]:
    total = 0
    segments: set[str] = set()
    checkpoints: set[str] = set()
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue  # deleted between the listing and the stat
            if name.endswith(".wal"):
                segments.add(name)
            elif name.endswith(".ckpt"):
                checkpoints.add(name)
    return total, frozenset(segments), frozenset(checkpoints)


class Sampler(threading.Thread):
    def __init__(self, broker: BrokerProcess) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.stop = threading.Event()
        self.samples: list[Sample] = []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                t = time.monotonic()
                disk, segments, checkpoints = data_dir_usage(self.broker.data_dir)
                _, overview = self.broker.request("GET", "/overview")
                written = overview["storage"]["wal_bytes_written"]
                self.samples.append(Sample(t, disk, written, segments, checkpoints))
                time.sleep(SAMPLE_S)  # the sampling interval
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)


def publish_consume_ack_loop(broker: BrokerProcess, run_s: float) -> int:
    """Lockstep batches on one channel: publish BATCH, await their confirms and
    deliveries, ack them all. At most one batch is live at any moment."""
    ch = RawChannel(broker.port)
    try:
        ch.send({"op": "consume", "queue": "steady", "prefetch": BATCH})
        published = 0
        deadline = time.monotonic() + run_s
        while time.monotonic() < deadline:
            ch.send(*[{"op": "publish", "routing_key": "steady", "body": BODY}] * BATCH)
            published += BATCH
            confirmed = False
            delivered: list[int] = []
            while not confirmed or len(delivered) < BATCH:
                ev = ch.next_event()
                if ev["ev"] == "ack" and ev["delivery_tag"] >= published:
                    confirmed = True
                elif ev["ev"] == "nack":
                    raise AssertionError(f"publish nacked: {ev}")
                elif ev["ev"] == "deliver":
                    delivered.append(ev["delivery_tag"])
            ch.send({"op": "ack", "delivery_tag": max(delivered), "multiple": True})
        return published
    finally:
        ch.close()


def max_growth(samples: list[Sample], window_s: float) -> int:
    """The most WAL bytes written within any span of ``window_s`` (rounded up to the
    sample spacing, so this over-estimates)."""
    best = 0
    j = 0
    for i, s in enumerate(samples):
        j = max(j, i)
        while j + 1 < len(samples) and samples[j].t - s.t < window_s:
            j += 1
        best = max(best, samples[j].wal_bytes_written - s.wal_bytes_written)
    return best


def disk_bound(samples: list[Sample], log_text: str) -> int:
    """The most the data directory may hold (docs/durability.md), from the settings, the
    WAL bytes the samples saw written and the longest checkpoint the broker logged."""
    durations = [float(d) for d in re.findall(r"checkpoint written lsn=\d+ duration_s=([\d.]+)", log_text)]
    longest_checkpoint_s = max(durations, default=0.0)
    # Between the last completed checkpoint's LSN and the next checkpoint's release the
    # WAL takes: one trigger-check period, plus the writing of up to two checkpoints
    # (the one that just ended and the next one), measured.
    window_s = TRIGGER_CHECK_S + 2 * longest_checkpoint_s + 2 * SAMPLE_S
    live_bytes = BATCH * CHECKPOINT_BYTES_PER_MESSAGE + CHECKPOINT_FIXED_BYTES
    return (
        CHECKPOINT_WAL_BYTES  # the size trigger's slack
        + max_growth(samples, window_s)  # written before the trigger is seen and during checkpoints
        + 2 * SEGMENT_MAX_BYTES  # the segment holding the checkpoint LSN, the active one
        + 2 * live_bytes  # old and new checkpoint while one is written
    )


def wal_written(samples: list[Sample]) -> int:
    return samples[-1].wal_bytes_written - samples[0].wal_bytes_written if samples else 0


def test_disk_use_stays_bounded_under_steady_publish_and_ack(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", args=ARGS)
    broker.start()
    sampler = Sampler(broker)
    try:
        assert broker.request("PUT", "/queues/steady", {})[0] == 201
        sampler.start()
        published = 0
        started = time.monotonic()
        while True:  # rounds until the log wrote well past the bound (see MAX_RUN_S)
            published += publish_consume_ack_loop(broker, RUN_S)
            so_far = list(sampler.samples)
            if wal_written(so_far) > 4 * disk_bound(so_far, broker.log_path.read_text()):  # (headroom over 3)
                break
            if time.monotonic() - started + RUN_S > MAX_RUN_S:
                break
        sampler.stop.set()
        sampler.join(timeout=30)
        _, overview = broker.request("GET", "/overview")
        _, queue = broker.request("GET", "/queues/steady")
    finally:
        sampler.stop.set()
        broker.stop()

    assert not sampler.errors, sampler.errors
    samples = sampler.samples
    assert len(samples) > 20
    assert queue["messages"] == 0 and queue["message_stats"]["acked"] == published

    assert overview["storage"]["checkpoints"] >= 5, overview["storage"]
    bound = disk_bound(samples, broker.log_path.read_text())
    written = wal_written(samples)
    peak = max(s.disk_bytes for s in samples)
    # The test means something only if an unbounded log would blow through the bound.
    assert written > 3 * bound, f"wrote only {written} bytes for a bound of {bound}"
    assert peak <= bound, f"data directory reached {peak} bytes, bound {bound} (WAL written: {written})"

    # old segments and checkpoints really are deleted, not just left behind
    first, last = samples[0], samples[-1]
    assert not first.segments & last.segments, (first.segments, last.segments)
    assert len(set().union(*(s.segments for s in samples))) >= written // SEGMENT_MAX_BYTES // 2
    assert not first.checkpoints & last.checkpoints or not first.checkpoints
    assert len(last.checkpoints) <= 1
