"""``POST /queues/{q}/replicas`` racing other changes (broker/cluster/replica_set.py
``change_replicas``), without processes: its etcd transaction compares the replica
set's and the in-sync set's revisions; when another change moved either meanwhile it
is planned again from the fresh view, and after ``ATTEMPTS`` lost races it gives up
with ``409 conflict``. etcd is an in-memory stand-in here that keeps revisions and
checks compares as etcd does; a "racer" changes a key just before each transaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
import trio

from broker.api.errors import http_error
from broker.cluster.etcdproto import (
    Compare,
    CompareCreate,
    CompareMod,
    KeyValue,
    Op,
    OpDelete,
    OpPut,
    TxnResult,
)
from broker.cluster.replica_set import ATTEMPTS, change_replicas
from broker.cluster.view import ClusterKeys, ClusterView, canonical
from broker.core import PreconditionFailed

KEYS = ClusterKeys("t")
QUEUE_KEY = KEYS.meta("queues", "q")
ISR_KEY = KEYS.replica("isr", "q")
QUORUM = {"durable": True, "auto_delete": False, "arguments": {"x-queue-type": "quorum"}, "owner": "a"}


class FakeEtcd:
    """Keys with revisions, and ``txn`` with etcd's compare semantics; ``racer`` (if
    set) runs before each transaction, as another node's change landing first."""

    def __init__(self) -> None:
        self.revision = 1
        self.kvs: dict[bytes, KeyValue] = {}
        self.txns = 0
        self.racer: Callable[[FakeEtcd], None] | None = None

    def put(self, key: bytes, value: Any, lease: int = 0) -> None:
        self.revision += 1
        old = self.kvs.get(key)
        data = value if isinstance(value, bytes) else canonical(value)
        self.kvs[key] = KeyValue(
            key, data, old.create_revision if old else self.revision, self.revision, (old.version if old else 0) + 1, lease
        )

    def value(self, key: bytes) -> Any:
        return orjson.loads(self.kvs[key].value)

    def _holds(self, compare: Compare) -> bool:
        kv = self.kvs.get(compare.key)
        if isinstance(compare, CompareMod):
            return (kv.mod_revision if kv else 0) == compare.revision
        if isinstance(compare, CompareCreate):
            return (kv.create_revision if kv else 0) == compare.revision
        raise AssertionError(f"compare not expected here: {compare!r}")

    async def txn(self, compare: list[Compare], success: list[Op], failure: list[Op] | None = None) -> TxnResult:
        await trio.lowlevel.checkpoint()  # (a real call yields: lets a test's deadline fire)
        self.txns += 1
        if self.racer is not None:
            self.racer(self)
        if not all(self._holds(c) for c in compare):
            return TxnResult(False, self.revision)
        self.revision += 1
        for op in success:
            if isinstance(op, OpPut):
                old = self.kvs.get(op.key)
                self.kvs[op.key] = KeyValue(
                    op.key, op.value, old.create_revision if old else self.revision, self.revision,
                    (old.version if old else 0) + 1, op.lease,
                )
            elif isinstance(op, OpDelete):
                self.kvs.pop(op.key, None)
            else:
                raise AssertionError(f"op not expected here: {op!r}")
        return TxnResult(True, self.revision)


def _cluster() -> tuple[FakeEtcd, ClusterView, Callable[[int], Any]]:
    """Queue ``q`` on a, b, c (a leads), node d alive too; the view and its
    ``wait_seen`` (the view reads etcd again: it has seen that revision)."""
    etcd = FakeEtcd()
    for n in ("a", "b", "c", "d", "e"):
        etcd.put(KEYS.node(n), {"name": n, "url": "u"}, lease=7)
        etcd.put(KEYS.known(n), {"name": n, "url": "u"})
    etcd.put(QUEUE_KEY, {**QUORUM, "replicas": ["a", "b", "c"]})
    etcd.put(ISR_KEY, {"isr": ["a", "b", "c"], "led": True})
    etcd.put(KEYS.replica("leaders", "q"), {"node": "a", "url": "u", "incarnation": "i", "lease": 7}, lease=7)
    view = ClusterView(KEYS)
    view.reset(etcd.revision, list(etcd.kvs.values()))
    seen: list[int] = []

    async def wait_seen(revision: int) -> None:
        seen.append(revision)
        view.reset(etcd.revision, list(etcd.kvs.values()))

    return etcd, view, wait_seen


