"""Locks over REST: acquire, wait in line (no polling), refresh, release, list, and the
refusals (409 with the holder, 400 for bad input). Time-dependent tests run on the
autojump clock through memory streams."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from tests.support.http import HTTPClient, assert_error, open_memory_client


async def acquire(client: HTTPClient, name: str, owner: str, ttl_s: float = 30, wait_s: float = 0):
    return await client.post(f"/locks/{name}/acquire", json={"owner": owner, "ttl_s": ttl_s, "wait_s": wait_s})


async def test_acquire_refresh_release_and_read(client: HTTPClient) -> None:
    reply = await acquire(client, "nightly-report", "host-7/pid-311")
    assert reply.status == 200, reply.body
    lock = reply.json()
    assert lock["owner"] == "host-7/pid-311" and lock["held"] and lock["token"] >= 1
    assert lock["expires_at"].endswith("Z") and lock["acquired_at"].endswith("Z")
    listed = (await client.get("/locks")).json()["locks"]
    assert [item["name"] for item in listed] == ["nightly-report"]
    refreshed = await client.post(
        "/locks/nightly-report/refresh", json={"owner": "host-7/pid-311", "token": lock["token"], "ttl_s": 60}
    )
    assert refreshed.status == 200 and refreshed.json()["ttl_s"] == 60
    assert refreshed.json()["token"] == lock["token"]
    released = await client.post(
        "/locks/nightly-report/release", json={"owner": "host-7/pid-311", "token": lock["token"]}
    )
    assert released.status == 200 and released.json()["held"] is False
    assert (await client.get("/locks")).json() == {"locks": []}
    assert (await client.get("/locks/nightly-report")).json()["held"] is False


async def test_held_lock_is_refused_with_its_holder(client: HTTPClient) -> None:
    await acquire(client, "l", "a")
    body = assert_error(await acquire(client, "l", "b"), 409, "lock_held")
    assert body["lock"]["owner"] == "a" and body["lock"]["expires_at"]


async def test_wrong_owner_or_token_is_refused(client: HTTPClient) -> None:
    token = (await acquire(client, "l", "a")).json()["token"]
    for path, body in (
        ("refresh", {"owner": "b", "token": token}),
        ("refresh", {"owner": "a", "token": token + 1}),
        ("release", {"owner": "b", "token": token}),
    ):
        err = assert_error(await client.post(f"/locks/l/{path}", json=body), 409, "not_lock_holder")
        assert err["lock"]["owner"] == "a"
    assert (await client.get("/locks/l")).json()["owner"] == "a"


@pytest.mark.parametrize(
    "path, body",
    [
        ("/locks/l/acquire", {"owner": "a", "ttl_s": 0}),
        ("/locks/l/acquire", {"owner": "a", "ttl_s": "30"}),
        ("/locks/l/acquire", {"owner": "a", "wait_s": -1}),
        ("/locks/l/acquire", {"owner": "a", "wait_s": 100000}),
        ("/locks/l/acquire", {"ttl_s": 30}),
        ("/locks/l/acquire", {"owner": "a", "color": "red"}),
        ("/locks/l/refresh", {"owner": "a"}),
        ("/locks/l/release", {"owner": "a", "token": "1"}),
        ("/locks/amq.x/acquire", {"owner": "a"}),
    ],
)
async def test_bad_input_is_refused(client: HTTPClient, path: str, body: dict) -> None:
    reply = await client.post(path, json=body)
    assert reply.status in (400, 403), reply.body
    assert (await client.get("/locks")).json() == {"locks": []}


async def test_waiters_get_the_lock_in_arrival_order(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp
) -> None:
    order: list[tuple[str, int, float]] = []
    async with open_memory_client(broker_app) as holder:
        first = (await acquire(holder, "l", "a", ttl_s=10)).json()
        start = trio.current_time()

        async def wait_for(owner: str) -> None:
            async with open_memory_client(broker_app) as c:
                reply = await acquire(c, "l", owner, ttl_s=10, wait_s=60)
                assert reply.status == 200, reply.body
                order.append((owner, reply.json()["token"], trio.current_time() - start))
                await c.post("/locks/l/release", json={"owner": owner, "token": reply.json()["token"]})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for, "b")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(wait_for, "c")
            await trio.testing.wait_all_tasks_blocked()
            info = (await holder.get("/locks/l")).json()
            assert [w["owner"] for w in info["waiters"]] == ["b", "c"]
            await trio.sleep(3)
            await holder.post("/locks/l/release", json={"owner": "a", "token": first["token"]})
    assert [o for o, _t, _at in order] == ["b", "c"]
    assert first["token"] < order[0][1] < order[1][1]
    assert order[0][2] == pytest.approx(3, abs=0.01)


async def test_a_wait_runs_out_with_409_and_expiry_frees_on_time(
    autojump_clock: trio.testing.MockClock, memory_client: HTTPClient
) -> None:
    await acquire(memory_client, "l", "a", ttl_s=10)
    start = trio.current_time()
    body = assert_error(await acquire(memory_client, "l", "b", wait_s=4), 409, "lock_held")
    assert trio.current_time() - start == pytest.approx(4, abs=0.01)
    assert body["lock"]["owner"] == "a"
    reply = await acquire(memory_client, "l", "b", wait_s=60)
    assert reply.status == 200 and reply.json()["owner"] == "b"
    assert trio.current_time() - start == pytest.approx(10, abs=0.01)


async def test_a_waiter_that_leaves_gives_up_its_place(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp
) -> None:
    async with open_memory_client(broker_app) as holder:
        first = (await acquire(holder, "l", "a", ttl_s=100)).json()
        async with trio.open_nursery() as nursery:
            async def leaver() -> None:
                async with open_memory_client(broker_app) as c:
                    await acquire(c, "l", "gone", wait_s=60)

            nursery.start_soon(leaver)
            await trio.testing.wait_all_tasks_blocked()
            assert len((await holder.get("/locks/l")).json()["waiters"]) == 1
            nursery.cancel_scope.cancel()
        await trio.sleep(0.1)
        assert (await holder.get("/locks/l")).json()["waiters"] == []
        await holder.post("/locks/l/release", json={"owner": "a", "token": first["token"]})
        assert (await holder.get("/locks/l")).json()["held"] is False


async def test_a_parked_acquire_answers_503_when_the_broker_shuts_down(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp
) -> None:
    async with open_memory_client(broker_app) as holder, open_memory_client(broker_app) as waiter:
        await acquire(holder, "l", "a", ttl_s=100)
        replies = []
        async with trio.open_nursery() as nursery:
            async def wait() -> None:
                replies.append(await acquire(waiter, "l", "b", wait_s=60))

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            broker_app.runtime.shutting_down = True
            broker_app.runtime.wake_getters()
        assert_error(replies[0], 503, "shutting_down")
        broker_app.runtime.shutting_down = False
        assert (await holder.get("/locks/l")).json()["waiters"] == []
