"""What a follower acknowledges after a failed write of its replica log
(broker/cluster/replica_follower.py, broker/cluster/replica_log.py): only what is on
its disk. No etcd and no sockets: the follower's loop (``follow``) runs against a real
``LeaderSide`` through a stand-in of its peer connection, and the failures (ENOSPC,
EIO) are injected into the follower's log; each fetch records the offset it
acknowledges beside what a copy of the follower's file holds at that moment.

- A snapshot whose install failed is not acknowledged: the follower acknowledges
  what it had before, and the snapshot once a later install succeeded.
- Entries whose sync failed are not acknowledged until a sync succeeds (before, the
  next fetch asked for the offset after them: the leader counted them in its
  majority while they were not on the follower's disk).
- A rewrite whose rename landed but whose folder fsync failed (truncation by epoch,
  a snapshot installed) leaves the log as its file is, to be written again whole
  (before, the log went back to its old entries in memory while the file held the
  new ones: later entries were appended after a gap and lost at the next open).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.cluster import replica_follower, replica_log
from broker.cluster.replica_follower import FollowerState, follow
from broker.cluster.replica_leader import LeaderSide
from broker.cluster.replica_log import Entry, RenamedNotDurable, ReplicaLog
from broker.cluster.replica_ops import snapshot_op

LEADER_EPOCH = 7
#: how long a test waits for the follower to catch up (it takes well under a second)
PATIENCE_S = 10.0


def _pub(i: int) -> dict[str, object]:
    return {"t": "pub", "x": "", "k": "q", "p": {"message_id": f"id-{i}"}, "b": "eA==", "w": time.time()}


def _fold(prefix: list[Entry]) -> dict[str, Any] | None:
    return snapshot_op(prefix, 0.0, max_live_share=1.0)


class Failures:
    """How many of the next writes of one kind fail."""

    def __init__(self) -> None:
        self.rewrites = 0
        self.writes = 0
        self.dir_fsyncs = 0


class FailingLog(ReplicaLog):
    """The follower's log, whose rewrites (before their rename) and appending writes
    fail as many times as the test says."""

    def __init__(self, path: Path, failures: Failures) -> None:
        super().__init__(path)
        self.failures = failures

    def _rewrite(self, data: bytes) -> None:
        if self.failures.rewrites:
            self.failures.rewrites -= 1
            raise OSError(28, "No space left on device (injected)")
        super()._rewrite(data)

    def _write(self, data: bytes) -> None:
        if self.failures.writes:
            self.failures.writes -= 1
            raise OSError(28, "No space left on device (injected)")
        super()._write(data)


@pytest.fixture
def failures(monkeypatch: pytest.MonkeyPatch) -> Iterator[Failures]:
    """Failures to inject; the folder's fsync (after a rewrite's rename) among them."""
    f = Failures()
    real = replica_log._fsync_dir

    def fsync_dir(path: Path) -> None:
        if f.dir_fsyncs:
            f.dir_fsyncs -= 1
            raise OSError(5, "Input/output error (injected)")
        real(path)

    monkeypatch.setattr(replica_log, "_fsync_dir", fsync_dir)
    yield f


def _on_disk(path: Path, tmp: Path) -> list[Entry]:
    """What the follower's file holds now (read from a copy: opening cuts a tail)."""
    copy = tmp / "copy.log"
    copy.unlink(missing_ok=True)
    if path.exists():
        shutil.copyfile(path, copy)
    log = ReplicaLog(copy)
    log.open()
    return log.entries


def _durable_end(entries: list[Entry], leader: list[Entry]) -> int:
    """The offset up to which ``entries`` (a follower's file) hold the leader's log:
    a snapshot stands for everything before it; a divergent entry ends it."""
    mine = {e[1]: e for e in entries}
    theirs = {e[1]: e for e in leader}
    end = 0
    for offset in sorted(mine):
        if offset in theirs and list(mine[offset]) != list(theirs[offset]):
            break
        if offset not in theirs and offset >= leader[0][1]:
            break
        end = offset
    return end


class FakePeer:
    """The follower's connection to the leader: its requests go to ``LeaderSide``
    directly, and each fetch records (offset acknowledged, offset on disk)."""

    side: LeaderSide
    follower_path: Path
    tmp: Path
    acks: list[tuple[int, int]]

    def __init__(self, url: str, **_kw: object) -> None:
        self.url = url

    async def post(self, path: str, body: dict[str, Any], timeout_s: float) -> tuple[int, dict[str, Any]]:
        side = FakePeer.side
        if path.endswith("/epoch-end"):
            return 200, {"end_offset": side.log.end_of_epoch(int(body["epoch"])), "epoch": side.epoch}
        acked = int(body["offset"]) - 1
        durable = _durable_end(_on_disk(FakePeer.follower_path, FakePeer.tmp), side.log.entries)
        FakePeer.acks.append((acked, durable))
        return 200, await side.fetch(str(body["node"]), int(body["epoch"]), int(body["offset"]), 0.02)

    async def aclose(self) -> None:
        pass


