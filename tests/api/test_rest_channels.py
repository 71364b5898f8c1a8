"""``GET /channels`` and ``GET /channels/{id}``: the open channels, their consumers and
counters, read-only."""

from __future__ import annotations

from broker.app import BrokerApp
from tests.support.channel import Clients, wait_until
from tests.support.http import HTTPClient, assert_error


async def test_channels_are_listed_with_their_consumers(app: BrokerApp, clients: Clients, client: HTTPClient) -> None:
    assert (await client.get("/channels")).json() == {"channels": []}
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "jobs"})
    await ch.send(*[{"op": "publish", "routing_key": "jobs", "body": f"m{i}"} for i in range(3)])
    await ch.ok({"op": "consume", "queue": "jobs", "consumer_tag": "c1", "prefetch": 2})
    await ch.sync()
    listed = (await client.get("/channels")).json()["channels"]
    assert len(listed) == 1
    (item,) = listed
    assert item["kind"] == "channel" and item["published"] == 3 and item["unacked"] == 2
    assert item["transactional"] is False and item["remote"]
    assert item["consumers"] == [{"consumer_tag": "c1", "queue": "jobs", "prefetch": 2, "unacked": 2,
                                  "no_ack": False, "exclusive": False}]
    one = await client.get(f"/channels/{item['id']}")
    assert one.status == 200 and one.json() == item
    await ch.send({"op": "close"})
    await ch.remaining_events()
    await wait_until(lambda: not app.runtime.sinks)
    assert (await client.get("/channels")).json() == {"channels": []}
    assert_error(await client.get(f"/channels/{item['id']}"), 404, "not_found")
    assert_error(await client.get("/channels/nope"), 404, "not_found")
