"""Schedules over REST: create, read, list, replace, pause, resume, delete; ticks
published on time with their schedule headers; bad definitions refused. Time runs on
the autojump clock (the broker's wall clock follows it), through memory streams."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from broker.http import Limits
from broker.runtime import BrokerRuntime, RuntimeOptions
from tests.support.http import HTTPClient, assert_error, open_memory_client

EPOCH = 1_800_000_000.0  # the broker's wall clock: EPOCH + trio's clock


@asynccontextmanager
async def open_app() -> AsyncIterator[BrokerApp]:
    runtime = BrokerRuntime(RuntimeOptions(data_dir=None), wall_clock=lambda: EPOCH + trio.current_time())
    app = BrokerApp(runtime, Limits(send_timeout_s=None, idle_timeout_s=3600))
    async with trio.open_nursery() as nursery:
        await nursery.start(app.serve, "127.0.0.1", 0)
        await runtime.ready_event.wait()
        yield app
        nursery.cancel_scope.cancel()


@pytest.fixture
async def c() -> AsyncIterator[HTTPClient]:
    async with open_app() as app, open_memory_client(app) as client:
        await client.put("/queues/jobs")
        yield client


async def drain(client: HTTPClient) -> list[dict[str, Any]]:
    reply = await client.post("/queues/jobs/get?max=1000")
    msgs = reply.json()["messages"]
    if msgs:
        await client.post("/queues/jobs/ack", json={"lease_ids": [m["lease_id"] for m in msgs]})
    return msgs  # type: ignore[no-any-return]


async def test_an_interval_schedule_publishes_each_tick_once(autojump_clock: trio.testing.MockClock, c: HTTPClient) -> None:
    reply = await c.put(
        "/schedules/heartbeat",
        json={"exchange": "amq.default", "routing_key": "jobs", "body": "beat", "interval_s": 5,
              "properties": {"content_type": "text/plain", "headers": {"team": "ops"}}},
    )
    assert reply.status == 200, reply.body
    info = reply.json()
    assert info["changed"] and info["kind"] == "interval" and info["missed"] == "latest"
    assert info["next_tick_s"] == pytest.approx(EPOCH + trio.current_time() + 5)
    await trio.sleep(12)
    msgs = await drain(c)
    assert [m["body"] for m in msgs] == ["beat", "beat"]
    headers = msgs[0]["properties"]["headers"]
    assert headers["x-schedule"] == "heartbeat" and headers["team"] == "ops"
    assert msgs[0]["properties"]["message_id"] == "heartbeat@" + headers["x-schedule-tick"]
    assert msgs[0]["properties"]["content_type"] == "text/plain"
    listed = (await c.get("/schedules")).json()["schedules"]
    assert [s["name"] for s in listed] == ["heartbeat"] and listed[0]["ticks_fired"] == 2


async def test_a_cron_schedule_in_a_time_zone(autojump_clock: trio.testing.MockClock, c: HTTPClient) -> None:
    reply = await c.put(
        "/schedules/minutely",
        json={"routing_key": "jobs", "body_b64": "/w==", "cron": "*/1 * * * *", "timezone": "Asia/Tokyo"},
    )
    assert reply.status == 200, reply.body
    assert reply.json()["cron"] == "*/1 * * * *" and reply.json()["timezone"] == "Asia/Tokyo"
    await trio.sleep(125)
    msgs = await drain(c)
    assert len(msgs) == 2 and msgs[0]["body_b64"] == "/w=="
    ticks = [m["properties"]["headers"]["x-schedule-tick"] for m in msgs]
    assert all(t.endswith(":00.000Z") for t in ticks)


async def test_put_again_is_idempotent_pause_resume_delete(autojump_clock: trio.testing.MockClock, c: HTTPClient) -> None:
    spec = {"routing_key": "jobs", "body": "x", "interval_s": 10}
    await c.put("/schedules/s", json=spec)
    await trio.sleep(5)
    again = await c.put("/schedules/s", json=spec)
    assert again.json()["changed"] is False
    await trio.sleep(6)
    assert len(await drain(c)) == 1  # the first tick kept its time
    paused = await c.post("/schedules/s/pause")
    assert paused.json()["paused"] is True and paused.json()["next_tick"] is None
    await trio.sleep(30)
    assert await drain(c) == []
    resumed = await c.post("/schedules/s/resume")
    assert resumed.json()["paused"] is False
    await trio.sleep(10)
    assert len(await drain(c)) == 1  # ticks missed while paused are skipped
    assert (await c.delete("/schedules/s")).json() == {"deleted": "s"}
    assert_error(await c.get("/schedules/s"), 404, "not_found")
    await trio.sleep(30)
    assert await drain(c) == []


async def test_an_at_schedule_fires_once(autojump_clock: trio.testing.MockClock, c: HTTPClient) -> None:
    await c.put("/schedules/once", json={"routing_key": "jobs", "at": EPOCH + trio.current_time() + 3})
    await trio.sleep(60)
    assert len(await drain(c)) == 1
    assert (await c.get("/schedules/once")).json()["next_tick"] is None


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({"routing_key": "jobs", "cron": "* * *"}, 400, "invalid_argument"),
        ({"routing_key": "jobs", "cron": "99 * * * *"}, 400, "invalid_argument"),
        ({"routing_key": "jobs", "cron": "* * * * *", "timezone": "Nowhere/City"}, 400, "invalid_argument"),
        ({"routing_key": "jobs"}, 400, "invalid_argument"),
        ({"routing_key": "jobs", "interval_s": 5, "at": 5}, 400, "invalid_argument"),
        ({"routing_key": "jobs", "interval_s": 0.01}, 400, "invalid_argument"),
        ({"routing_key": "jobs", "at": "2020-01-01T00:00:00Z"}, 400, "invalid_argument"),
        ({"routing_key": "jobs", "interval_s": 5, "missed": "never"}, 400, "invalid_argument"),
        ({"routing_key": "jobs", "interval_s": 5, "max_missed": 0}, 400, "invalid_argument"),
        ({"routing_key": "jobs", "interval_s": 5, "body": "a", "body_b64": "YQ=="}, 400, "invalid_argument"),
        ({"routing_key": "jobs", "interval_s": 5, "properties": {"priority": "high"}}, 400, "invalid_argument"),
        ({"routing_key": "jobs", "interval_s": 5, "colour": 1}, 400, "invalid_argument"),
        ({"exchange": "nope", "routing_key": "jobs", "interval_s": 5}, 404, "not_found"),
    ],
)
async def test_bad_definitions_are_refused(autojump_clock: trio.testing.MockClock, c: HTTPClient, body: dict, status: int, code: str) -> None:
    assert_error(await c.put("/schedules/s", json=body), status, code)
    assert (await c.get("/schedules")).json() == {"schedules": []}
