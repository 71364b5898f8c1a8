"""The transaction a change of a quorum queue's replicas makes, decided from a view
(broker/cluster/replica_set.py ``plan_change``), without processes: what it compares
and writes, and the refusals that keep every confirmed message on an in-sync member."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from broker.cluster.etcdproto import CompareMod, KeyValue, OpDelete, OpPut
from broker.cluster.replica_set import plan_change
from broker.cluster.view import ClusterKeys, ClusterView, canonical
from broker.core import InvalidArgument, NotFound, PreconditionFailed

KEYS = ClusterKeys("t")
QUORUM = {"durable": True, "auto_delete": False, "arguments": {"x-queue-type": "quorum"}, "owner": "a"}


def view(
    replicas: list[str], isr: list[str], *, leader: str | None = "a", live: tuple[str, ...] = ("a", "b", "c", "d"), dead: tuple[str, ...] = ()
) -> ClusterView:
    kvs = [
        KeyValue(KEYS.meta("queues", "q"), canonical({**QUORUM, "replicas": replicas}), 10, 10, 1, 0),
        KeyValue(KEYS.replica("isr", "q"), canonical({"isr": isr, "led": True}), 11, 11, 1, 0),
    ]
    if leader is not None:
        kvs.append(KeyValue(KEYS.replica("leaders", "q"), canonical({"node": leader, "url": "u", "incarnation": "i", "lease": 1}), 12, 12, 1, 7))
    for n in live:
        kvs.append(KeyValue(KEYS.node(n), canonical({"name": n, "url": "u"}), 5, 5, 1, 7))
        kvs.append(KeyValue(KEYS.known(n), canonical({"name": n, "url": "u"}), 5, 5, 1, 0))
    for n in dead:
        kvs.append(KeyValue(KEYS.known(n), canonical({"name": n, "url": "u"}), 5, 5, 1, 0))
    v = ClusterView(KEYS)
    v.reset(20, kvs)
    return v


def written(change: Any) -> dict[bytes, Any]:
    return {op.key: orjson.loads(op.value) for op in change.ops if isinstance(op, OpPut)}


def test_adding_a_node_puts_it_in_the_replicas_but_not_in_sync() -> None:
    change = plan_change(KEYS, view(["a", "b", "c"], ["a", "b", "c"]), "q", add="d")
    assert change.replicas == ["a", "b", "c", "d"] and change.in_sync == ["a", "b", "c"]
    puts = written(change)
    assert puts[KEYS.meta("queues", "q")]["replicas"] == ["a", "b", "c", "d"]
    assert puts[KEYS.replica("isr", "q")] == {"isr": ["a", "b", "c"], "led": True}
    assert CompareMod(KEYS.meta("queues", "q"), 10) in change.compares
    assert CompareMod(KEYS.replica("isr", "q"), 11) in change.compares
    assert not change.removes_leader


def test_removing_the_leader_deletes_its_key_in_the_same_transaction() -> None:
    change = plan_change(KEYS, view(["a", "b", "c", "d"], ["a", "b", "c", "d"]), "q", remove="a")
    assert change.removes_leader and change.in_sync == ["b", "c", "d"]
    assert OpDelete(KEYS.replica("leaders", "q")) in change.ops
    assert CompareMod(KEYS.replica("leaders", "q"), 12) in change.compares
    assert written(change)[KEYS.meta("queues", "q")]["owner"] == "b"  # the owner left: another replica


@pytest.mark.parametrize(
    ("replicas", "isr", "kwargs", "error", "code"),
    [
        (["a", "b", "c"], ["a", "b", "c"], {"add": "zz"}, NotFound, "not_found"),
        (["a", "b", "c"], ["a", "b", "c"], {"add": "b"}, PreconditionFailed, "already_replica"),
        (["a", "b", "c"], ["a", "b", "c"], {"remove": "d"}, NotFound, "not_found"),
        (["a"], ["a"], {"remove": "a"}, PreconditionFailed, "last_replica"),
        (["a", "b"], ["a"], {"remove": "a"}, PreconditionFailed, "last_in_sync"),
        # 3 -> 2 with one in sync: below a majority of 2, a lagging member must catch up
        (["a", "b", "c"], ["a", "b"], {"remove": "b"}, PreconditionFailed, "not_enough_in_sync"),
        (["a", "b", "c"], ["a", "b", "c"], {}, InvalidArgument, "invalid_argument"),
        (["a", "b", "c"], ["a", "b", "c"], {"add": "d", "remove": "a"}, InvalidArgument, "invalid_argument"),
    ],
)
def test_refusals(replicas: list[str], isr: list[str], kwargs: dict[str, str], error: type, code: str) -> None:
    with pytest.raises(error) as caught:
        plan_change(KEYS, view(replicas, isr), "q", **kwargs)
    assert caught.value.code == code


def test_a_dead_node_is_not_added_and_a_forgotten_one_is_removed_without_the_majority_check() -> None:
    with pytest.raises(PreconditionFailed) as caught:
        plan_change(KEYS, view(["a", "b", "c"], ["a", "b", "c"], live=("a", "b", "c"), dead=("d",)), "q", add="d")
    assert caught.value.code == "node_down"
    change = plan_change(KEYS, view(["a", "b", "c"], ["a", "c"], leader="a"), "q", remove="c", force=True)
    assert change.replicas == ["a", "b"] and change.in_sync == ["a"]
