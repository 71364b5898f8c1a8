"""The view of etcd and the mirror into a core, without processes; and a node's
resync when the watch's history was compacted away (a real etcd, an in-process
core)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from broker.cluster import ClusterConfig, ClusterNode
from broker.cluster.etcdproto import KeyValue, WatchBatch, WatchEvent
from broker.cluster.mirror import CoreMirror
from broker.cluster.view import ClusterKeys, ClusterView, binding_digest, canonical
from broker.core import Broker
from broker.runtime import PendingConfirms, RuntimeOptions
from tests.support.etcd import EtcdProcess, require_etcd

KEYS = ClusterKeys("t")


def kv(kind: str, name: str, value: dict[str, Any], rev: int) -> KeyValue:
    key = KEYS.meta(kind, name) if kind not in ("nodes", "known") else getattr(KEYS, kind[:-1] if kind == "nodes" else "known")(name)
    return KeyValue(key, canonical(value), rev, rev, 1, 0)


QUEUE = {"durable": True, "auto_delete": False, "arguments": {"x-queue-leader-locator": "client-local"}, "owner": "me"}
ELSEWHERE = {**QUEUE, "owner": "other"}
EXCHANGE = {"type": "fanout", "durable": True, "auto_delete": False, "internal": False, "arguments": {}}


def binding(source: str, dest: str) -> dict[str, Any]:
    return {"source": source, "destination": dest, "to_exchange": False, "routing_key": "", "arguments": {}}


def core() -> Broker:
    return Broker(clock=lambda: 0.0, wall_clock=lambda: 0.0)


def test_keys_escape_names_and_parse_back() -> None:
    key = KEYS.meta("queues", "a/b c")
    assert key == b"/t/meta/queues/a%2Fb%20c"
    assert KEYS.parse(key) == ("queues", "a/b c")
    assert KEYS.parse(b"/other/meta/queues/x") is None


def test_the_mirror_holds_owned_queues_every_exchange_and_local_bindings() -> None:
    view, broker = ClusterView(KEYS), core()
    mirror = CoreMirror(broker, "me")
    b1, b2 = binding("x", "mine"), binding("x", "theirs")
    changes = view.reset(
        5,
        [
            kv("exchanges", "x", EXCHANGE, 1),
            kv("queues", "mine", QUEUE, 2),
            kv("queues", "theirs", ELSEWHERE, 3),
            kv("bindings", binding_digest(b1), b1, 4),
            kv("bindings", binding_digest(b2), b2, 5),
        ],
    )
    assert len(changes) == 5 and view.revision == 5
    mirror.reconcile(view)
    assert "x" in broker.exchanges and "mine" in broker.queues and "theirs" not in broker.queues
    assert broker.queues["mine"].arguments == {}  # placement is not the core's business
    assert [b["queue"] for b in broker.list_bindings()] == ["mine"]
    assert not mirror.errors
    # a delete event carries no value: the view supplies the old one
    deleted = view.apply(WatchBatch(6, [WatchEvent(True, KeyValue(KEYS.meta("bindings", binding_digest(b1)), b"", 0, 6, 0, 0))]))
    assert deleted[0].old == b1 and deleted[0].new is None
    mirror.apply(deleted, view)
    assert broker.list_bindings() == []


def test_reconcile_drops_what_etcd_no_longer_has_but_keeps_exclusive_and_builtin() -> None:
    broker = core()
    broker.declare_exchange("stale", "direct")
    broker.declare_queue("stale-q")
    builtin = set(broker.exchanges)
    mirror = CoreMirror(broker, "me")
    view = ClusterView(KEYS)
    view.reset(1, [kv("queues", "mine", QUEUE, 1)])
    mirror.reconcile(view)
    assert set(broker.exchanges) == builtin - {"stale"} and set(broker.queues) == {"mine"}


def test_a_refused_change_is_recorded_not_raised() -> None:
    broker = core()
    mirror = CoreMirror(broker, "me")
    view = ClusterView(KEYS)
    bad = {**QUEUE, "arguments": {"x-max-length": -1}}
    mirror.apply(view.reset(1, [kv("queues", "bad", bad, 1)]), view)
    assert "bad" not in broker.queues and "declare queue 'bad'" in mirror.errors[0]


# ------------------------------------------------------------ resync after compaction


class _Runtime:
    """What a ClusterNode asks of the runtime: a core, pump, readiness, the book of
    confirms (where it installs its forwarder), its options (no data directory: no
    replicas)."""

    def __init__(self) -> None:
        self.core = core()
        self.confirms = PendingConfirms()
        self.options = RuntimeOptions()
        self.ready_event = trio.Event()
        self.ready_event.set()

    def pump(self) -> None:
        pass


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    require_etcd()
    with EtcdProcess(tmp_path / "etcd") as proc:
        yield proc


async def test_a_watch_whose_history_is_compacted_resyncs_from_a_range_read(etcd: EtcdProcess) -> None:
    node = ClusterNode(ClusterConfig(etcd.url, "me", "http://127.0.0.1:1", "t", 5), _Runtime())  # type: ignore[arg-type]
    client = node.client
    try:
        await node._resync()
        seen = node.view.revision
        # changes the node misses, then the history of them compacted away
        await client.put(KEYS.meta("exchanges", "x"), canonical(EXCHANGE))
        latest = await client.put(KEYS.meta("queues", "mine"), canonical(QUEUE))
        await client.call("/v3/kv/compaction", {"revision": str(latest)})
        with trio.fail_after(10):
            assert await node._watch() is True  # gone: resync
        assert node.view.revision == seen and "mine" not in node.runtime.core.queues
        await node._resync()
        assert node.view.revision >= latest and node.resyncs == 2
        assert "mine" in node.runtime.core.queues and "x" in node.runtime.core.exchanges
        assert orjson.loads(canonical(node.view.get("queues", "mine"))) == QUEUE
    finally:
        await client.aclose()


def test_only_events_and_progress_notices_advance_the_view() -> None:
    view = ClusterView(KEYS)
    view.reset(4, [])
    view.apply(WatchBatch(99, [], created=True))  # the store's revision, not what was seen
    assert view.revision == 4
    x = kv("exchanges", "x", EXCHANGE, 7)
    view.apply(WatchBatch(99, [WatchEvent(False, x)]))  # a catching-up batch
    assert view.revision == 7
    view.apply(WatchBatch(12, []))  # a progress notice: everything up to 12 was sent
    assert view.revision == 12
