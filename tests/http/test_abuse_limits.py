"""Abuse limits with a well-behaved client alongside: while slowloris clients drip
headers and idle ones hold connections, another client is served at once, and the
abusers are cut at ``header_timeout_s`` / ``idle_timeout_s`` (docs/security.md)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from broker.http import HTTPServer, Limits, Request, Response, Router

GET = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"


def app() -> Router:
    router = Router()

    @router.route("GET", "/ok")
    async def ok(request: Request, response: Response) -> None:
        await response.send_json(200, {"ok": True})

    return router


async def test_slowloris_and_idle_clients_do_not_starve_a_good_one(autojump_clock: trio.testing.MockClock) -> None:
    limits = Limits(header_timeout_s=10, idle_timeout_s=60, send_timeout_s=None)
    server = HTTPServer(app(), limits=limits)
    ended: dict[str, float] = {}
    async with trio.open_nursery() as nursery:

        def connect() -> trio.abc.Stream:
            client, server_side = trio.testing.memory_stream_pair()
            nursery.start_soon(server.serve_stream, server_side)
            return client

        async def slowloris(name: str) -> None:
            stream = connect()
            await stream.send_all(b"GET /ok HTTP/1.1\r\n")

            async def drip() -> None:
                try:
                    for _ in range(100):
                        await trio.sleep(3)
                        await stream.send_all(b"X")
                except trio.BrokenResourceError:
                    pass

            async with trio.open_nursery() as inner:
                inner.start_soon(drip)
                answer = await stream.receive_some()
                assert answer.startswith(b"HTTP/1.1 408"), answer
                ended[name] = trio.current_time()
                inner.cancel_scope.cancel()

        async def idle(name: str) -> None:
            stream = connect()
            await stream.send_all(GET)
            assert (await stream.receive_some()).startswith(b"HTTP/1.1 200")
            while await stream.receive_some():
                pass
            ended[name] = trio.current_time()

        start = trio.current_time()
        for i in range(50):
            nursery.start_soon(slowloris, f"slow{i}")
            nursery.start_soon(idle, f"idle{i}")
        await trio.sleep(5)  # the attack is under way
        good = connect()
        for _ in range(3):
            await good.send_all(GET)
            assert (await good.receive_some()).startswith(b"HTTP/1.1 200")
        assert trio.current_time() - start == pytest.approx(5.0)  # served without waiting
        assert server.statistics().open_connections == 101
        await trio.sleep(100)
        assert server.statistics().open_connections == 0  # the good one idled out too
        nursery.cancel_scope.cancel()
    for name, at in ended.items():
        # a dripping head is cut 10 s after it began; an idle keep-alive after 60 s
        assert at - start == pytest.approx(10.0 if name.startswith("slow") else 60.0), name
    assert len(ended) == 100
