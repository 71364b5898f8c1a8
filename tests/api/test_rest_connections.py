"""Connection handling under the REST API: keep-alive, pipelining, many clients."""

from __future__ import annotations

import orjson
import trio

from broker.app import BrokerApp
from tests.support.http import HTTPClient, RawConnection, open_tcp_client


def request(method: str, target: str, body: bytes = b"", *, json: object = None) -> bytes:
    if json is not None:
        body = orjson.dumps(json)
    return (
        f"{method} {target} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


async def test_keep_alive_serves_many_requests_on_one_connection(
    client: HTTPClient, broker_app: BrokerApp
) -> None:
    conn = await client.connection()
    assert (await conn.request("PUT", "/queues/q")).status == 201
    for n in range(20):
        reply = await conn.request("POST", "/exchanges/amq.default/publish?routing_key=q", body=b"%d" % n)
        assert reply.json() == {"confirm": "ack", "routed": 1}
        assert "connection" not in reply.headers
    assert (await conn.request("GET", "/queues/q")).json()["messages_ready"] == 20
    assert broker_app.server.statistics().total_accepted == 1


async def test_pipelined_requests_are_answered_in_order(client: HTTPClient, broker_app: BrokerApp) -> None:
    raw = await RawConnection.open(broker_app.port)
    await raw.send(
        request("PUT", "/queues/p")
        + request("POST", "/exchanges/amq.default/publish?routing_key=p", b"one")
        + request("GET", "/nowhere")
        + request("POST", "/exchanges/amq.default/publish?routing_key=p", b"two")
        + request("PUT", "/queues/p", json={"durable": False})
        + request("POST", "/queues/p/get?max=5")
        + request("GET", "/queues/p")
        + request("DELETE", "/queues/p")
    )
    replies = [await raw.read_response() for _ in range(8)]
    assert [r.status for r in replies] == [201, 200, 404, 200, 409, 200, 200, 200]
    assert replies[0].json()["name"] == "p"
    assert replies[1].json() == replies[3].json() == {"confirm": "ack", "routed": 1}
    assert replies[2].json()["error"] == "not_found"
    assert replies[4].json()["error"] == "precondition_failed"
    assert [m["body"] for m in replies[5].json()["messages"]] == ["one", "two"]
    assert replies[6].json()["messages_unacked"] == 2
    assert replies[7].json() == {"deleted": "p", "messages": 0}
    # still open for more
    await raw.send(request("GET", "/healthz"))
    assert (await raw.read_response()).status == 200
    await raw.aclose()


async def test_pipelined_after_a_long_poll(client: HTTPClient, broker_app: BrokerApp) -> None:
    """A request queued behind a parked long-poll waits for it, then is answered."""
    await client.put("/queues/q")
    raw = await RawConnection.open(broker_app.port)
    await raw.send(request("POST", "/queues/q/get?wait=60") + request("GET", "/queues/q"))
    q = broker_app.runtime.core.queues["q"]
    with trio.fail_after(30):
        while not q.getters:
            await trio.sleep(0.001)
        await client.post("/exchanges/amq.default/publish?routing_key=q", body=b"x")
        first = await raw.read_response()
        second = await raw.read_response()
    assert [m["body"] for m in first.json()["messages"]] == ["x"]
    assert second.json()["messages_unacked"] == 1
    await raw.aclose()


async def test_fifty_concurrent_connections(client: HTTPClient, broker_app: BrokerApp) -> None:
    await client.put("/queues/shared")
    clients = 50
    per_client = 4
    results: dict[int, list[str]] = {}
    connected = 0
    all_connected = trio.Event()
    open_at_once: list[int] = []

    async def one_client(n: int) -> None:
        nonlocal connected
        async with open_tcp_client(broker_app.port) as c:
            own = f"q{n}"
            assert (await c.put(f"/queues/{own}")).status == 201
            # Everyone holds an open connection before anyone goes on.
            connected += 1
            if connected == clients:
                open_at_once.append(broker_app.server.statistics().open_connections)
                all_connected.set()
            await all_connected.wait()
            for i in range(per_client):
                for target in (own, "shared"):
                    reply = await c.post(
                        f"/exchanges/amq.default/publish?routing_key={target}", body=f"{n}-{i}".encode()
                    )
                    assert reply.json() == {"confirm": "ack", "routed": 1}
            got = (await c.post(f"/queues/{own}/get?max=100")).json()["messages"]
            results[n] = [m["body"] for m in got]
            ack = await c.post(f"/queues/{own}/ack", json={"lease_ids": [m["lease_id"] for m in got]})
            assert ack.json() == {"acked": per_client}

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for n in range(clients):
                nursery.start_soon(one_client, n)
    assert open_at_once == [clients + 1]  # + the `client` fixture's connection
    assert results == {n: [f"{n}-{i}" for i in range(per_client)] for n in range(clients)}
    assert (await client.get("/queues/shared")).json()["messages_ready"] == clients * per_client
    stats = broker_app.server.statistics()
    assert stats.total_accepted >= clients + 1
    assert stats.rejected_connections == 0
