"""Damaged write-ahead logs at process level: corruption before the tail stops the
broker (exit 1, file and offset named) until ``--repair`` salvages the prefix; a torn
tail in the last segment is truncated, logged, and everything before it is served.

The segments are parsed here from the documented format (docs/durability.md, "On-disk
format"), not with the broker's own reader, so a bug there cannot hide itself.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

SEGMENT_HEADER_BYTES = 32
FRAME_HEADER = struct.Struct("<II")  # length (1 + payload), crc32
SEGMENT_MAX_BYTES = 4096
# small segments so the messages span several; no checkpoint deletes any of them
ARGS = (
    "--segment-max-bytes",
    str(SEGMENT_MAX_BYTES),
    "--checkpoint-interval-s",
    "0",
    "--checkpoint-wal-bytes",
    "0",
)
N_MESSAGES = 60
BODY_RE = re.compile(rb"msg-(\d{4})")


def body(i: int) -> str:
    # distinctive and long enough that 60 of them fill several 4 KiB segments
    return f"msg-{i:04d}|" + "x" * 150


@dataclass(frozen=True)
class Frame:
    segment: Path
    offset: int
    size: int
    message: int | None  # the msg-NNNN number in its payload, if any


def frames_of(segment: Path) -> list[Frame]:
    data = segment.read_bytes()
    assert data[:8] == b"ACKBUSWL", segment
    out = []
    offset = SEGMENT_HEADER_BYTES
    while offset + FRAME_HEADER.size <= len(data):
        length, _crc = FRAME_HEADER.unpack_from(data, offset)
        if data.count(0, offset) == len(data) - offset:
            break  # the writer's unused preallocated space (zeros to the end)
        assert length > 0, (segment, offset)
        end = offset + FRAME_HEADER.size + length
        assert end <= len(data), (segment, offset)
        match = BODY_RE.search(data, offset, end)
        out.append(Frame(segment, offset, end - offset, int(match.group(1)) if match else None))
        offset = end
    assert data.count(0, offset) == len(data) - offset, f"trailing bytes in {segment}"
    return out


def segments(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "wal").glob("*.wal"))


def fill_and_crash(broker: BrokerProcess) -> list[Path]:
    """Declare ``q``, publish N_MESSAGES confirmed persistent messages, kill -9."""
    broker.start()
    assert broker.request("PUT", "/queues/q", {})[0] == 201
    for i in range(N_MESSAGES):
        status, reply = broker.request(
            "POST", "/exchanges/amq.default/publish?routing_key=q", body(i).encode()
        )
        assert status == 200 and reply["routed"] == 1, reply
    broker.kill()
    segs = segments(broker.data_dir)
    assert len(segs) >= 3, f"expected several segments, got {segs}"
    return segs


def take_all(broker: BrokerProcess, queue: str = "q") -> list[str]:
    status, reply = broker.request("POST", f"/queues/{queue}/get?max=1000&lease=600")
    assert status == 200, reply
    return [m["body"] for m in reply["messages"]]


def wal_bytes(data_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((data_dir / "wal").iterdir())}


def test_corruption_before_the_tail_stops_the_broker_and_repair_salvages_the_prefix(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir, args=ARGS)
    try:
        segs = fill_and_crash(broker)
        # damage a record in the middle of the second segment: two segments follow it
        victim_segment = segs[1]
        frames = frames_of(victim_segment)
        victim = frames[len(frames) // 2]
        assert victim.message is not None
        raw = bytearray(victim_segment.read_bytes())
        raw[victim.offset + FRAME_HEADER.size + 1 + 20] ^= 0xFF  # a byte of its payload
        victim_segment.write_bytes(bytes(raw))
        expected = [
            body(f.message)
            for seg in segs
            for f in frames_of(seg)
            if f.message is not None and (seg, f.offset) < (victim_segment, victim.offset)
        ]
        assert 0 < len(expected) < N_MESSAGES - 10
        before = wal_bytes(data_dir)

        # 1. without repair: refuse to start, name the file and the offset
        broker.start(wait_ready=False)
        assert broker.proc is not None
        assert broker.proc.wait(timeout=60) == 1
        log = broker.log_tail(5)
        assert "corrupt write-ahead log" in log, log
        assert f"{victim_segment} at byte offset {victim.offset}" in log, log
        assert "--repair" in log, log
        assert wal_bytes(data_dir) == before, "a refused start must leave the log untouched"

        # 2. with --repair: up, serving exactly the records before the damage
        broker.args = (*ARGS, "--repair")
        broker.start()
        _, overview = broker.request("GET", "/overview")
        (truncated,) = overview["recovery"]["truncated"]
        assert f"offset={victim.offset}" in truncated and "repaired=True" in truncated
        names = set((data_dir / "wal").iterdir())
        assert victim_segment.with_name(f"{victim_segment.name}.at-{victim.offset}.dropped") in names
        for later in segs[2:]:
            assert later.with_name(later.name + ".dropped") in names
        assert victim_segment.stat().st_size == victim.offset
        assert take_all(broker) == expected
        status, _ = broker.request("POST", "/exchanges/amq.default/publish?routing_key=q", b"after-repair")
        assert status == 200

        # 3. the repaired log is a normal log: a crash and a start without --repair
        broker.kill()
        broker.args = ARGS
        broker.start()
        assert take_all(broker) == [*expected, "after-repair"]
    finally:
        broker.stop()


def test_torn_tail_is_truncated_and_logged_and_everything_before_it_served(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    broker = BrokerProcess(data_dir, args=ARGS)
    try:
        segs = fill_and_crash(broker)
        last = segs[-1]
        frames = frames_of(last)
        torn = frames[-1]
        assert torn.message == N_MESSAGES - 1
        # a crash in the middle of writing the last record: half of it reached the disk
        with open(last, "r+b") as file:
            file.truncate(torn.offset + torn.size // 2)

        broker.start()
        log = broker.log_path.read_text()
        assert re.search(
            rf"WAL torn tail: truncating {re.escape(str(last))} at offset {torn.offset}, "
            rf"dropping {torn.size // 2} bytes",
            log,
        ), broker.log_tail()
        _, overview = broker.request("GET", "/overview")
        (truncated,) = overview["recovery"]["truncated"]
        assert f"offset={torn.offset}" in truncated
        assert last.stat().st_size == torn.offset
        assert take_all(broker) == [body(i) for i in range(N_MESSAGES - 1)]
    finally:
        broker.stop()
