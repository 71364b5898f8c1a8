"""A backlog whose bodies live only in the WAL segments survives kill -9 and checkpoints.

The broker keeps 16 ready messages a queue in memory (``--queue-memory-messages``);
the rest of a backlog is paged out: the queue indexes each message by the LSN of its
ENQUEUE record, and checkpoints refer to those records instead of copying bodies, so
the segments holding them must outlive the checkpoints that cover them. Small segments
and frequent checkpoints make that happen many times over in a few thousand messages.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.load import Consumer, Publisher
from tests.support.rawchannel import RawChannel, publish_confirmed

pytestmark = pytest.mark.slow

ARGS = (
    "--queue-memory-messages",
    "16",
    "--segment-max-bytes",
    "32768",
    "--checkpoint-wal-bytes",
    "65536",
    "--checkpoint-interval-s",
    "0.2",
)
COUNT = 3000
PAD = "x" * 80


def body(i: int) -> str:
    return f"m{i:05d}|{PAD}"


def publish(broker: BrokerProcess, queue: str, first: int, count: int) -> None:
    """Publish ``count`` messages with confirms; every one must be acked."""
    publish_confirmed(broker.port, queue, [body(first + i) for i in range(count)])


def consume_and_ack(broker: BrokerProcess, queue: str, count: int) -> list[str]:
    """Consume ``count`` messages with manual acks; return their bodies in order, once
    the broker has taken every one of those acks."""
    acked_before = broker.request("GET", f"/queues/{queue}")[1]["message_stats"]["acked"]
    ch = RawChannel(broker.port)
    got: list[str] = []
    try:
        ch.send({"op": "consume", "queue": queue, "prefetch": 100})
        while len(got) < count:
            ev = ch.next_event()
            if ev["ev"] != "deliver":
                continue
            got.append(ev["message"]["body"])
            ch.send({"op": "ack", "delivery_tag": ev["delivery_tag"]})
        # the acks are sent; wait until the broker has taken them all (counted by the
        # queue: with more backlog than ``count``, the consumer is still being sent a
        # prefetch of messages, so "nothing unacked" would never come)
        deadline = time.monotonic() + 30
        while True:
            status, info = broker.request("GET", f"/queues/{queue}")
            if info["message_stats"]["acked"] >= acked_before + count and info["consumers"] == 1:
                break
            assert time.monotonic() < deadline, f"the broker did not take {count} acks within 30 s: {info}"
            time.sleep(0.02)
    finally:
        ch.close()
    return got


def overview(broker: BrokerProcess) -> dict:
    status, info = broker.request("GET", "/overview")
    assert status == 200
    return info


def wait_for_checkpoint_after(broker: BrokerProcess, lsn: int) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = overview(broker)
        if info["storage"]["last_checkpoint_lsn"] >= lsn:
            return info
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint covered LSN {lsn} within 30 s")


def wal_segments(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "wal").glob("*.wal"))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker with small segments, frequent checkpoints and 16 messages a queue in
    memory, and a durable queue "deep"; stopped after the test."""
    proc = BrokerProcess(tmp_path / "data", args=ARGS)
    proc.start()
    try:
        assert proc.request("PUT", "/queues/deep", {})[0] == 201
        yield proc
    finally:
        proc.stop()


