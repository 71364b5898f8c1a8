"""``GET /queues`` one page at a time: filter, sort and paginate on the server; without
parameters the answer is what it always was."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from broker.api.rest import listing
from broker.api.rest.listing import MAX_PAGE_SIZE
from broker.app import BrokerApp
from broker.core import QUEUE_COUNTERS
from broker.http import QueryParams
from tests.support.http import HTTPClient, assert_error


async def declare(client: HTTPClient, *names: str) -> None:
    for name in names:
        assert (await client.put(f"/queues/{name}", json={"durable": False})).status == 201


async def publish(client: HTTPClient, queue: str, n: int) -> None:
    for _ in range(n):
        reply = await client.post(f"/exchanges/amq.default/publish?routing_key={queue}", body=b"x")
        assert reply.status == 200


async def names(client: HTTPClient, query: str) -> list[str]:
    reply = await client.get("/queues?" + query)
    assert reply.status == 200, reply.body
    return [q["name"] for q in reply.json()["queues"]]


async def test_without_parameters_every_queue_in_declaration_order(client: HTTPClient) -> None:
    await declare(client, "b", "a", "c")
    body = (await client.get("/queues")).json()
    assert list(body) == ["queues"]
    assert [q["name"] for q in body["queues"]] == ["b", "a", "c"]


async def test_pages_with_counts(client: HTTPClient) -> None:
    await declare(client, *(f"q{n:02d}" for n in range(25)))
    body = (await client.get("/queues?page=3&page_size=10")).json()
    assert [q["name"] for q in body["queues"]] == [f"q{n}" for n in range(20, 25)]
    assert {k: v for k, v in body.items() if k != "queues"} == {
        "total": 25, "filtered": 25, "page": 3, "page_size": 10, "pages": 3, "sort": "name", "order": "asc",
    }
    # each page has the full queue statistics
    assert body["queues"][0]["messages_ready"] == 0 and "message_stats" in body["queues"][0]
    # past the last page: empty, with the counts
    body = (await client.get("/queues?page=9&page_size=10")).json()
    assert body["queues"] == [] and body["pages"] == 3


async def test_name_filter_is_a_case_insensitive_substring(client: HTTPClient) -> None:
    await declare(client, "Orders.EU", "orders.us", "billing", "reorders")
    assert await names(client, "name=ORDERS") == ["Orders.EU", "orders.us", "reorders"]
    body = (await client.get("/queues?name=zzz")).json()
    assert body["queues"] == [] and body["total"] == 4 and body["filtered"] == 0 and body["pages"] == 1


async def test_sort_by_depth_and_consumers_ties_by_name(client: HTTPClient, broker_app: BrokerApp) -> None:
    await declare(client, "c", "a", "b", "d")
    await publish(client, "b", 3)
    await publish(client, "d", 1)
    assert await names(client, "sort=messages_ready&order=desc") == ["b", "d", "c", "a"]
    assert await names(client, "sort=messages_ready") == ["a", "c", "d", "b"]
    assert await names(client, "sort=messages&order=desc&page_size=2") == ["b", "d"]
    assert await names(client, "sort=published&order=desc&page=2&page_size=2") == ["c", "a"]
    assert await names(client, "sort=name&order=desc") == ["d", "c", "b", "a"]
    assert await names(client, "sort=consumers") == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    "query",
    [
        "page=0",
        "page=x",
        "page_size=0",
        f"page_size={MAX_PAGE_SIZE + 1}",
        "sort=size",
        "order=up",
        "name=" + "x" * 256,
        "pgae=1",
    ],
)
async def test_bad_parameters_are_refused(client: HTTPClient, query: str) -> None:
    assert_error(await client.get("/queues?" + query), 400, "invalid_argument")


async def test_ten_thousand_queues_answer_one_page(client: HTTPClient, broker_app: BrokerApp) -> None:
    core = broker_app.runtime.core
    for n in range(10_000):
        core.declare_queue(f"bulk-{n:05d}", durable=False)
    reply = await client.get("/queues?name=bulk-09&sort=name&order=desc&page_size=50")
    body = reply.json()
    assert body["total"] == 10_000 and body["filtered"] == 1000 and body["pages"] == 20
    assert [q["name"] for q in body["queues"]][:2] == ["bulk-09999", "bulk-09998"]
    assert len(reply.body) < 50 * 1024  # one page travels, not 10,000 queues


async def test_a_sort_lets_other_tasks_run_and_leaves_out_queues_deleted_meanwhile(
    broker_app: BrokerApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sort keys are read in slices with a checkpoint between them (10,000 queues take
    tens of milliseconds); a queue deleted while the list is built is not answered."""
    core = broker_app.runtime.core
    for name in "abcd":
        core.declare_queue(name, durable=False)
    checkpoints = 0

    async def counted() -> None:
        nonlocal checkpoints
        checkpoints += 1
        await trio.lowlevel.checkpoint()

    def consumers_deleting_c(q: Any) -> int:
        if q.name == "d":  # another task deletes "c" meanwhile
            core.delete_queue("c")
        return len(q.consumers)

    monkeypatch.setattr(listing, "KEYS_PER_SLICE", 1)
    monkeypatch.setattr(listing, "checkpoint", counted)
    monkeypatch.setitem(QUEUE_COUNTERS, "consumers", consumers_deleting_c)
    body = await listing.list_page(core.views, QueryParams("sort=consumers"))
    assert checkpoints == 3
    assert [q["name"] for q in body["queues"]] == ["a", "b", "d"]
