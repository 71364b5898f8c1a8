"""A replica log removed while a rewrite of it runs in a worker thread
(broker/cluster/replica_log.py, broker/cluster/replication.py), and a rewrite that an
append interleaves with. No etcd: the log is driven alone, and the replication
manager through a stand-in of its node; the rewrite is held in its thread by an
event, so each race happens every time, not now and then.

- Removal (the queue deleted, this node out of its replica set) waits for the
  rewrite, and nothing written later brings the file back: no ``.log`` and no
  ``.tmp`` remain, and a new log of the same name starts empty (before, the rename
  recreated the deleted queue's file, and a new quorum queue of that name took its
  entries for its own).
- A snapshot installed while this node, become leader, appends keeps the append.
- The leader's sync loop meeting its removed log ends quietly (no error logged).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio
import trio.testing

from broker.cluster.replica_log import (
    Entry,
    ReplicaLog,
    ReplicaLogRemoved,
    replica_log_path,
)
from broker.cluster.replica_ops import snapshot_op
from broker.cluster.replica_state import QueueReplica
from broker.cluster.replication import Replication

#: how long a test waits for a thread it holds (it is released long before)
PATIENCE_S = 10.0


def _pub(i: int) -> dict[str, object]:
    return {"t": "pub", "x": "", "k": "q", "p": {"message_id": f"id-{i}"}, "b": "eA==", "w": time.time()}


class HeldRewrite(ReplicaLog):
    """A replica log whose rewrites wait, in their worker thread, for the test to
    release them (the rest is the real log)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.entered = threading.Event()
        self.release = threading.Event()

    def _rewrite(self, data: bytes) -> None:
        self.entered.set()
        if not self.release.wait(PATIENCE_S):
            raise OSError("the test never released the rewrite")
        super()._rewrite(data)

    async def wait_entered(self) -> None:
        assert await trio.to_thread.run_sync(self.entered.wait, PATIENCE_S), "no rewrite began"


async def _filled(path: Path, count: int) -> HeldRewrite:
    log = HeldRewrite(path)
    log.open()
    for i in range(1, count + 1):
        log.append(3, _pub(i))
    assert await log.sync() == count
    return log


def _fold(prefix: list[Entry]) -> dict[str, Any] | None:
    """A snapshot of ``prefix`` whatever its share of live messages."""
    return snapshot_op(prefix, 0.0, max_live_share=1.0)


def _starts_empty(path: Path) -> None:
    fresh = ReplicaLog(path)
    fresh.open()
    assert fresh.entries == [] and fresh.end_offset == 0


def _replication(data_dir: Path) -> Replication:
    """The replication manager of a node whose etcd view holds no quorum queue (each
    it has a replica of was deleted), past its first round (the start's sweep)."""
    node = SimpleNamespace(
        name="a",
        runtime=SimpleNamespace(core=None),
        config=SimpleNamespace(lease_ttl_s=2),
        synced=True,
        view=SimpleNamespace(entries={"queues": {}}),
    )
    replication = Replication(cast(Any, node), data_dir)
    replication._swept = True
    return replication


@pytest.mark.parametrize("rewrite", ["truncate", "install", "compact"])
def test_a_deleted_queue_leaves_no_log_even_when_its_follower_was_rewriting_it(tmp_path: Path, rewrite: str) -> None:
    path = replica_log_path(tmp_path, "q")

    async def main() -> None:
        log = await _filled(path, 6)
        replication = _replication(tmp_path)
        replica = replication.queues["q"] = QueueReplica("q", log)
        snap: Entry = (3, 40, {**(_fold(log.entries) or {}), "t": "snap", "epochs": [[3, 1]]})
        async with trio.open_nursery() as nursery:
            scope = replica.follow_scope = trio.CancelScope()

            async def follower() -> None:  # the follower's task, in a rewrite of the log
                with scope:
                    if rewrite == "truncate":
                        await log.truncate_after(2)
                    elif rewrite == "install":
                        await log.install(snap)
                    else:
                        await log.compact(5, _fold)

            nursery.start_soon(follower)
            await log.wait_entered()
            nursery.start_soon(replication.reconcile)  # the queue is gone from etcd
            await trio.testing.wait_all_tasks_blocked()
            log.release.set()
        assert "q" not in replication.queues and log.removed
        _starts_empty(path)  # a new quorum queue of the same name takes nothing of the old one
        assert not path.exists(), "the rewrite brought the deleted queue's log back"
        assert list(path.parent.iterdir()) == []  # (no .tmp either)

    trio.run(main)


