"""client/failover.py: several URLs, and the opener moving to the next node when one
cannot be reached (no broker needed)."""

from __future__ import annotations

import pytest

from client.endpoint import Endpoint
from client.failover import FailoverOpener, split_urls


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
