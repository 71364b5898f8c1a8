"""A transaction's commit in cluster mode (``broker.runtime.txcommit``), in process: a
stand-in cluster port forwards the publishes that reach the "remote" queue and the
test answers them; a stand-in for the channel's relays holds settles of relayed
deliveries. What is checked: the relayed settles are checked before anything is
applied, sent only once every forwarded publish is confirmed (and not at all when one
was not), and a failure of theirs makes the commit ``tx_incomplete``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from broker.core import ChannelError
from broker.runtime import BrokerRuntime, CommandGateway, ForwardPlan, RuntimeOptions
from broker.runtime.txcommit import commit_across_nodes
from tests.support.sink import RecordingSink


class _Cluster:
    """Publishes to routing key "remote" go to node b; the rest stay here."""

    node_name = "a"

    def __init__(self) -> None:
        self.sent: list[Callable[[bool, str | None], None]] = []
        #: (body, dedup) of each publish forwarded
        self.forwarded: list[tuple[bytes, bool]] = []

    def plan(self, channel_id: int, exchange: str, routing_key: str, headers: Any) -> ForwardPlan | None:
        return ForwardPlan(False, ["b"], None, 1) if routing_key == "remote" else None

    def send(self, owner: str, exchange: str, routing_key: str, body: bytes, properties: Any, delay_s: Any,
             settle: Callable[[bool, str | None], None], *, dedup: bool = True) -> None:
        self.sent.append(settle)
        self.forwarded.append((body, dedup))


class _Relayed:
    """The channel's relays, holding ``count`` settles; records what the commit asks."""

    def __init__(self, count: int, cluster: _Cluster, *, refuse: bool = False, fail: bool = False) -> None:
        self.count, self.cluster, self.refuse, self.fail = count, cluster, refuse, fail
        self.calls: list[str] = []
        self.unanswered_publishes_at_commit: int | None = None

    def held_count(self) -> int:
        return self.count

    def check_held(self) -> None:
        self.calls.append("check")
        if self.refuse:
            raise ChannelError("transaction not committed, nothing of it applied: requeued", code="queue_unavailable")

    def rollback_held(self) -> int:
        self.calls.append("rollback")
        return self.count

    async def commit_held(self) -> list[str]:
        self.calls.append("commit")
        return ["1 settle(s) of deliveries relayed from node 'b': lost"] if self.fail else []


def _transaction(cluster: _Cluster) -> tuple[BrokerRuntime, CommandGateway, int]:
    """A channel whose open transaction publishes one message here ("here") and one
    to node b ("remote")."""
    runtime = BrokerRuntime(RuntimeOptions(data_dir=None))
    gateway = CommandGateway(runtime)
    gateway.run(lambda core: core.declare_queue("here", durable=False))
    cid = gateway.open_channel()
    gateway.attach(cid, RecordingSink())
    gateway.run(lambda core: core.tx_select(cid))
    gateway.run(lambda core: core.publish(cid, "", "here", b"h", None))
    gateway.run(lambda core: core.publish(cid, "", "remote", b"r", None))
    return runtime, gateway, cid


def _ready_here(gateway: CommandGateway) -> int:
    return int(gateway.views.queue_info("here")["messages_ready"])


async def _answer_publishes(cluster: _Cluster, relayed: _Relayed, ack: bool) -> None:
    await trio.testing.wait_all_tasks_blocked()
    assert relayed.calls == ["check"], "the relayed settles went before the publishes' confirms"
    for settle in cluster.sent:
        settle(ack, None if ack else "node b lost")


async def test_relayed_settles_go_once_the_publishes_are_confirmed() -> None:
    cluster = _Cluster()
    runtime, gateway, cid = _transaction(cluster)
    relayed = _Relayed(2, cluster)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answer_publishes, cluster, relayed, True)
        count = await commit_across_nodes(runtime, cluster, cid, relayed)  # type: ignore[arg-type]
    assert relayed.calls == ["check", "commit"]
    assert count == 2 + 2 and _ready_here(gateway) == 1


async def test_a_publish_not_taken_sends_no_relayed_settle() -> None:
    cluster = _Cluster()
    runtime, gateway, cid = _transaction(cluster)
    relayed = _Relayed(1, cluster)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answer_publishes, cluster, relayed, False)
        with pytest.raises(ChannelError) as partial:
            await commit_across_nodes(runtime, cluster, cid, relayed)  # type: ignore[arg-type]
    assert partial.value.code == "tx_incomplete"
    assert "1 settle(s) of relayed deliveries not sent" in partial.value.message
    assert relayed.calls == ["check", "rollback"]
    assert _ready_here(gateway) == 1  # (this node's part stays applied)


async def test_a_relayed_share_lost_makes_the_commit_incomplete() -> None:
    cluster = _Cluster()
    runtime, gateway, cid = _transaction(cluster)
    relayed = _Relayed(1, cluster, fail=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answer_publishes, cluster, relayed, True)
        with pytest.raises(ChannelError) as partial:
            await commit_across_nodes(runtime, cluster, cid, relayed)  # type: ignore[arg-type]
    assert partial.value.code == "tx_incomplete"
    assert "relayed from node 'b': lost" in partial.value.message


async def test_a_relayed_settle_refused_before_the_commit_applies_nothing() -> None:
    cluster = _Cluster()
    runtime, gateway, cid = _transaction(cluster)
    relayed = _Relayed(1, cluster, refuse=True)
    with pytest.raises(ChannelError) as refused:
        await commit_across_nodes(runtime, cluster, cid, relayed)  # type: ignore[arg-type]
    assert refused.value.code == "queue_unavailable"
    assert relayed.calls == ["check"] and cluster.sent == [] and _ready_here(gateway) == 0


async def test_a_publish_without_dedup_is_forwarded_without_it_at_the_commit() -> None:
    """The owner must not deduplicate a transactional publish made with ``dedup``
    False (an AMQP connection's): the flag travels from the held publish to the send."""
    cluster = _Cluster()
    runtime, gateway, cid = _transaction(cluster)  # (its "remote" publish: dedup on)
    gateway.run(lambda core: core.publish(cid, "", "remote", b"plain", {"message_id": "m"}, dedup=False))

    async def answer() -> None:
        await trio.testing.wait_all_tasks_blocked()
        for settle in cluster.sent:
            settle(True, None)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        await commit_across_nodes(runtime, cluster, cid)  # type: ignore[arg-type]
    assert cluster.forwarded == [(b"r", True), (b"plain", False)]


async def test_the_gateway_forwards_a_publish_with_its_dedup_flag() -> None:
    cluster = _Cluster()
    runtime = BrokerRuntime(RuntimeOptions(data_dir=None))
    runtime.cluster = cluster  # type: ignore[assignment]
    gateway = CommandGateway(runtime)
    cid = gateway.open_channel()
    gateway.attach(cid, RecordingSink())
    gateway.publish(cid, "", "remote", b"with", {"message_id": "m"})
    gateway.publish(cid, "", "remote", b"without", {"message_id": "m"}, dedup=False)
    assert cluster.forwarded == [(b"with", True), (b"without", False)]
    for settle in cluster.sent:
        settle(True, None)
