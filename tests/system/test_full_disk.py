"""A real full disk: a broker whose data directory is on a small tmpfs fills it, refuses
publishes with a reason (and loses nothing it confirmed), gets itself out once the
queue is drained — without a restart, and after a ``kill -9`` on the full disk.

Mounting a tmpfs needs root (CAP_SYS_ADMIN); where it is not allowed the test is
skipped, saying so. The fault-injected ENOSPC tests (tests/storage,
tests/system/test_storage_failure.py) cover every write site without a mount.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

DISK_BYTES = 12 * 1024 * 1024
RESERVE_BYTES = 2 * 1024 * 1024
BODY = b"x" * 16_000  # a 12 MiB disk fills in ~650 publishes (one HTTP request each)
ARGS = (
    "--segment-max-bytes", str(256 * 1024),
    "--checkpoint-wal-bytes", str(1024 * 1024),
    "--checkpoint-interval-s", "0.5",
    "--reserve-bytes", str(RESERVE_BYTES),
)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount)],
        capture_output=True, text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def publish(broker: BrokerProcess, body: bytes = BODY) -> tuple[int, dict]:
    return broker.request("POST", "/exchanges/amq.default/publish?routing_key=q", body, timeout_s=30)


def fill(broker: BrokerProcess) -> tuple[int, dict]:
    """Publish until the broker refuses; return how many it confirmed and its refusal."""
    confirmed = 0
    for _ in range(10_000):
        status, body = publish(broker)
        if status != 200:
            return confirmed, body
        confirmed += 1
    raise AssertionError("a 12 MiB disk took 40 MB of messages")


def drain(broker: BrokerProcess, within_s: float = 60.0) -> int:
    """Take and ack every message, as a client would: an ack answered 503 (the log
    cannot take its record yet) is tried again a little later."""
    taken = 0
    deadline = time.monotonic() + within_s
    while True:
        status, got = broker.request("POST", "/queues/q/get?max=500&lease=60")
        assert status == 200, got
        if not got["messages"]:
            return taken
        lease_ids = [m["lease_id"] for m in got["messages"]]
        while True:
            status, acked = broker.request("POST", "/queues/q/ack", {"lease_ids": lease_ids})
            if status == 200:
                break
            assert status == 503 and acked["error"] == "storage_failed", acked
            assert time.monotonic() < deadline, f"acks still refused after {within_s} s: {acked}"
            time.sleep(0.2)
        taken += len(got["messages"])


def publish_again(broker: BrokerProcess, within_s: float = 30.0) -> None:
    """The broker takes publishes again once it has made room (a checkpoint)."""
    deadline = time.monotonic() + within_s
    while True:
        status, body = publish(broker, b"after")
        if status == 200:
            return
        assert time.monotonic() < deadline, f"still refusing {within_s} s after the drain: {body}"
        time.sleep(0.2)


def test_fill_refuse_drain_accept_without_and_after_a_restart(small_disk: Path) -> None:
    broker = BrokerProcess(small_disk / "data", args=ARGS)
    broker.start()
    try:
        assert broker.request("PUT", "/queues/q", {})[0] == 201
        confirmed, refusal = fill(broker)
        assert confirmed > 100
        assert refusal["confirm"] == "nack", refusal
        assert "No space left" in refusal["reason"] or "disk full" in refusal["reason"], refusal
        status, health = broker.request("GET", "/healthz")
        assert status == 200, health  # alive, and saying why it refuses
        assert health["storage_ok"] is False or "disk full" in health.get("publishes_refused", ""), health
        assert drain(broker) == confirmed  # every confirmed message is there
        publish_again(broker)

        # full again, then killed on the full disk: it starts, keeps everything it
        # confirmed, and gets out once drained
        confirmed, refusal = fill(broker)
        assert confirmed > 100, refusal
        broker.kill()
        broker.start()
        assert drain(broker) == confirmed + 1  # (+ the "after" message of the first round)
        publish_again(broker)
    finally:
        broker.stop()


def test_a_drained_full_disk_takes_publishes_again_within_seconds_without_a_timed_checkpoint(
    small_disk: Path,
) -> None:
    """With the default checkpoint schedule (every 300 s, or 256 MiB of log), a full
    disk drained by its consumers is freed at once: while the reserve is used up, a
    checkpoint runs as soon as settles were logged, so publishes are taken again
    within 10 s of the drain, not at the next timed checkpoint."""
    args = (
        "--segment-max-bytes", str(256 * 1024),
        "--reserve-bytes", str(RESERVE_BYTES),
    )
    broker = BrokerProcess(small_disk / "data", args=args)
    broker.start()
    try:
        assert broker.request("PUT", "/queues/q", {})[0] == 201
        confirmed, refusal = fill(broker)
        assert confirmed > 100, refusal
        assert drain(broker) == confirmed
        publish_again(broker, within_s=10.0)
    finally:
        broker.stop()
