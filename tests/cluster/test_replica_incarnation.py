"""A quorum queue deleted and declared again (same name) between two rounds of
``Replication.reconcile`` (broker/cluster/replication.py, broker/cluster/view.py).
No etcd: the node's view is fed watch batches and range reads as etcd would send
them, and the replication manager runs against a stand-in of its node.

Reconcile never sees the queue missing, yet the definition's key was created anew
(etcd's ``create_revision``): the old replica is forgotten (its log removed, file
and all) and the new queue starts with an empty log. Before, the new queue kept the
deleted one's log: a new leader would have served its messages. The same holds
across a restart of the node (the queue deleted and declared again while it was
down): the incarnation is kept beside the log.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import trio

from broker.cluster.etcdproto import KeyValue, WatchBatch, WatchEvent
from broker.cluster.replica_log import ReplicaLog, replica_log_path
from broker.cluster.replication import Replication
from broker.cluster.view import ClusterKeys, ClusterView, canonical

KEYS = ClusterKeys("t")
KEY = KEYS.meta("queues", "q")
DEFINITION = {"name": "q", "durable": True, "arguments": {"x-queue-type": "quorum"}, "replicas": ["a", "b", "c"], "owner": "a"}


def _put(revision: int, created: int, d: dict[str, Any] = DEFINITION) -> WatchEvent:
    return WatchEvent(False, KeyValue(KEY, canonical(d), created, revision, revision - created + 1, 0))


def _delete(revision: int) -> WatchEvent:
    return WatchEvent(True, KeyValue(KEY, b"", 0, revision, 0, 0))


def _replication(view: ClusterView, data_dir: Path) -> Replication:
    """Node ``a``'s replication manager; no leader and no in-sync set in its view, so
    a round opens each replica's log and goes no further (no election, no follower)."""
    node = SimpleNamespace(
        name="a",
        runtime=SimpleNamespace(core=SimpleNamespace(queues={})),
        config=SimpleNamespace(lease_ttl_s=2),
        synced=True,
        view=view,
        membership=SimpleNamespace(registered=True),
    )
    replication = Replication(cast(Any, node), data_dir)
    replication._swept = True
    return replication


def _pub(i: int) -> dict[str, object]:
    return {"t": "pub", "x": "", "k": "q", "p": {"message_id": f"old-{i}"}, "b": "eA==", "w": time.time()}


@pytest.mark.parametrize("how", ["one_batch", "two_batches", "range_read"])
def test_a_queue_declared_again_between_two_rounds_starts_with_an_empty_log(tmp_path: Path, how: str) -> None:
    async def main() -> None:
        view = ClusterView(KEYS)
        view.apply(WatchBatch(10, [_put(10, 10)]))
        replication = _replication(view, tmp_path)
        await replication.reconcile()
        old = replication.queues["q"]
        for i in range(1, 4):
            old.log.append(3, _pub(i))  # the deleted queue's messages, on disk
        await old.log.sync()
        # deleted and declared again (the same definition) before the next round
        if how == "one_batch":
            view.apply(WatchBatch(21, [_delete(20), _put(21, 21)]))
        elif how == "two_batches":
            view.apply(WatchBatch(20, [_delete(20)]))
            view.apply(WatchBatch(21, [_put(21, 21)]))
        else:  # a watch gap: the view is read afresh, its value unchanged
            assert view.reset(21, [_put(21, 21).kv]) == []
        await replication.reconcile()
        new = replication.queues["q"]
        assert new is not old and old.log.removed
        assert new.log.entries == [] and new.log.end_offset == 0
        reopened = ReplicaLog(replica_log_path(tmp_path, "q"))
        reopened.open()
        assert reopened.entries == [], "the new queue took the deleted one's log"
        assert new.incarnation == 21

    trio.run(main)


def test_a_queue_whose_definition_changed_keeps_its_log(tmp_path: Path) -> None:
    """A put of the same key (its replica set changed: ``replica_set.py``) is the same
    queue: same create revision, the replica and its log stay."""

    async def main() -> None:
        view = ClusterView(KEYS)
        view.apply(WatchBatch(10, [_put(10, 10)]))
        replication = _replication(view, tmp_path)
        await replication.reconcile()
        replica = replication.queues["q"]
        replica.log.append(3, _pub(1))
        await replica.log.sync()
        view.apply(WatchBatch(30, [_put(30, 10, {**DEFINITION, "replicas": ["a", "b", "d"]})]))
        await replication.reconcile()
        assert replication.queues["q"] is replica and not replica.log.removed and replica.log.end_offset == 1
        view.reset(31, [_put(30, 10, {**DEFINITION, "replicas": ["a", "b", "d"]}).kv])
        await replication.reconcile()
        assert replication.queues["q"] is replica and replica.log.end_offset == 1

    trio.run(main)


def test_the_view_keeps_each_keys_create_revision() -> None:
    view = ClusterView(KEYS)
    assert view.created_revision("queues", "q") == 0
    view.apply(WatchBatch(10, [_put(10, 10)]))
    view.apply(WatchBatch(12, [_put(12, 10)]))
    assert view.created_revision("queues", "q") == 10 and view.revision_of("queues", "q") == 12
    view.apply(WatchBatch(13, [_delete(13)]))
    assert view.created_revision("queues", "q") == 0
    view.reset(20, [_put(20, 18).kv])
    assert view.created_revision("queues", "q") == 18
    view.reset(21, [])
    assert view.created_revision("queues", "q") == 0


def _restarted(view: ClusterView, data_dir: Path) -> Replication:
    replication = _replication(view, data_dir)
    replication._swept = False  # (a new process: its first round sweeps)
    return replication


@pytest.mark.parametrize("declared_again", [True, False])
def test_a_node_restarted_after_its_queue_was_declared_again_starts_with_an_empty_log(
    tmp_path: Path, declared_again: bool
) -> None:
    async def main() -> None:
        view = ClusterView(KEYS)
        view.apply(WatchBatch(10, [_put(10, 10)]))
        before = _replication(view, tmp_path)
        await before.reconcile()
        replica = before.queues["q"]
        for i in range(1, 4):
            replica.log.append(3, _pub(i))
        await replica.log.sync()
        # the node stops; meanwhile the queue is (or is not) deleted and declared again
        later = ClusterView(KEYS)
        later.reset(30, [_put(21, 21).kv if declared_again else _put(12, 10).kv])
        after = _restarted(later, tmp_path)
        await after.reconcile()
        log = after.queues["q"].log
        assert log.end_offset == (0 if declared_again else 3)
        assert log.read_incarnation() == (21 if declared_again else 10)
        reopened = ReplicaLog(replica_log_path(tmp_path, "q"))
        reopened.open()
        assert reopened.end_offset == log.end_offset

    trio.run(main)


def test_a_log_from_before_incarnations_is_kept_and_marked_and_a_stale_mark_is_swept(tmp_path: Path) -> None:
    async def main() -> None:
        old = ReplicaLog(replica_log_path(tmp_path, "q"))
        old.open()
        old.append(3, _pub(1))
        await old.sync()
        stale = ReplicaLog(replica_log_path(tmp_path, "gone"))
        stale.write_incarnation(5)  # the mark of a queue deleted meanwhile
        view = ClusterView(KEYS)
        view.reset(30, [_put(21, 21).kv])
        replication = _restarted(view, tmp_path)
        await replication.reconcile()
        log = replication.queues["q"].log
        assert log.end_offset == 1 and log.read_incarnation() == 21
        assert not stale.incarnation_path.exists()
        await replication._forget("q")
        assert list((tmp_path / "replicas").iterdir()) == []

    trio.run(main)