def test_paged_out_backlog_survives_checkpoints_and_kill9(broker: BrokerProcess) -> None:
    publish(broker, "deep", 0, COUNT)
    info = overview(broker)
    # all but the in-memory head are paged out once their records are written
    assert info["storage"]["messages_paged_out"] >= COUNT - 16 - 500, info["storage"]
    info = wait_for_checkpoint_after(broker, info["storage"]["last_lsn"])
    # the checkpoint covers every segment, and still keeps those holding bodies
    assert info["storage"]["segments_kept"] >= 5, info["storage"]

    # part of the backlog is consumed: paged back in, in order, bodies intact
    first = consume_and_ack(broker, "deep", 1000)
    assert first == [body(i) for i in range(1000)]
    publish(broker, "deep", COUNT, 200)  # more after the consumed part
    broker.kill()
    broker.start()

    info = overview(broker)
    assert info["recovery"]["messages"] >= COUNT - 1000 + 200 - 100  # up to a prefetch of acks lazily synced
    left = [m["body"] for m in broker.drain("deep")]
    expected = [body(i) for i in range(1000, COUNT + 200)]
    # acks are synced lazily: a few acked messages may come back, never an unacked one lost
    assert left[-len(expected):] == expected, "paged-out messages lost or out of order after kill -9"
    assert set(left[: len(left) - len(expected)]) <= set(first), "a message nobody published"


def test_segments_are_released_once_their_messages_are_consumed(broker: BrokerProcess) -> None:
    data_dir = broker.data_dir
    publish(broker, "deep", 0, COUNT)
    info = wait_for_checkpoint_after(broker, overview(broker)["storage"]["last_lsn"])
    kept = info["storage"]["segments_kept"]
    assert kept >= 5 and len(wal_segments(data_dir)) >= kept
    got = consume_and_ack(broker, "deep", COUNT)
    assert got == [body(i) for i in range(COUNT)]
    lsn = overview(broker)["storage"]["last_lsn"]
    # a checkpoint after the consumer took everything keeps no segment
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = wait_for_checkpoint_after(broker, lsn)
        if info["storage"]["segments_kept"] == 0:
            break
        lsn = info["storage"]["last_lsn"]
    assert info["storage"]["segments_kept"] == 0, info["storage"]
    # what is left is the log since that checkpoint: a few small segments at most
    assert len(wal_segments(data_dir)) <= 3, wal_segments(data_dir)
    broker.kill()
    broker.start()
    # every ack was applied before that checkpoint: nothing comes back
    assert broker.drain("deep") == []


def test_compaction_frees_a_segment_pinned_by_one_old_message(broker: BrokerProcess) -> None:
    data_dir = broker.data_dir
    assert broker.request("PUT", "/queues/old", {})[0] == 201
    # the keeper's record lands in the first segment, among 100 records that will
    # be consumed (one batch of 100 fits a segment; the next batch starts a new one)
    publish(broker, "deep", 1, 100)
    publish(broker, "old", 0, 1)
    first_segment = wal_segments(data_dir)[0]
    publish(broker, "deep", 101, COUNT - 100)
    assert consume_and_ack(broker, "deep", COUNT) == [body(i) for i in range(1, COUNT + 1)]
    # checkpoints find the first segment holding one live message among many
    # settled ones, log the keeper again, and a later checkpoint deletes the segment
    deadline = time.monotonic() + 30
    while first_segment.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    info = overview(broker)
    assert not first_segment.exists(), (info["storage"], broker.log_tail(30))
    assert info["storage"]["segments_compacted"] >= 1
    assert len(wal_segments(data_dir)) <= 4, wal_segments(data_dir)
    broker.kill()
    broker.start()
    assert [m["body"] for m in broker.drain("old")] == [body(0)]
    # every ack was applied before the checkpoint that deleted the segment
    assert broker.drain("deep") == []


