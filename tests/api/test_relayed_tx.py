"""A transaction's held settles of relayed deliveries (``broker.api.channel.relayed_tx``),
alone: what each owner is sent at the commit, what a commit waits for, and the
refusals and failures it reports (an ended relay before the commit, an owner
unreachable or silent during it). The relays are stand-ins with the attributes a
held settle uses; their streams record what they are sent. The same code under two
real nodes: tests/cluster/test_cluster_tx_relayed.py."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from broker.api.channel.relayed_tx import COMMIT_TIMEOUT_S, HeldRelayedSettles
from broker.cluster import PeerUnreachable
from broker.core import ChannelError


class _Stream:
    def __init__(self, reachable: bool = True) -> None:
        self.sent: list[dict[str, Any]] = []
        self.reachable = reachable

    async def send(self, op: dict[str, Any]) -> None:
        if not self.reachable:
            raise PeerUnreachable("connection refused")
        self.sent.append(op)


class _Relay:
    def __init__(self, owner: str, tags: dict[int, int], reachable: bool = True) -> None:
        self.owner = owner
        self.queue = f"q{owner}"
        self.stream: Any = _Stream(reachable)
        self.tags = tags
        self.ended = False
        self.end_reason = ""
        self.tx_selected = False
        self.committed: trio.Event | None = None
        self.commit_answer: dict[str, Any] | None = None


def _held() -> tuple[HeldRelayedSettles, list[int], list[Any]]:
    forgotten: list[int] = []
    ended: list[Any] = []

    def end(relay: Any) -> None:
        relay.ended = True
        ended.append(relay)
        if relay.committed is not None:
            relay.committed.set()

    return HeldRelayedSettles(forgotten.append, end), forgotten, ended


async def _answer_commits(*relays: _Relay) -> None:
    """The owners: each answers the commit it is sent."""
    await trio.testing.wait_all_tasks_blocked()
    for relay in relays:
        assert relay.committed is not None, "no commit is waiting"
        relay.commit_answer = {"ev": "ok", "op": "tx_commit"}
        relay.committed.set()


async def test_a_commit_sends_each_owner_its_share_in_a_transaction_and_waits_for_it() -> None:
    held, forgotten, ended = _held()
    b, c = _Relay("b", {2: 10, 4: 11}), _Relay("c", {5: 20})
    held.add(b, {"op": "ack", "delivery_tag": 10}, [2])
    held.add(c, {"op": "nack", "requeue": True, "delivery_tag": 20}, [5])
    held.add(b, {"op": "ack", "delivery_tag": 11}, [4])
    assert len(held) == 3 and held.tags == {2, 4, 5}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answer_commits, b, c)
        assert await held.commit() == []
    assert b.stream.sent == [
        {"op": "tx_select"}, {"op": "ack", "delivery_tag": 10}, {"op": "ack", "delivery_tag": 11},
        {"op": "tx_commit", "id": "relay-commit"},
    ]
    assert c.stream.sent[0] == {"op": "tx_select"} and c.stream.sent[-1]["op"] == "tx_commit"
    assert b.tags == {} and c.tags == {} and sorted(forgotten) == [2, 4, 5] and not ended
    assert len(held) == 0 and not held.tags
    # the owner's channel stays transactional: no second tx_select
    b.tags[6] = 12
    held.add(b, {"op": "ack", "delivery_tag": 12}, [6])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answer_commits, b)
        assert await held.commit() == []
    assert [op["op"] for op in b.stream.sent[4:]] == ["ack", "tx_commit"]


async def test_an_owner_unreachable_or_silent_fails_its_share_and_ends_its_relay(autojump_clock: Any) -> None:
    held, _forgotten, ended = _held()
    down, silent = _Relay("b", {1: 1}, reachable=False), _Relay("c", {2: 2})
    held.add(down, {"op": "ack", "delivery_tag": 1}, [1])
    held.add(silent, {"op": "ack", "delivery_tag": 2}, [2])
    before = trio.current_time()
    failed = await held.commit()
    assert trio.current_time() - before == pytest.approx(COMMIT_TIMEOUT_S)
    assert sorted(failed) == [
        "1 settle(s) of deliveries relayed from node 'b': cannot be reached: connection refused",
        f"1 settle(s) of deliveries relayed from node 'c': no answer within {COMMIT_TIMEOUT_S:g} s",
    ]
    assert ended == [down, silent] or ended == [silent, down]


async def test_a_relay_ending_during_the_commit_fails_it_with_its_reason() -> None:
    held, _forgotten, _ended = _held()
    b = _Relay("b", {1: 1})
    held.add(b, {"op": "ack", "delivery_tag": 1}, [1])

    async def owner_fails() -> None:
        await trio.testing.wait_all_tasks_blocked()
        b.end_reason = "queue_unavailable: node 'b': unknown delivery tag 1"
        b.ended = True
        assert b.committed is not None
        b.committed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(owner_fails)
        failed = await held.commit()
    assert failed == ["1 settle(s) of deliveries relayed from node 'b': queue_unavailable: node 'b': unknown delivery tag 1"]


def test_an_ended_relay_refuses_the_commit_before_anything_and_a_rollback_forgets() -> None:
    held, _forgotten, _ended = _held()
    b, c = _Relay("b", {1: 1}), _Relay("c", {2: 2})
    held.add(b, {"op": "ack", "delivery_tag": 1}, [1])
    held.add(c, {"op": "ack", "delivery_tag": 2}, [2])
    held.check()  # (all relays live)
    c.ended, c.end_reason = True, "queue_unavailable: the connection to node 'c' was lost"
    with pytest.raises(ChannelError) as refused:
        held.check()
    assert refused.value.code == "queue_unavailable"
    assert "nothing of it applied" in refused.value.message and "node 'c'" in refused.value.message
    assert held.rollback() == 2 and len(held) == 0 and not held.tags
    assert b.tags == {1: 1} and b.stream.sent == []  # nothing sent, nothing forgotten


def test_a_settle_of_a_delivery_whose_relay_had_ended_refuses_the_commit() -> None:
    held, _forgotten, _ended = _held()
    held.add_lost(7, "b")
    assert len(held) == 1 and held.tags == {7}
    with pytest.raises(ChannelError) as refused:
        held.check()
    assert refused.value.code == "queue_unavailable"
    assert "delivery tag 7 of node 'b'" in refused.value.message
    assert held.rollback() == 1 and len(held) == 0
    held.check()  # (rolled back: nothing left to refuse)
