"""The ``ackbus`` CLI against the fake broker (in-process), plus its entry point."""

from __future__ import annotations

import io
import subprocess
import sys

import orjson
import pytest
from trio.testing import MockClock

import client
from client.__main__ import run
from tests.client.fakebroker import FakeBroker

pytestmark = pytest.mark.anyio


class Result:
    def __init__(self, status: int, out: str, err: str) -> None:
        self.status, self.out, self.err = status, out, err


@pytest.fixture
def cli(fake: FakeBroker):  # type: ignore[no-untyped-def]
    async def invoke(*argv: str, stdin: bytes = b"") -> Result:
        out, err = io.StringIO(), io.StringIO()
        status = await run(
            ["--url", "http://fake.invalid", "--timeout", "2", *argv],
            stdin=io.BytesIO(stdin), stdout=out, stderr=err,
            open_stream=fake.open_stream, handle_signals=False,
        )
        return Result(status, out.getvalue(), err.getvalue())

    return invoke


async def test_declare_bind_publish_get(cli, fake: FakeBroker) -> None:  # type: ignore[no-untyped-def]
    assert (await cli("declare", "queue", "jobs")).status == 0
    assert (await cli("declare", "exchange", "ev", "--type", "fanout")).status == 0
    assert fake.exchanges["ev"] == "fanout"
    assert (await cli("bind", "ev", "jobs")).status == 0
    assert fake.bindings == [("ev", "jobs", "")]
    r = await cli("publish", "-e", "ev", "hello", "--content-type", "text/plain",
                  "--header", "n=3", "--message-id", "m1")
    assert r.status == 0, r.err
    (msg,) = fake.queues["jobs"].ready
    assert msg.properties == {"content_type": "text/plain", "headers": {"n": 3}, "message_id": "m1"}
    r = await cli("get", "jobs", "--requeue")
    assert (r.status, r.out) == (0, "hello\n")
    assert fake.bodies("jobs") == [b"hello"]
    r = await cli("get", "jobs", "--format", "json")
    assert r.status == 0
    obj = orjson.loads(r.out)
    assert obj["body"] == "hello" and obj["redelivered"] is True
    assert fake.bodies("jobs") == [] and fake.queues["jobs"].unacked == 0
    assert (await cli("get", "jobs")).status == 5


async def test_publish_stdin_lines_in_order_with_progress(cli, fake: FakeBroker) -> None:  # type: ignore[no-untyped-def]
    await cli("declare", "queue", "q")
    lines = b"".join(f"line {i}\n".encode() for i in range(2000)) + b"no newline at end"
    r = await cli("publish", "-k", "q", "--progress", "--max-pending", "64", stdin=lines)
    assert r.status == 0, r.err
    assert fake.bodies("q") == [f"line {i}".encode() for i in range(2000)] + [b"no newline at end"]
    assert "published 2001, confirmed 2001" in r.err


async def test_publish_failures_exit_4(cli, fake: FakeBroker) -> None:  # type: ignore[no-untyped-def]
    r = await cli("publish", "-k", "nowhere", "--mandatory", "x")
    assert r.status == 4 and "returned" in r.err
    await cli("declare", "queue", "q")
    fake.nack_ids.add("bad")
    r = await cli("publish", "-k", "q", "x", "--message-id", "bad")
    assert r.status == 4 and "nacked" in r.err
    r = await cli("publish", "-k", "nowhere", "--mandatory", stdin=b"a\nb\n")
    assert r.status == 4 and "0 of 2 confirmed" in r.err


async def test_consume_prints_then_acks(
    cli, fake: FakeBroker, conn: client.Connection, autojump_clock: MockClock  # type: ignore[no-untyped-def]
) -> None:
    async with conn.channel() as ch:
        await ch.declare_queue("q")
        for body in (b"a", b"b", b"c", b"d"):
            await ch.publish("", "q", body)
    r = await cli("consume", "q", "--count", "3", "--progress")
    assert (r.status, r.out) == (0, "a\nb\nc\n")
    assert "consumed 3 (" in r.err
    assert fake.bodies("q") == [b"d"] and fake.acked_ids and len(fake.acked_ids) == 3
    # -n 3 bounds the prefetch, and the acks wait so that no 4th is delivered
    assert [op["prefetch"] for op in fake.ops_seen if op["op"] == "consume"] == [3]
    assert [m.redelivered for m in fake.queues["q"].ready] == [False]
    r = await cli("consume", "q", "--count", "5", "--wait", "5", "--format", "json")
    assert r.status == 5
    assert [orjson.loads(line)["body"] for line in r.out.splitlines()] == ["d"]
    r = await cli("consume", "q", "--wait", "1")
    assert (r.status, r.out) == (0, "")


async def test_declare_bind_and_delete_say_what_they_did(cli, fake: FakeBroker) -> None:  # type: ignore[no-untyped-def]
    r = await cli("declare", "queue", "jobs")
    assert (r.status, r.out) == (0, "declared queue jobs\n")
    r = await cli("declare", "exchange", "ev", "--type", "fanout")
    assert (r.status, r.out) == (0, "declared exchange ev\n")
    r = await cli("bind", "ev", "jobs", "-k", "a.b")
    assert (r.status, r.out) == (0, "bound queue jobs to exchange ev (routing key 'a.b')\n")


async def test_queues_table_and_json(cli, fake: FakeBroker) -> None:  # type: ignore[no-untyped-def]
    await cli("declare", "queue", "b-queue")
    await cli("declare", "queue", "a")
    await cli("publish", "-k", "a", stdin=b"1\n2\n")
    r = await cli("queues")
    assert r.status == 0
    assert r.out.splitlines() == [
        "name     ready  unacked  consumers  durable",
        "a            2        0          0  yes",
        "b-queue      0        0          0  yes",
    ]
    r = await cli("queues", "--json")
    assert [orjson.loads(x)["name"] for x in r.out.splitlines()] == ["a", "b-queue"]


async def test_error_exit_codes(cli, fake: FakeBroker) -> None:  # type: ignore[no-untyped-def]
    r = await cli("bind", "amq.direct", "missing")
    assert r.status == 1 and "not_found" in r.err
    assert (await cli("get", "missing")).status == 1
    assert (await cli("frobnicate")).status == 2
    assert (await cli("publish", "--priority", "300", "x")).status == 2
    fake.refuse = True
    r = await cli("queues")
    assert r.status == 3 and "cannot reach" in r.err
    r = await cli("publish", "-k", "q", "x")
    assert r.status == 3


def test_entry_point_runs() -> None:
    proc = subprocess.run([sys.executable, "-m", "client", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "publish" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "client", "--url", "http://127.0.0.1:9", "--timeout", "0.5",
                           "queues"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
