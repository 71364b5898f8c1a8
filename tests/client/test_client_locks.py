"""``conn.lock()`` against the real broker (in process, through memory streams, on the
autojump clock): the block runs holding the lock, waits in line, refreshes in the
background, and is cancelled with LockLost when the lock is lost (refresh refused, or
the broker unreachable until the lock would expire)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

import client
from tests.support.app import MemoryBroker, TrioByteStream, open_memory_broker


@pytest.fixture
async def mb() -> AsyncIterator[MemoryBroker]:
    async with open_memory_broker() as broker:
        yield broker


class Opener:
    """Memory streams into the broker; ``down`` makes every new connection fail."""

    def __init__(self, mb: MemoryBroker) -> None:
        self.mb = mb
        self.down = False
        self.streams: list[TrioByteStream] = []

    async def __call__(self, endpoint: object) -> TrioByteStream:
        if self.down:
            raise OSError("connection refused")
        stream = self.mb.connect_client()
        self.streams.append(stream)
        return stream

    async def go_down(self) -> None:
        self.down = True
        for stream in self.streams:
            await trio.aclose_forcefully(stream.stream)


def connect(opener: Opener):  # type: ignore[no-untyped-def]
    return client.connect("http://broker.test:8080", open_stream=opener, request_timeout_s=5)


async def test_the_block_holds_the_lock_and_releases_it(autojump_clock: trio.testing.MockClock, mb: MemoryBroker) -> None:
    async with connect(Opener(mb)) as conn:
        async with conn.lock("nightly-report", ttl_s=30, owner="me") as lock:
            assert lock.token >= 1 and lock.owner == "me"
            (held,) = await conn.list_locks()
            assert held["owner"] == "me" and held["token"] == lock.token
        assert await conn.list_locks() == []


async def test_held_by_another_raises_lock_held(autojump_clock: trio.testing.MockClock, mb: MemoryBroker) -> None:
    async with connect(Opener(mb)) as conn:
        async with conn.lock("l", owner="a"):
            with pytest.raises(client.LockHeld) as exc:
                async with conn.lock("l", owner="b", wait_s=2):
                    pytest.fail("ran without the lock")
            assert exc.value.info["owner"] == "a"


async def test_waiters_take_turns_and_tokens_grow(autojump_clock: trio.testing.MockClock, mb: MemoryBroker) -> None:
    log: list[tuple[str, int, str]] = []
    async with connect(Opener(mb)) as conn:

        async def worker(name: str) -> None:
            async with conn.lock("l", owner=name, ttl_s=10, wait_s=60) as lock:
                log.append((name, lock.token, "in"))
                await trio.sleep(2)
                log.append((name, lock.token, "out"))

        async with trio.open_nursery() as nursery:
            for name in ("a", "b", "c"):
                nursery.start_soon(worker, name)
                await trio.testing.wait_all_tasks_blocked()
    assert [(n, e) for n, _t, e in log] == [("a", "in"), ("a", "out"), ("b", "in"), ("b", "out"), ("c", "in"), ("c", "out")]
    tokens = [t for _n, t, e in log if e == "in"]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3


async def test_the_lock_is_refreshed_while_the_block_runs(autojump_clock: trio.testing.MockClock, mb: MemoryBroker) -> None:
    async with connect(Opener(mb)) as conn:
        async with conn.lock("l", ttl_s=3, owner="me") as lock:
            await trio.sleep(20)
            (held,) = await conn.list_locks()
            assert held["owner"] == "me" and held["token"] == lock.token


async def test_a_refused_refresh_cancels_the_block(autojump_clock: trio.testing.MockClock, mb: MemoryBroker) -> None:
    core = mb.runtime.core
    reached = []
    async with connect(Opener(mb)) as conn:
        with pytest.raises(client.LockLost) as exc:
            async with conn.lock("l", ttl_s=9, owner="me") as lock:
                # an operator (or an expiry we did not see) took it away
                core.lock_release("l", "me", lock.token)
                core.lock_acquire(0, "l", "thief", 60, 0)
                mb.runtime.pump()
                await trio.sleep(60)
                reached.append(True)
        assert "refused" in exc.value.reason
    assert reached == []


async def test_an_unreachable_broker_cancels_the_block_before_the_expiry(
    autojump_clock: trio.testing.MockClock, mb: MemoryBroker
) -> None:
    opener = Opener(mb)
    async with connect(opener) as conn:
        start = trio.current_time()
        with pytest.raises(client.LockLost) as exc:
            async with conn.lock("l", ttl_s=10, owner="me"):
                await opener.go_down()
                await trio.sleep(60)
        cancelled_after = trio.current_time() - start
        assert cancelled_after < 10  # before the broker frees it
        assert "expire" in exc.value.reason
        opener.down = False
        # the broker frees it at its expiry
        info = (await conn.list_locks())[0]
        assert info["owner"] == "me"
        await trio.sleep(10 - cancelled_after + 0.1)
        assert await conn.list_locks() == []


async def test_an_error_in_the_block_comes_out_bare_and_releases(
    autojump_clock: trio.testing.MockClock, mb: MemoryBroker
) -> None:
    async with connect(Opener(mb)) as conn:
        with pytest.raises(KeyError):
            async with conn.lock("l", owner="me"):
                raise KeyError("boom")
        assert await conn.list_locks() == []
