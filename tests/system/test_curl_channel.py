"""The curl recipe of docs/protocol.md, run for real: curl talks to an in-process
broker over loopback TCP.

    producer | curl -sSN --no-progress-meter -X POST -T . \\
        -H 'Content-Type: application/x-ndjson' http://127.0.0.1:8080/channel

``-T .`` uploads stdin as a chunked body without waiting for its end, ``-N`` prints the
response as it arrives; curl sends ``Expect: 100-continue``. Skipped where curl is
absent.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from tests.support.app import open_tcp_broker
from tests.support.channel import Clients, wait_until

CURL = shutil.which("curl")
pytestmark = pytest.mark.skipif(CURL is None, reason="curl is not installed")

# A hang guard only: every step normally takes milliseconds.
GUARD_S = 30


@pytest.fixture
async def app() -> AsyncIterator[BrokerApp]:
    async with open_tcp_broker() as app:
        yield app


def curl_args(app: BrokerApp, *extra: str) -> list[str]:
    assert CURL is not None
    return [
        CURL, "-sSN", "--no-progress-meter", "-X", "POST", "-T", ".",
        "-H", "Content-Type: application/x-ndjson", *extra,
        f"http://127.0.0.1:{app.port}/channel",
    ]


def lines(*ops: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(op) + b"\n" for op in ops)


class CurlChannel:
    """curl as a child process: ops go to its stdin, events come from its stdout."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.buf = bytearray()

    async def send(self, *ops: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(lines(*ops))

    async def end_input(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    async def next_event(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while (i := self.buf.find(b"\n")) < 0:
            data = await self.process.stdout.receive_some(65536)
            if not data:
                raise EOFError(bytes(self.buf))
            self.buf += data
        line = bytes(self.buf[: i + 1])
        del self.buf[: i + 1]
        return orjson.loads(line)  # type: ignore[no-any-return]

    async def until(self, ev: str) -> list[dict[str, Any]]:
        events = []
        while True:
            events.append(await self.next_event())
            if events[-1]["ev"] == ev:
                return events

    async def rest_of_output(self) -> bytes:
        assert self.process.stdout is not None
        while data := await self.process.stdout.receive_some(65536):
            self.buf += data
        return bytes(self.buf)


@asynccontextmanager
async def open_curl(app: BrokerApp) -> AsyncIterator[CurlChannel]:
    """curl running in the background; waited for (or stopped) on exit."""
    async with trio.open_nursery() as nursery:
        process = await nursery.start(
            partial(
                trio.run_process, curl_args(app), stdin=subprocess.PIPE, stdout=subprocess.PIPE, check=False
            )
        )
        curl = CurlChannel(process)
        try:
            yield curl
        finally:
            with trio.fail_after(GUARD_S):
                await process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    await stream.aclose()


async def run_curl(app: BrokerApp, stdin: bytes, *extra: str) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(GUARD_S):
        return await trio.run_process(
            curl_args(app, *extra), stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
        )


def events_of(output: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in output.splitlines() if line.strip()]


async def test_piped_ops_get_their_events(app: BrokerApp) -> None:
    ops = lines(
        {"op": "declare_queue", "queue": "curlq", "id": 1},
        {"op": "publish", "routing_key": "curlq", "body": "hello"},
        {"op": "publish", "routing_key": "curlq", "body": "world"},
        {"op": "publish", "routing_key": "nowhere", "body": "lost", "mandatory": True},
        {"op": "close"},
    )
    result = await run_curl(app, ops)
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    events = events_of(result.stdout)
    assert events[0]["ev"] == "open"
    assert events[1] == {
        "ev": "ok", "id": 1, "op": "declare_queue", "queue": "curlq", "created": True,
        "messages": 0, "consumers": 0,
    }
    # curl may split stdin into several chunks, so acks may or may not be coalesced
    rest = [e for e in events[2:] if e["ev"] != "ack"]
    assert [e["ev"] for e in rest] == ["return", "close_ok"]
    assert rest[0]["delivery_tag"] == 3 and rest[0]["reason"] == "NO_ROUTE"
    assert [e for e in events if e["ev"] == "ack"][-1]["delivery_tag"] == 3
    assert events[-1] == {"ev": "close_ok"}
    assert app.runtime.core.queues["curlq"].ready_count() == 2


async def test_end_of_stdin_ends_the_channel(app: BrokerApp) -> None:
    # No close op: the end of stdin (curl's terminating chunk) ends the channel after
    # every publish is confirmed.
    result = await run_curl(app, lines(*[{"op": "publish", "routing_key": "x", "body": str(i)} for i in range(100)]))
    assert result.returncode == 0, result.stderr
    events = events_of(result.stdout)
    assert events[0]["ev"] == "open" and events[-1] == {"ev": "close_ok"}
    acked = [e for e in events if e["ev"] == "ack"]
    assert acked[-1]["delivery_tag"] == 100


async def test_curl_is_full_duplex(app: BrokerApp) -> None:
    # Each op is written only after the event answering the previous one was read
    # from curl's output: impossible unless the response streams while the request
    # body is still being uploaded.
    with trio.fail_after(GUARD_S):
        async with open_curl(app) as curl:
            assert (await curl.next_event())["ev"] == "open"
            await curl.send({"op": "declare_queue", "queue": "duplex"})
            await curl.until("ok")
            await curl.send({"op": "consume", "queue": "duplex", "consumer_tag": "c", "prefetch": 1})
            await curl.until("consume_ok")
            await curl.send({"op": "publish", "routing_key": "duplex", "body": "one"})
            await curl.send({"op": "publish", "routing_key": "duplex", "body": "two"})
            got = [e for e in await curl.until("deliver")]
            deliver = got[-1]
            assert deliver["message"]["body"] == "one"
            await curl.send({"op": "ack", "delivery_tag": deliver["delivery_tag"]})
            second = (await curl.until("deliver"))[-1]
            assert second["message"]["body"] == "two"
            await curl.send({"op": "ack", "delivery_tag": second["delivery_tag"]}, {"op": "close"})
            await curl.until("close_ok")
            await curl.end_input()
            assert await curl.rest_of_output() == b""
        assert curl.process.returncode == 0
    q = app.runtime.core.queues["duplex"]
    assert (q.ready_count(), q.unacked) == (0, 0)


async def test_curl_consumer_after_end_of_stdin_keeps_receiving(app: BrokerApp) -> None:
    # `echo '{"op":"consume",...}' | curl ...`: stdin ends at once, the channel stays
    # open and keeps printing deliveries until curl is stopped.
    async with Clients(app.port) as clients:
        pub = await clients.channel()
        await pub.ok({"op": "declare_queue", "queue": "tail"})
        with trio.fail_after(GUARD_S):
            async with open_curl(app) as curl:
                await curl.send({"op": "consume", "queue": "tail", "no_ack": True})
                await curl.end_input()
                await curl.until("consume_ok")
                for i in range(3):
                    await pub.send({"op": "publish", "routing_key": "tail", "body": f"t{i}"})
                    assert (await curl.until("deliver"))[-1]["message"]["body"] == f"t{i}"
                curl.process.terminate()
        await wait_until(lambda: app.runtime.core.queues["tail"].consumers == [])


async def test_errors_travel_in_band_with_status_200(app: BrokerApp) -> None:
    ops = lines({"op": "ack", "delivery_tag": 5}, {"op": "publish", "routing_key": "q", "body": "never"})
    result = await run_curl(app, ops, "-w", "\\n%{http_code}\\n")
    assert result.returncode == 0, result.stderr
    *body, status = result.stdout.strip().splitlines()
    assert status == b"200"
    events = events_of(b"\n".join(body))
    assert [e["ev"] for e in events] == ["open", "error"]
    assert events[1]["error"] == "unknown_delivery_tag"


async def test_shell_pipeline_recipe(app: BrokerApp) -> None:
    # The first example of docs/protocol.md, through a real shell pipe, output and all.
    command = (
        "printf '%s\\n' "
        "'{\"op\":\"declare_queue\",\"queue\":\"jobs\"}' "
        "'{\"op\":\"publish\",\"routing_key\":\"jobs\",\"body\":\"hello\"}' "
        f"| curl -sSN --no-progress-meter -X POST -T . "
        f"-H 'Content-Type: application/x-ndjson' http://127.0.0.1:{app.port}/channel"
    )
    with trio.fail_after(GUARD_S):
        result = await trio.run_process(["sh", "-c", command], capture_stdout=True, capture_stderr=True, check=False)
    assert result.returncode == 0, result.stderr
    first, *rest = result.stdout.decode().splitlines()
    assert orjson.loads(first)["ev"] == "open"
    assert rest == [
        '{"ev":"ok","op":"declare_queue","queue":"jobs","created":true,"messages":0,"consumers":0}',
        '{"ev":"ack","delivery_tag":1,"multiple":false}',
        '{"ev":"close_ok"}',
    ]
    assert app.runtime.core.queues["jobs"].ready_count() == 1


async def test_curl_sends_expect_100_continue_and_gets_it_at_once(app: BrokerApp) -> None:
    result = await run_curl(app, lines({"op": "close"}), "-v")
    assert result.returncode == 0, result.stderr
    log = result.stderr.decode()
    assert "> Expect: 100-continue" in log
    assert "> Transfer-Encoding: chunked" in log
    # the interim 100 comes before the final 200 (curl does not have to wait out its
    # one-second Expect timeout before uploading)
    assert log.index("< HTTP/1.1 100") < log.index("< HTTP/1.1 200")
    assert [e["ev"] for e in events_of(result.stdout)] == ["open", "close_ok"]


async def test_curl_streaming_consume(app: BrokerApp) -> None:
    assert CURL is not None
    async with Clients(app.port) as clients:
        pub = await clients.channel()
        await pub.ok({"op": "declare_queue", "queue": "feed"})
        await pub.send(*[{"op": "publish", "routing_key": "feed", "body": f"f{i}"} for i in range(3)])
        with trio.fail_after(GUARD_S):
            async with trio.open_nursery() as nursery:
                process = await nursery.start(
                    partial(
                        trio.run_process,
                        [CURL, "-sSN", f"http://127.0.0.1:{app.port}/queues/feed/stream"],
                        stdout=subprocess.PIPE,
                        check=False,
                    )
                )
                curl = CurlChannel(process)
                got = [await curl.next_event() for _ in range(3)]
                assert [g["body"] for g in got] == ["f0", "f1", "f2"]
                process.terminate()
                await process.wait()
                assert process.stdout is not None
                await process.stdout.aclose()
