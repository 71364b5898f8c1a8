"""A worker that fails a message three times, retrying it later each time, and an
operator who then finds it in the dead-letter queue with its history and redrives
it: once with plain HTTP calls (what curl sends), once with the client library."""

from __future__ import annotations

import io
import time
from pathlib import Path

import orjson
import pytest
import trio

import client
from client.__main__ import run
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

QUEUE_ARGS = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "jobs.dead", "x-delivery-limit": 2}


def test_worker_retries_with_delay_then_finds_the_message_dead_lettered_over_http(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data") as broker:
        assert broker.request("PUT", "/queues/jobs.dead", {})[0] == 201
        assert broker.request("PUT", "/queues/jobs", {"arguments": QUEUE_ARGS})[0] == 201
        # a typo in an argument is refused, naming it
        status, body = broker.request("PUT", "/queues/typo", {"arguments": {"x-delivery-limt": 2}})
        assert status == 400 and "x-delivery-limt" in body["message"]
        status, body = broker.request(
            "POST", "/exchanges/amq.default/publish?routing_key=jobs", b"resize image 7",
            headers={"X-Message-Id": "job-7"},
        )
        assert status == 200 and body["confirm"] == "ack"

        counts = []
        for attempt in range(3):
            deadline = time.monotonic() + 10
            while True:
                status, got = broker.request("POST", "/queues/jobs/get?wait=2&lease=30")
                assert status == 200
                if got["messages"]:
                    break
                assert time.monotonic() < deadline, "the retried message never came back"
            (m,) = got["messages"]
            counts.append(m["delivery_count"])
            # fails: retry in 0.3 s
            status, nacked = broker.request(
                "POST", "/queues/jobs/nack", {"lease_ids": [m["lease_id"]], "delay_s": 0.3}
            )
            assert status == 200 and nacked == {"nacked": 1}
            if attempt < 2:
                info = broker.request("GET", "/queues/jobs")[1]
                assert info["messages_delayed"] == 1 and info["messages_ready"] == 0
        assert counts == [0, 1, 2]
        headers = m["properties"]["headers"]
        assert headers["x-delivery-count"] == 2  # a redelivery says so in its headers too

        # the third failure passed the delivery limit: the operator finds it, with its history
        status, seen = broker.request("GET", "/queues/jobs.dead/messages?limit=10")
        assert status == 200
        (dead,) = seen["messages"]
        assert dead["body"] == "resize image 7" and dead["state"] == "ready"
        assert abs(dead["enqueued_at"] - time.time()) < 60
        assert dead["properties"]["message_id"] == "job-7"
        assert [(d["queue"], d["reason"], d["count"]) for d in dead["x_death"]] == [("jobs", "delivery_limit", 1)]
        assert broker.request("GET", "/queues/jobs.dead")[1]["messages_ready"] == 1  # browsing took nothing
        status, metrics = broker.request("GET", "/metrics")
        assert b'ackbus_messages_dead_lettered_total{queue="jobs",reason="delivery_limit"} 1' in metrics

        # ... fixes the bug, and redrives it to where it came from
        status, body = broker.request("POST", "/queues/jobs.dead/redrive", {"count": 10})
        assert (status, body) == (200, {"moved": 1})
        status, got = broker.request("POST", "/queues/jobs/get?wait=5")
        (m,) = got["messages"]
        assert m["body"] == "resize image 7" and m["delivery_count"] == 0
        assert m["properties"]["headers"]["x-death"][0]["reason"] == "delivery_limit"


async def test_worker_retries_with_delay_then_finds_the_message_dead_lettered_with_the_client(async_broker: BrokerProcess) -> None:
    broker = async_broker
    async with client.connect(broker.url) as conn:
        async with conn.channel() as ch:
            await ch.declare_queue("jobs.dead")
            await ch.declare_queue(
                "jobs", dead_letter_exchange="", dead_letter_routing_key="jobs.dead", delivery_limit=2
            )  # (the same as QUEUE_ARGS)
            await ch.publish("", "jobs", b"job", delay_s=0.2)  # enters the queue a little later
            seen = []
            async with ch.consume("jobs") as messages:
                with trio.fail_after(10):
                    for _ in range(3):
                        msg = await messages.receive()
                        seen.append((msg.delivery_count, msg.redelivered))
                        assert await msg.nack(delay_s=0.2)
            assert seen == [(0, False), (1, True), (2, True)]
            async with ch.consume("jobs.dead") as dead:
                with trio.fail_after(10):
                    msg = await dead.receive()
                assert msg.body == b"job"
                (death,) = msg.death
                assert (death.queue, death.reason, death.count) == ("jobs", "delivery_limit", 1)
                assert death.routing_keys == ["jobs"]
                await msg.ack()
            with pytest.raises(ValueError):
                await ch.publish("", "jobs", b"x", delay_s=-1)


async def test_cli_peeks_redrives_purges_and_deletes(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    await trio.to_thread.run_sync(broker.start)

    async def cli(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        status = await run(["--url", broker.url, "--timeout", "10", *argv], stdout=out, stderr=err, handle_signals=False)
        return status, out.getvalue(), err.getvalue()

    try:
        request = broker.request
        assert request("PUT", "/queues/jobs.dead", {})[0] == 201
        assert request("PUT", "/queues/jobs", {"arguments": {"x-dead-letter-exchange": "",
                                                             "x-dead-letter-routing-key": "jobs.dead"}})[0] == 201
        for body in (b"a", b"b"):
            assert request("POST", "/exchanges/amq.default/publish?routing_key=jobs", body)[0] == 200
        _s, got = request("POST", "/queues/jobs/get?max=2")
        lease_ids = [m["lease_id"] for m in got["messages"]]
        assert request("POST", "/queues/jobs/nack", {"lease_ids": lease_ids, "requeue": False})[0] == 200

        status, out, _err = await cli("peek", "jobs.dead")
        peeked = [orjson.loads(line) for line in out.splitlines()]
        assert status == 0 and [m["body"] for m in peeked] == ["a", "b"]
        assert peeked[0]["x_death"][0]["reason"] == "rejected"
        assert (await cli("redrive", "jobs.dead", "-n", "1"))[:2] == (0, "moved 1\n")
        assert request("GET", "/queues/jobs")[1]["messages_ready"] == 1
        assert (await cli("purge", "jobs"))[:2] == (0, "purged 1\n")
        assert (await cli("delete", "queue", "jobs.dead"))[0] == 0
        assert request("GET", "/queues/jobs.dead")[0] == 404
        status, _out, err = await cli("redrive", "jobs.dead")
        assert status == 1 and "jobs.dead" in err
    finally:
        await trio.to_thread.run_sync(broker.stop)

