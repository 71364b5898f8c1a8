"""Long-poll get and leases over HTTP: waiting without polling, wake-ups by publishes,
lease expiry and redelivery, extend, ack and nack.

Tests that depend on time use ``autojump_clock`` with ``memory_client`` (trio memory
streams into the same server), so a 30-second lease takes no real time and the times
asserted are virtual; the wake-up by a concurrent publish is also checked over TCP.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from broker.http.limits import Limits
from broker.runtime import RuntimeOptions
from tests.support.app import open_broker_app
from tests.support.http import HTTPClient, Reply, assert_error, open_memory_client


async def publish(client: HTTPClient, queue: str, body: bytes) -> None:
    reply = await client.post(f"/exchanges/amq.default/publish?routing_key={queue}", body=body)
    assert reply.json() == {"confirm": "ack", "routed": 1}, reply.body


async def get(client: HTTPClient, queue: str, query: str = "") -> list[dict[str, Any]]:
    reply = await client.post(f"/queues/{queue}/get" + (f"?{query}" if query else ""))
    assert reply.status == 200, reply.body
    return reply.json()["messages"]  # type: ignore[no-any-return]


async def stats(client: HTTPClient, queue: str) -> tuple[int, int]:
    info = (await client.get(f"/queues/{queue}")).json()
    return info["messages_ready"], info["messages_unacked"]


async def wait_parked(app: BrokerApp, queue: str, count: int = 1) -> None:
    """Until ``count`` long-polls are parked on ``queue`` (a test-side wait only)."""
    q = app.runtime.core.queues[queue]
    with trio.fail_after(10):
        while q.getters != count:
            await trio.sleep(0.001)


# -- get ---------------------------------------------------------------------------


async def test_get_from_empty_queue_without_wait(client: HTTPClient) -> None:
    await client.put("/queues/q")
    reply = await client.post("/queues/q/get")
    assert reply.status == 200
    assert reply.json() == {"messages": []}


async def test_get_max_in_fifo_order(client: HTTPClient) -> None:
    await client.put("/queues/q")
    for n in range(5):
        await publish(client, "q", b"%d" % n)
    first = await get(client, "q", "max=3")
    assert [m["body"] for m in first] == ["0", "1", "2"]
    assert len({m["lease_id"] for m in first}) == 3
    assert [m["body"] for m in await get(client, "q", "max=10")] == ["3", "4"]
    assert await stats(client, "q") == (0, 5)


@pytest.mark.parametrize(
    "query",
    ["max=0", "max=1001", "max=two", "wait=-1", "wait=inf", "wait=nan", "lease=0", "lease=x", "max=1&max=2", "maks=2"],
)
async def test_get_bad_query(client: HTTPClient, query: str) -> None:
    await client.put("/queues/q")
    await publish(client, "q", b"x")
    assert_error(await client.post(f"/queues/q/get?{query}"), 400, "invalid_argument")
    assert await stats(client, "q") == (1, 0)


async def test_get_unknown_queue(client: HTTPClient) -> None:
    assert_error(await client.post("/queues/nope/get"), 404, "not_found")
    assert_error(await client.post("/queues/nope/get?wait=5"), 404, "not_found")


async def test_get_only_by_post(client: HTTPClient) -> None:
    reply = await client.get("/queues/q/get")
    assert_error(reply, 405, "method_not_allowed")
    assert reply.headers["allow"] == "POST"


# -- long-poll -----------------------------------------------------------------------


async def test_long_poll_woken_by_publish_over_tcp(client: HTTPClient, broker_app: BrokerApp) -> None:
    await client.put("/queues/q")
    poller = await client.connection()
    result: list[Reply] = []

    async def long_poll() -> None:
        result.append(await poller.request("POST", "/queues/q/get?wait=60&max=5"))

    with trio.fail_after(30):  # far below the 60 s wait: only a wake-up can finish it
        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_poll)
            await wait_parked(broker_app, "q")
            await publish(client, "q", b"wake up")
    (reply,) = result
    assert reply.status == 200
    (message,) = reply.json()["messages"]
    assert message["body"] == "wake up"
    assert message["redelivered"] is False
    assert broker_app.runtime.core.queues["q"].getters == 0


async def test_long_poll_wait_elapses_in_virtual_time(
    autojump_clock: trio.testing.MockClock, memory_client: HTTPClient
) -> None:
    await memory_client.put("/queues/q")
    start = trio.current_time()
    assert await get(memory_client, "q", "wait=20") == []
    assert trio.current_time() - start == pytest.approx(20)


async def test_long_poll_wait_is_capped_at_max_wait_s(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    await memory_client.put("/queues/q")
    start = trio.current_time()
    assert await get(memory_client, "q", "wait=3600") == []
    assert trio.current_time() - start == pytest.approx(broker_app.runtime.options.max_wait_s)


async def test_long_poll_answers_when_the_message_arrives(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    await memory_client.put("/queues/q")
    start = trio.current_time()
    got: list[list[dict[str, Any]]] = []

    async def long_poll() -> None:
        got.append(await get(memory_client, "q", "wait=30"))
        got.append([{"at": trio.current_time() - start}])

    async with open_memory_client(broker_app) as publisher, trio.open_nursery() as nursery:
        nursery.start_soon(long_poll)
        await trio.sleep(5)
        await publish(publisher, "q", b"late")
    assert got[0][0]["body"] == "late"
    assert got[1][0]["at"] == pytest.approx(5)


async def test_parked_long_poll_does_not_run_until_woken(mock_clock: trio.testing.MockClock) -> None:
    """While parked, no broker task takes a single step however much time passes:
    the wait is a cancel-scope deadline on an event, not a polling loop."""
    limits = Limits(send_timeout_s=None)  # no send watchdog ticking in the background
    async with open_broker_app(limits) as app, open_memory_client(app) as client:
        await client.put("/queues/q")
        poll_done = trio.Event()

        async def long_poll() -> None:
            assert await get(client, "q", "wait=20") == []
            poll_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_poll)
            await trio.testing.wait_all_tasks_blocked()  # the clock stands still: no sleeping
            assert app.runtime.core.queues["q"].getters == 1
            me = trio.lowlevel.current_task()
            steps: list[str] = []

            # The memory alarm's and the rate history's samplers tick on their timers
            # by design (every 0.5 s and 5 s); nothing else may run.
            samplers = ("MemoryMonitor.serve", "RateHistory.serve")

            class CountSteps(trio.abc.Instrument):
                def before_task_step(self, task: trio.lowlevel.Task) -> None:
                    if task is not me and not task.name.endswith(samplers):
                        steps.append(task.name)

            counter = CountSteps()
            trio.lowlevel.add_instrument(counter)
            try:
                for _ in range(19):
                    mock_clock.jump(1)
                    await trio.testing.wait_all_tasks_blocked()
            finally:
                trio.lowlevel.remove_instrument(counter)
            assert steps == []
            assert not poll_done.is_set()
            mock_clock.jump(1.5)
            await poll_done.wait()


async def test_one_message_wakes_one_of_two_long_polls(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    await memory_client.put("/queues/q")
    results: list[tuple[float, list[dict[str, Any]]]] = []

    async def long_poll() -> None:
        async with open_memory_client(broker_app) as c:
            messages = await get(c, "q", "wait=30")
            results.append((trio.current_time(), messages))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(long_poll)
        nursery.start_soon(long_poll)
        await wait_parked(broker_app, "q", 2)
        await publish(memory_client, "q", b"one")
        await trio.sleep(1)
        assert len(results) == 1
        await wait_parked(broker_app, "q", 1)  # the other went back to waiting
        await publish(memory_client, "q", b"two")
    assert sorted(m["body"] for _, batch in results for m in batch) == ["one", "two"]
    assert results[1][0] - start == pytest.approx(1, abs=0.01)


async def test_long_poll_client_leaving_takes_no_lease(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    await memory_client.put("/queues/q")
    async with open_memory_client(broker_app) as leaver:
        conn = await leaver.connection()
        await conn.send_head("POST", "/queues/q/get?wait=60", content_length=0)
        await conn.send_end()
        await wait_parked(broker_app, "q")
        await conn.aclose()
        await wait_parked(broker_app, "q", 0)
    await publish(memory_client, "q", b"for someone else")
    (message,) = await get(memory_client, "q")
    assert message["body"] == "for someone else"
    assert message["redelivered"] is False


async def test_queue_deleted_under_a_long_poll(
    autojump_clock: trio.testing.MockClock, broker_app: BrokerApp, memory_client: HTTPClient
) -> None:
    await memory_client.put("/queues/q")
    replies: list[Reply] = []

    async def long_poll() -> None:
        async with open_memory_client(broker_app) as c:
            replies.append(await c.post("/queues/q/get?wait=30"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(long_poll)
        await wait_parked(broker_app, "q")
        assert (await memory_client.delete("/queues/q")).status == 200
    (reply,) = replies
    assert_error(reply, 404, "not_found")


async def test_graceful_shutdown_answers_parked_long_polls(autojump_clock: trio.testing.MockClock) -> None:
    async with open_broker_app() as app, open_memory_client(app) as client:
        await client.put("/queues/q")
        replies: list[Reply] = []

        async def long_poll() -> None:
            replies.append(await client.post("/queues/q/get?wait=60"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(long_poll)
            await wait_parked(app, "q")
            start = trio.current_time()
            await app.shutdown(timeout_s=10)
        assert trio.current_time() - start < 10
        (reply,) = replies
        assert reply.status == 200
        assert reply.json() == {"messages": []}
        assert reply.headers["connection"] == "close"


# -- leases --------------------------------------------------------------------------


async def test_lease_expiry_returns_the_message_redelivered(
    autojump_clock: trio.testing.MockClock, memory_client: HTTPClient
) -> None:
    client = memory_client
    await client.put("/queues/q")
    await publish(client, "q", b"first")
    await publish(client, "q", b"second")
    (leased,) = await get(client, "q", "lease=5")
    assert leased["body"] == "first" and leased["redelivered"] is False
    assert await stats(client, "q") == (1, 1)
    await trio.sleep(4.9)
    assert await stats(client, "q") == (1, 1)
    await trio.sleep(0.2)
    assert await stats(client, "q") == (2, 0)
    # Back in its original place, at the head, marked redelivered.
    again = await get(client, "q", "max=2")
    assert [(m["body"], m["redelivered"]) for m in again] == [("first", True), ("second", False)]
    assert again[0]["lease_id"] != leased["lease_id"]
    assert_error(await client.post("/queues/q/ack", json={"lease_ids": [leased["lease_id"]]}), 404, "not_found")
    info = (await client.get("/queues/q")).json()
    assert info["message_stats"]["redelivered"] == 1


async def test_default_lease_comes_from_the_options(autojump_clock: trio.testing.MockClock) -> None:
    async with open_broker_app(options=RuntimeOptions(data_dir=None, default_lease_s=7)) as app, open_memory_client(
        app
    ) as client:
        await client.put("/queues/q")
        await publish(client, "q", b"x")
        await get(client, "q")
        await trio.sleep(6.9)
        assert await stats(client, "q") == (0, 1)
        await trio.sleep(0.2)
        assert await stats(client, "q") == (1, 0)


async def test_extend(autojump_clock: trio.testing.MockClock, memory_client: HTTPClient) -> None:
    client = memory_client
    await client.put("/queues/q")
    await publish(client, "q", b"slow job")
    (leased,) = await get(client, "q", "lease=5")
    await trio.sleep(4)
    reply = await client.post("/queues/q/extend", json={"lease_ids": [leased["lease_id"]], "lease": 10})
    assert reply.status == 200
    assert reply.json() == {"extended": 1, "lease": 10.0}
    await trio.sleep(9.9)  # 13.9 s after the get: the original lease is long gone
    assert await stats(client, "q") == (0, 1)
    reply = await client.post("/queues/q/ack", json={"lease_ids": [leased["lease_id"]]})
    assert reply.json() == {"acked": 1}
    assert await stats(client, "q") == (0, 0)


async def test_extend_by_the_default_lease(autojump_clock: trio.testing.MockClock, memory_client: HTTPClient) -> None:
    client = memory_client
    await client.put("/queues/q")
    await publish(client, "q", b"x")
    (leased,) = await get(client, "q", "lease=1")
    for body in ({"lease_ids": [leased["lease_id"]]}, {"lease_ids": [leased["lease_id"]], "lease": None}):
        reply = await client.post("/queues/q/extend", json=body)
        assert reply.json() == {"extended": 1, "lease": 30.0}
    await trio.sleep(29.9)
    assert await stats(client, "q") == (0, 1)
    await trio.sleep(0.2)
    assert await stats(client, "q") == (1, 0)


async def test_extend_errors(client: HTTPClient) -> None:
    await client.put("/queues/q")
    await publish(client, "q", b"x")
    (leased,) = await get(client, "q")
    lid = leased["lease_id"]
    assert_error(await client.post("/queues/q/extend", json={"lease_ids": [lid], "lease": 0}), 400, "invalid_argument")
    assert_error(await client.post("/queues/q/extend", json={"lease_ids": [lid], "lease": "10"}), 400, "invalid_argument")
    assert_error(await client.post("/queues/q/extend", json={"lease_ids": [lid], "lease": 1e9}), 400, "invalid_argument")
    assert_error(await client.post("/queues/q/extend", json={"lease_ids": [lid, "nope"], "lease": 5}), 404, "not_found")


async def test_nack_requeue_and_drop(client: HTTPClient) -> None:
    await client.put("/queues/q")
    for body in (b"a", b"b", b"c"):
        await publish(client, "q", body)
    a, b = await get(client, "q", "max=2")
    reply = await client.post("/queues/q/nack", json={"lease_ids": [a["lease_id"]]})
    assert reply.status == 200
    assert reply.json() == {"nacked": 1}
    # requeue (the default) puts it back at its original position
    assert await stats(client, "q") == (2, 1)
    reply = await client.post("/queues/q/nack", json={"lease_ids": [b["lease_id"]], "requeue": False})
    assert reply.json() == {"nacked": 1}
    assert await stats(client, "q") == (2, 0)
    again = await get(client, "q", "max=5")
    assert [(m["body"], m["redelivered"]) for m in again] == [("a", True), ("c", False)]
    assert_error(await client.post("/queues/q/nack", json={"lease_ids": [a["lease_id"]], "requeue": "no"}), 400, "invalid_argument")


async def test_ack_with_an_unknown_lease_changes_nothing(client: HTTPClient) -> None:
    await client.put("/queues/q")
    await publish(client, "q", b"a")
    await publish(client, "q", b"b")
    a, b = await get(client, "q", "max=2")
    body = assert_error(await client.post("/queues/q/ack", json={"lease_ids": [a["lease_id"], "bogus-0-99"]}), 404, "not_found")
    assert "bogus-0-99" in body["message"]
    assert await stats(client, "q") == (0, 2)
    assert_error(await client.post("/queues/q/ack", json={"lease_ids": [a["lease_id"], a["lease_id"]]}), 400, "invalid_argument")
    assert await stats(client, "q") == (0, 2)
    reply = await client.post("/queues/q/ack", json={"lease_ids": [a["lease_id"], b["lease_id"]]})
    assert reply.json() == {"acked": 2}
    assert await stats(client, "q") == (0, 0)
    assert_error(await client.post("/queues/q/ack", json={"lease_ids": [a["lease_id"]]}), 404, "not_found")
    info = (await client.get("/queues/q")).json()
    assert info["message_stats"]["acked"] == 2


@pytest.mark.parametrize(
    "body",
    [{}, {"lease_ids": []}, {"lease_ids": "x"}, {"lease_ids": [1]}, {"lease_ids": [None]}, {"lease_ids": ["x"], "requeue": True}],
)
async def test_ack_bad_bodies(client: HTTPClient, body: Any) -> None:
    await client.put("/queues/q")
    assert_error(await client.post("/queues/q/ack", json=body), 400, "invalid_argument")


async def test_settling_on_an_unknown_queue_is_404(client: HTTPClient) -> None:
    await client.put("/queues/q")
    await publish(client, "q", b"x")
    (leased,) = await get(client, "q")
    for action, extra in (("ack", {}), ("nack", {"requeue": True}), ("extend", {"lease": 5})):
        body = {"lease_ids": [leased["lease_id"]], **extra}
        assert_error(await client.post(f"/queues/nope/{action}", json=body), 404, "not_found")
    assert await stats(client, "q") == (0, 1)
    assert (await client.post("/queues/q/ack", json={"lease_ids": [leased["lease_id"]]})).json() == {"acked": 1}


async def test_a_lease_on_a_non_durable_queue_expires_on_time_on_an_idle_broker(
    autojump_clock: trio.testing.MockClock, memory_client: HTTPClient
) -> None:
    # A get on a non-durable queue writes nothing to the log, so the pump had no
    # effect to carry out and never woke the timer task for the lease's deadline:
    # the message stayed unacked (40 s and more) until something else happened.
    reply = await memory_client.put("/queues/lq", json={"durable": False})
    assert reply.status == 201
    await publish(memory_client, "lq", b"m")
    [message] = await get(memory_client, "lq", "lease=1")
    assert await stats(memory_client, "lq") == (0, 1)
    start = trio.current_time()
    await trio.sleep(1.5)
    assert await stats(memory_client, "lq") == (1, 0), "the lease did not expire on time"
    assert trio.current_time() - start < 2
    [again] = await get(memory_client, "lq")
    assert again["body"] == "m" and again["redelivered"]