async def _leader(tmp: Path, *, compacted: bool) -> LeaderSide:
    """A leader of epoch 7 whose log holds 1..5 of epoch 3, then 6..12 of its own
    (``compacted``: 1..10 folded into a snapshot at 10)."""
    log = ReplicaLog(tmp / "leader.log")
    log.open()
    for i in range(1, 6):
        log.append(3, _pub(i))
    for i in range(6, 13):
        log.append(LEADER_EPOCH, _pub(i))
    await log.sync()
    if compacted:
        assert await log.compact(10, _fold) == 9
    return LeaderSide(
        "q", LEADER_EPOCH, "a", ["a", "b"], log, release=lambda lsns: None, deliverable=lambda seq: None, alive=lambda: True
    )


async def _follow_until_caught_up(side: LeaderSide, follower: ReplicaLog) -> FollowerState:
    state = FollowerState()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: follow("q", "b", "http://leader", LEADER_EPOCH, follower, state, timeout_s=2.0))
        with trio.fail_after(PATIENCE_S):
            while side.acked["b"] < side.log.end_offset:  # (the leader counts it as caught up)
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    return state


@pytest.mark.parametrize(
    "failure",
    [
        "install_rewrite",  # ENOSPC writing the snapshot's .tmp
        "install_dir_fsync",  # the snapshot renamed in, the folder's fsync failed
        "sync_after_install",  # the snapshot installed, the entries after it not written
        "truncate_dir_fsync",  # truncation by epoch renamed in, the folder's fsync failed
        "sync",  # a plain fetch answer not written
    ],
)
def test_a_follower_acknowledges_only_what_is_on_its_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: Failures, failure: str
) -> None:
    monkeypatch.setattr(replica_follower, "PeerConnection", FakePeer)

    async def main() -> None:
        side = await _leader(tmp_path, compacted=failure.startswith(("install", "sync_after")))
        follower_path = tmp_path / "follower.log"
        follower = FailingLog(follower_path, failures)
        follower.open()
        if failure.startswith(("install", "sync_after")):
            for i in range(1, 4):
                follower.append(3, _pub(i))  # behind the leader's snapshot at 10
        else:
            follower.append_entries(side.log.entries[:5])  # the leader's 1..5 of epoch 3
            if failure == "truncate_dir_fsync":
                for i in (6, 7):
                    follower.append(3, _pub(100 + i))  # a tail of epoch 3 the new leader does not have
        await follower.sync()
        FakePeer.side, FakePeer.follower_path, FakePeer.tmp, FakePeer.acks = side, follower_path, tmp_path, []
        if failure == "install_rewrite":
            failures.rewrites = 2
        elif failure in ("install_dir_fsync", "truncate_dir_fsync"):
            failures.dir_fsyncs = 2
        else:
            failures.writes = 2
        await _follow_until_caught_up(side, follower)
        over = [(acked, durable) for acked, durable in FakePeer.acks if acked > durable]
        assert not over, f"acknowledged past what is on disk (acknowledged, on disk): {over}"
        assert failures.rewrites == failures.writes == failures.dir_fsyncs == 0, "not every failure happened"
        assert FakePeer.acks
        assert [list(e) for e in _on_disk(follower_path, tmp_path)] == [list(e) for e in side.log.entries]
        assert [list(e) for e in follower.entries] == [list(e) for e in side.log.entries]

    trio.run(main)


def test_a_failed_install_leaves_the_log_as_its_file_is_and_acknowledges_nothing_new(
    tmp_path: Path, failures: Failures
) -> None:
    """The snapshot's rename landed, the folder's fsync failed: the log holds the
    snapshot as its file does, counts nothing synced, and its next sync writes it
    whole; before it, a failed plain install kept the old entries and their offset."""

    async def main() -> None:
        log = FailingLog(tmp_path / "q.log", failures)
        log.open()
        for i in range(1, 4):
            log.append(3, _pub(i))
        await log.sync()
        snap: Entry = (3, 40, {**(_fold([(3, i, _pub(i)) for i in range(1, 41)]) or {}), "t": "snap", "epochs": [[3, 1]]})
        failures.rewrites = 1
        with pytest.raises(OSError):
            await log.install(snap)
        assert [e[1] for e in log.entries] == [1, 2, 3] and log.synced == 3  # what it had before
        failures.dir_fsyncs = 1
        with pytest.raises(RenamedNotDurable):
            await log.install(snap)
        assert [e[1] for e in log.entries] == [40] == [e[1] for e in _on_disk(log.path, tmp_path)]
        assert log.synced == 0
        failures.rewrites = 1
        with pytest.raises(OSError):
            await replica_follower.durable_end(log)  # the rewrite fails again: nothing to acknowledge
        assert await replica_follower.durable_end(log) == 40 and log.synced == 40
        log.append_entries([(3, 41, _pub(41))])
        assert await log.sync() == 41
        assert [e[1] for e in _on_disk(log.path, tmp_path)] == [40, 41]

    trio.run(main)