def test_damaged_kept_segment_stops_the_start_and_repair_reports_each_lost_message(broker: BrokerProcess) -> None:
    data_dir = broker.data_dir
    publish(broker, "deep", 0, COUNT)
    assert broker.terminate() == 0  # the final checkpoint covers every segment
    segs = wal_segments(data_dir)
    assert len(segs) >= 5
    victim = segs[len(segs) // 2]
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # inside some message's record
    victim.write_bytes(bytes(raw))

    # 1. a segment kept for queued messages is part of the log: refuse to start
    broker.start(wait_ready=False)
    assert broker.proc is not None
    assert broker.proc.wait(timeout=60) == 1
    log = broker.log_tail(5)
    assert "corrupt write-ahead log" in log and str(victim) in log and "--repair" in log, log

    # 2. with --repair it starts; each message it cannot read is reported, the rest served
    broker.args = (*ARGS, "--repair")
    broker.start()
    got = [m["body"] for m in broker.drain("deep")]
    status, metrics = broker.request("GET", "/metrics")
    assert status == 200
    log = broker.log_tail(2000)
    lost = COUNT - len(got)
    assert 0 < lost < COUNT // 2
    assert got == sorted(got) and set(got) < {body(i) for i in range(COUNT)}
    assert log.count("message lost: its record cannot be read back from the log") == lost
    assert f"ackbus_messages_lost_total {lost}" in metrics.decode()


def test_kill9_with_a_paged_backlog_beside_a_busy_queue_loses_and_duplicates_nothing(
    broker: BrokerProcess,
    seeded_random: random.Random,
) -> None:
    """A queue nobody consumes ("keep", paged out) gets a quarter of the publishes, one
    that is consumed ("deep") the rest: every segment holds both, checkpoints come every
    few hundred milliseconds, and kill -9 lands at random moments of that."""
    assert broker.request("PUT", "/queues/keep", {})[0] == 201
    stop = threading.Event()
    keepers = [Publisher(broker, 0, "keep", stop)]
    workers = [Publisher(broker, pid, "deep", stop) for pid in (1, 2, 3)]
    consumer = Consumer(broker, "deep", stop)
    for t in (*keepers, *workers, consumer):
        t.start()
    rng = seeded_random
    for _ in range(4):
        time.sleep(rng.uniform(0.8, 1.6))  # pacing: the kill lands at a random moment
        broker.kill()
        broker.start()
    time.sleep(0.5)  # pacing: some load after the last restart too
    stop.set()
    for t in (*keepers, *workers, consumer):
        t.join(timeout=30)
    broker.kill()
    broker.start()
    kept = [m["body"] for m in broker.drain("keep")]
    deep_left = [m["body"] for m in broker.drain("deep")]

    assert not [e for p in (*keepers, *workers) for e in p.errors]
    acked_keep = keepers[0].acked
    assert len(acked_keep) > 200
    assert not acked_keep - set(kept), f"{len(acked_keep - set(kept))} confirmed messages lost"
    assert len(kept) == len(set(kept)), "a message came back twice"
    assert kept == sorted(kept, key=lambda mid: int(mid.split("-")[1])), "out of order"
    assert set(kept) <= keepers[0].attempted
    acked_deep = set().union(*(p.acked for p in workers))
    assert not acked_deep - set(consumer.acked) - set(deep_left)


def test_failed_reads_of_paged_out_messages_lose_nothing(tmp_path: Path) -> None:
    """Reading messages back fails (EMFILE on open, EIO on read): before, every message
    whose read failed was dropped for good ("message lost"). Now each keeps its place,
    the queue waits and retries, /metrics counts the failures, and all come back in
    order."""
    broker = BrokerProcess(
        tmp_path / "data",
        args=[*ARGS],
        env={"ACKBUS_FAULTS": "reader.open_emfile:3,reader.read_error@2:2"},
    )
    with broker:
        assert broker.request("PUT", "/queues/deep", {})[0] == 201
        publish(broker, "deep", 0, COUNT)
        broker.kill()
        broker.start()
        got: list[str] = []
        deadline = time.monotonic() + 60
        while len(got) < COUNT and time.monotonic() < deadline:
            status, reply = broker.request("POST", "/queues/deep/get?max=500&wait=2&lease=600")
            assert status == 200, reply
            got.extend(m["body"] for m in reply["messages"])
        status, metrics = broker.request("GET", "/metrics")
        text = metrics.decode()
    assert got == [body(i) for i in range(COUNT)]
    assert "ackbus_messages_lost_total 0" in text
    failures = [line for line in text.splitlines() if line.startswith("ackbus_log_read_failures_total ")]
    assert failures and float(failures[0].split()[1]) >= 1, failures