def test_a_write_queued_behind_the_removal_is_refused_and_creates_no_file(tmp_path: Path) -> None:
    """The leader's sync loop (or a follower's next step) asks for the lock after the
    removal did: the removed log refuses it, rather than open the file anew."""
    path = tmp_path / "q.log"

    async def main() -> None:
        log = await _filled(path, 6)
        log.append(3, _pub(7))  # appended, not yet written
        refused: list[BaseException] = []

        async def sync() -> None:
            try:
                await log.sync()
            except ReplicaLogRemoved as exc:
                refused.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(log.compact, 5, _fold)
            await log.wait_entered()
            nursery.start_soon(log.remove)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(sync)
            await trio.testing.wait_all_tasks_blocked()
            log.release.set()
        assert len(refused) == 1 and isinstance(refused[0], OSError)
        for later in (log.sync(), log.truncate_after(0), log.compact(5, lambda p: None), log.install((3, 9, {"t": "snap"}))):
            with pytest.raises(ReplicaLogRemoved):
                await later
        assert not path.exists() and not log.tmp_path.exists()
        _starts_empty(path)

    trio.run(main)


def test_a_rewrite_that_failed_leaves_no_tmp_and_the_log_as_it_was(tmp_path: Path) -> None:
    """The rename fails (here: the file's name is taken by a folder): the ``.tmp`` is
    removed, and the truncation is undone in memory too (the file was not
    truncated: appending after the kept entries would leave a gap in the file)."""
    path = tmp_path / "q.log"

    async def main() -> None:
        log = ReplicaLog(path)
        log.open()
        for i in range(1, 6):
            log.append(3, _pub(i))
        await log.sync()
        before = list(log.entries)
        log._close_file()
        path.unlink()
        path.mkdir()  # in the way of the rename
        (path / "x").touch()
        with pytest.raises(OSError):
            await log.truncate_after(2)
        assert not path.with_suffix(".tmp").exists()
        assert log.entries == before and log.synced == 5

    trio.run(main)


def test_an_entry_appended_while_a_snapshot_is_installed_follows_it(tmp_path: Path) -> None:
    """This node's follower installs the leader's snapshot; meanwhile the node wins
    the election and appends its ``lead`` entry (the follower's task is cancelled,
    its rewrite's thread runs on). The entry follows the snapshot in memory and on
    disk (before, the install dropped it, numbered after the old entries)."""
    path = tmp_path / "q.log"

    async def main() -> None:
        log = await _filled(path, 3)
        snap: Entry = (3, 10, {**(_fold(log.entries) or {}), "t": "snap", "epochs": [[3, 1]]})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(log.install, snap)
            await log.wait_entered()
            offset = log.append(7, {"t": "lead", "node": "a"})  # the new leader's first entry
            log.release.set()
        assert offset == 11
        assert [e[1] for e in log.entries] == [10, 11] and log.entries[-1][2]["t"] == "lead"
        assert log.synced == 10  # the lead entry is not on disk yet
        assert await log.sync() == 11
        reopened = ReplicaLog(path)
        reopened.open()
        assert [list(e) for e in reopened.entries] == [list(e) for e in log.entries]
        assert reopened.epoch_starts == {3: 1, 7: 11}

    trio.run(main)


def test_the_leaders_sync_loop_ends_quietly_when_its_log_was_removed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The queue is deleted while its leader's sync loop waits for appends: the loop's
    next sync meets the removed log. Not a failed write: no error is logged, and the
    loop ends (before, it logged "replica log write failed" and tried again every
    half second)."""
    from broker.cluster.replica_leader import LeaderSide

    async def main() -> None:
        log = ReplicaLog(tmp_path / "q.log")
        log.open()
        side = LeaderSide(
            "q", 3, "a", ["a", "b"], log, release=lambda lsns: None, deliverable=lambda seq: None, alive=lambda: True
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(side.serve_sync)
            side.appended(log.append(3, _pub(1)), 0)
            with trio.fail_after(PATIENCE_S):
                while log.synced < 1:
                    await trio.sleep(0.01)
            await log.remove()
            side.appended(log.append(3, _pub(2)), 0)  # (an append racing the removal)
            with trio.fail_after(PATIENCE_S):  # the loop ends by itself
                while nursery.child_tasks:
                    await trio.sleep(0.01)
        assert not side.stopped  # (it ended for the removal, not for a step down)
        errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert errors == [], [r.getMessage() for r in errors]

    with caplog.at_level(logging.DEBUG, logger="ackbus.cluster"):
        trio.run(main)