def _isr_drops(node: str) -> Callable[[FakeEtcd], None]:
    """The leader's own change of the in-sync set (``node`` fell behind), once."""

    def race(etcd: FakeEtcd) -> None:
        etcd.racer = None
        isr = etcd.value(ISR_KEY)
        etcd.put(ISR_KEY, {**isr, "isr": [n for n in isr["isr"] if n != node]})

    return race


async def test_a_change_that_lost_to_the_in_sync_set_changing_is_planned_again_from_the_fresh_view() -> None:
    etcd, view, wait_seen = _cluster()
    etcd.racer = _isr_drops("c")
    answer = await change_replicas(etcd, KEYS, view, "q", add="d", wait_seen=wait_seen)  # type: ignore[arg-type]
    assert etcd.txns == 2
    # planned from the in-sync set the leader wrote, not from the stale one
    assert answer["replicas"] == ["a", "b", "c", "d"] and answer["in_sync"] == ["a", "b"], answer
    assert etcd.value(ISR_KEY)["isr"] == ["a", "b"]
    assert etcd.value(QUEUE_KEY)["replicas"] == ["a", "b", "c", "d"]
    assert answer["revision"] == etcd.revision


async def test_a_change_that_lost_to_another_replica_change_is_planned_again_and_keeps_both() -> None:
    etcd, view, wait_seen = _cluster()

    def another_add(etcd: FakeEtcd) -> None:
        etcd.racer = None
        d = etcd.value(QUEUE_KEY)
        etcd.put(QUEUE_KEY, {**d, "replicas": [*d["replicas"], "e"]})

    etcd.racer = another_add
    answer = await change_replicas(etcd, KEYS, view, "q", add="d", wait_seen=wait_seen)  # type: ignore[arg-type]
    assert etcd.txns == 2
    assert etcd.value(QUEUE_KEY)["replicas"] == ["a", "b", "c", "e", "d"] == answer["replicas"]


async def test_a_removal_replanned_after_a_race_is_checked_again_against_the_fresh_view() -> None:
    """The fresh view can make the change unsafe: it is then refused, not forced."""
    etcd, view, wait_seen = _cluster()
    etcd.racer = _isr_drops("c")  # now only a and b hold everything: b cannot leave
    with pytest.raises(PreconditionFailed) as caught:
        await change_replicas(etcd, KEYS, view, "q", remove="b", wait_seen=wait_seen)  # type: ignore[arg-type]
    assert caught.value.code == "not_enough_in_sync"
    assert etcd.value(QUEUE_KEY)["replicas"] == ["a", "b", "c"]


async def test_a_change_that_keeps_losing_gives_up_after_its_bound_with_409_conflict() -> None:
    etcd, view, wait_seen = _cluster()
    flips = 0

    def always(etcd: FakeEtcd) -> None:
        nonlocal flips
        flips += 1
        isr = etcd.value(ISR_KEY)
        etcd.put(ISR_KEY, {**isr, "flips": flips})  # a new revision every time

    etcd.racer = always
    with trio.fail_after(5), pytest.raises(PreconditionFailed) as caught:
        await change_replicas(etcd, KEYS, view, "q", add="d", wait_seen=wait_seen)  # type: ignore[arg-type]
    assert etcd.txns == ATTEMPTS
    assert caught.value.code == "conflict" and "kept changing" in str(caught.value) and "'q'" in str(caught.value)
    error = http_error(caught.value)
    assert error is not None and error.status == 409
    assert etcd.value(QUEUE_KEY)["replicas"] == ["a", "b", "c"]  # nothing of it written
