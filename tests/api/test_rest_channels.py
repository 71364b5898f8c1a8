"""``GET /channels`` and ``DELETE /channels/{id}``: who is connected, and closing one
(the client is told why, its unacked deliveries go back to the queue)."""

from __future__ import annotations

import pytest

from broker.app import BrokerApp
from tests.support.channel import ChannelEnded, Clients, wait_until
from tests.support.http import HTTPClient, assert_error


async def test_lists_channels_and_streams_with_their_consumers(
    app: BrokerApp, clients: Clients, client: HTTPClient
) -> None:
    assert (await client.get("/channels")).json() == {"channels": []}
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "jobs"})
    await ch.send(*[{"op": "publish", "routing_key": "jobs", "body": f"m{i}"} for i in range(3)])
    await ch.sync()
    await ch.ok({"op": "consume", "queue": "jobs", "consumer_tag": "worker", "prefetch": 2})
    await ch.expect("deliver")
    await ch.expect("deliver")
    stream = await clients.stream("jobs", "?prefetch=5")
    assert stream.status == 200

    body = (await client.get("/channels")).json()
    by_kind = {c["kind"]: c for c in body["channels"]}
    assert set(by_kind) == {"channel", "stream"}
    channel = by_kind["channel"]
    assert channel["id"] == ch.open_event["channel"]
    assert channel["remote"].startswith("127.0.0.1:")
    assert channel["user"] is None  # no users: nobody logged in
    assert channel["opened_at"] > 0
    assert channel["publishes"] == 3 and channel["deliveries"] == 2 and channel["unacked"] == 2
    assert channel["pending_confirms"] == 0 and channel["transactional"] is False
    assert channel["consumers"] == [
        {"consumer_tag": "worker", "queue": "jobs", "prefetch": 2, "unacked": 2, "no_ack": False, "exclusive": False}
    ]
    assert by_kind["stream"]["consumers"][0]["queue"] == "jobs"
    one = await client.get(f"/channels/{channel['id']}")
    assert one.json()["consumers"] == channel["consumers"]


async def test_closing_a_channel_tells_the_client_and_requeues(
    app: BrokerApp, clients: Clients, client: HTTPClient
) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "jobs"})
    await ch.send({"op": "publish", "routing_key": "jobs", "body": "one"})
    await ch.sync()
    await ch.ok({"op": "consume", "queue": "jobs", "consumer_tag": "c", "prefetch": 5})
    await ch.expect("deliver")
    cid = ch.open_event["channel"]

    reply = await client.delete(f"/channels/{cid}", json={"reason": "moving this worker"})
    assert reply.status == 200 and reply.json() == {"closed": cid, "reason": "moving this worker"}
    event = await ch.expect("closing")
    assert event["reason"] == "moving this worker"
    with pytest.raises(ChannelEnded):
        while True:
            await ch.next_event()
    core = app.runtime.core
    await wait_until(lambda: cid not in core.channels)
    q = core.queues["jobs"]
    assert (q.ready_count(), q.unacked, len(q.consumers)) == (1, 0, 0)
    assert (await client.get("/channels")).json() == {"channels": []}
    assert_error(await client.get(f"/channels/{cid}"), 404, "not_found")


async def test_closing_a_stream_ends_it(app: BrokerApp, clients: Clients, client: HTTPClient) -> None:
    assert (await client.put("/queues/q")).status == 201
    stream = await clients.stream("q")
    [info] = (await client.get("/channels")).json()["channels"]
    reply = await client.delete(f"/channels/{info['id']}")
    assert reply.json() == {"closed": info["id"], "reason": "closed by an operator"}
    assert (await stream.next_item())["ev"] == "closing"
    await wait_until(lambda: not app.runtime.sinks)


@pytest.mark.parametrize(
    ("method", "target", "body", "status", "code"),
    [
        ("DELETE", "/channels/999", None, 404, "not_found"),
        ("GET", "/channels/999", None, 404, "not_found"),
        ("GET", "/channels/abc", None, 400, "invalid_argument"),
        ("DELETE", "/channels/-1", None, 400, "invalid_argument"),
        ("DELETE", "/channels/1", {"reason": ""}, 400, "invalid_argument"),
        ("DELETE", "/channels/1", {"reason": "x" * 201}, 400, "invalid_argument"),
        ("DELETE", "/channels/1", {"why": "x"}, 400, "invalid_argument"),
    ],
)
async def test_bad_requests(
    client: HTTPClient, method: str, target: str, body: object, status: int, code: str
) -> None:
    kwargs = {"json": body} if body is not None else {}
    assert_error(await client.request(method, target, **kwargs), status, code)
