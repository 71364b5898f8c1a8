"""client/failover.py: several URLs, the opener moving to the next node when one
cannot be reached or answers that another node may serve better (no broker needed)."""

from __future__ import annotations

import pytest

from client.endpoint import Endpoint
from client.errors import ConnectionLost
from client.failover import (
    MOVE_AFTER_S,
    FailoverOpener,
    NodeSteering,
    split_urls,
    unavailable_here,
)


def test_urls_come_as_a_comma_list_or_a_list() -> None:
    assert split_urls("http://a:1, http://b:2,") == ["http://a:1", "http://b:2"]
    assert split_urls(["http://a:1", "http://b:2,http://c:3"]) == ["http://a:1", "http://b:2", "http://c:3"]
    with pytest.raises(ValueError):
        split_urls(" , ")


@pytest.mark.anyio
async def test_the_opener_moves_on_and_remembers_the_node_that_answered() -> None:
    nodes = [Endpoint.parse(u) for u in ("http://a:1", "http://b:2", "http://c:3")]
    down = {"a", "b"}
    tried: list[str] = []

    async def inner(endpoint: Endpoint) -> object:
        tried.append(endpoint.host)
        if endpoint.host in down:
            raise ConnectionRefusedError(111, "refused")
        return endpoint.host

    opener = FailoverOpener(nodes, inner)  # type: ignore[arg-type]
    assert await opener(nodes[0]) == "c" and tried == ["a", "b", "c"]
    tried.clear()
    assert await opener(nodes[0]) == "c" and tried == ["c"]  # starts from the last that answered
    down = {"a", "b", "c"}
    with pytest.raises(OSError, match="no node of"):
        await opener(nodes[0])


def test_a_refusal_that_another_node_may_not_give_moves_the_opener_on() -> None:
    nodes = [Endpoint.parse(u) for u in ("http://a:1", "http://b:2")]
    opener = FailoverOpener(nodes, None)  # type: ignore[arg-type]
    opener.move_on(nodes[1])  # not the current node: nothing moves
    assert opener.endpoint == nodes[0]
    opener.move_on(nodes[0])
    assert opener.endpoint == nodes[1]
    opener.move_on(nodes[1])
    assert opener.endpoint == nodes[0]  # round the list
    assert unavailable_here("queue_unavailable: the owners of queue 'q' (no leader) are down")
    assert unavailable_here("no quorum: leadership of queue 'q' lost")
    assert not unavailable_here("queue full") and not unavailable_here("not_found: no exchange 'x'")


def test_a_channel_moves_on_once_its_node_refused_as_unavailable_for_a_second_without_a_confirm() -> None:
    nodes = [Endpoint.parse(u) for u in ("http://a:1", "http://b:2")]
    opener = FailoverOpener(nodes, None)  # type: ignore[arg-type]
    now = [0.0]
    steering = NodeSteering(opener, clock=lambda: now[0])
    aborted: list[BaseException] = []
    steering.refused("queue_unavailable: no leader", aborted.append)
    now[0] = MOVE_AFTER_S / 2
    steering.refused("no quorum", aborted.append)
    assert aborted == [] and opener.endpoint == nodes[0]  # not yet: maybe an election
    now[0] = MOVE_AFTER_S * 2
    steering.confirmed()  # it serves after all
    steering.refused("queue_unavailable: no leader", aborted.append)
    now[0] = MOVE_AFTER_S * 2.5
    steering.refused("queue full", aborted.append)  # another node would not do better
    assert aborted == []
    now[0] = MOVE_AFTER_S * 3
    steering.refused("queue_unavailable: no leader", aborted.append)
    assert len(aborted) == 1 and isinstance(aborted[0], ConnectionLost) and "a:1" in str(aborted[0])
    assert opener.endpoint == nodes[1]  # the reconnect opens to the next node


def test_steering_is_inert_with_one_node() -> None:
    single = NodeSteering(FailoverOpener([Endpoint.parse("http://a:1")], None))  # type: ignore[arg-type]
    plain = NodeSteering(None)  # type: ignore[arg-type]
    aborted: list[BaseException] = []
    for steering in (single, plain):
        steering.refused("queue_unavailable: x", aborted.append)
        steering.refused("queue_unavailable: x", aborted.append)
    assert aborted == []
