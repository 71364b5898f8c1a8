"""The client against a real broker subprocess: kill -9 and restarts under a producer
and a consumer, SIGTERM to a worker process, and the CLI.

Slow (subprocesses, real fsyncs): run with ``-m slow`` or the whole suite.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import orjson
import pytest

import client
from client import ReconnectPolicy
from tests.support.broker import ROOT, BrokerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

POLICY = ReconnectPolicy(initial_delay_s=0.05, max_delay_s=0.5, give_up_after_s=60)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[BrokerProcess]:
    # A SIGTERM (``_restart(..., "terminate")``) lands while the test, awaiting it, holds
    # a prefetch of deliveries unacked: the broker waits out its whole shutdown timeout
    # for them (10 s by default; the same graceful path in 2 s)
    proc = BrokerProcess(tmp_path / "data", args=("--shutdown-timeout-s", "2"))
    await anyio.to_thread.run_sync(proc.start)
    try:
        yield proc
    finally:
        await anyio.to_thread.run_sync(proc.stop)


async def _restart(broker: BrokerProcess, how: str) -> None:
    if how == "kill":
        await anyio.to_thread.run_sync(broker.kill)
    else:
        code = await anyio.to_thread.run_sync(broker.terminate)
        assert code == 0, broker.log_tail()
    await anyio.to_thread.run_sync(broker.start)


async def _drain(conn: client.Connection, queue: str, expected: int) -> list[bytes]:
    """Consume (and ack) until `expected` messages arrived or the queue stays quiet."""
    bodies: list[bytes] = []
    async with conn.channel() as ch, ch.consume(queue, prefetch=500) as messages:
        while len(bodies) < expected:
            with anyio.move_on_after(10) as idle:
                msg = await messages.receive()
            if idle.cancelled_caught:
                break
            bodies.append(msg.body)
            await msg.ack()
        with anyio.move_on_after(0.5):  # anything beyond `expected` would be a duplicate
            msg = await messages.receive()
            bodies.append(msg.body)
            await msg.ack()
    return bodies


async def test_producers_publish_10000_confirmed_across_two_kill9_restarts(broker: BrokerProcess) -> None:
    producers, per_producer = 2, 5000
    async with client.connect(broker.url, reconnect=POLICY, max_pending=300) as conn:
        async with conn.channel() as ch:
            await ch.declare_queue("q")
        handles: list[list[client.PendingPublish]] = [[] for _ in range(producers)]
        confirmed = [0] * producers
        stats: list[client.ChannelStatistics] = []

        async def produce(p: int) -> None:
            async with conn.channel() as ch:
                for i in range(per_producer):
                    handle = await ch.start_publish(
                        "", "q", f"{p}:{i}".encode(), properties={"message_id": f"p{p}-{i}"})
                    handles[p].append(handle)
                    confirmed[p] = ch.statistics().confirmed
                await ch.wait_for_confirms()
                stats.append(ch.statistics())

        async def killer() -> None:
            for threshold in (2500, 6000):
                while sum(confirmed) < threshold:
                    await anyio.sleep(0.01)
                await _restart(broker, "kill")

        with anyio.fail_after(120):
            async with anyio.create_task_group() as nursery:
                nursery.start_soon(killer)
                for p in range(producers):
                    nursery.start_soon(produce, p)
        # The first kill hits both producers mid-stream (the second may come after one
        # of them finished).
        assert all(st.failed == 0 and st.reconnects >= 1 for st in stats), stats
        assert sum(st.resent for st in stats) > 0, stats
        for p in range(producers):
            assert len(handles[p]) == per_producer
            for h in handles[p]:
                assert await h == h.message_id  # every publish confirmed, none failed

        bodies = await _drain(conn, "q", producers * per_producer)
    assert len(bodies) == len(set(bodies)) == producers * per_producer  # exactly once
    for p in range(producers):
        seq = [int(b.split(b":")[1]) for b in bodies if b.startswith(f"{p}:".encode())]
        assert seq == list(range(per_producer))  # in per-producer order


@pytest.mark.parametrize("how", ["kill", "terminate"])
async def test_consumer_keeps_consuming_across_a_broker_restart(broker: BrokerProcess, how: str) -> None:
    n = 2000
    async with client.connect(broker.url, reconnect=POLICY) as conn:
        async with conn.channel() as ch:
            await ch.declare_queue("work")
            for i in range(n):
                await ch.start_publish("", "work", f"{i}".encode())
            await ch.wait_for_confirms()
        seen: list[int] = []
        with anyio.fail_after(90):
            async with conn.channel() as ch, ch.consume("work", prefetch=50) as messages:
                restarted = False
                async for msg in messages:
                    seen.append(int(msg.body))
                    await msg.ack()
                    if len(seen) == n // 3 and not restarted:
                        restarted = True
                        await _restart(broker, how)
                    if len(set(seen)) == n:
                        break
                assert ch.statistics().reconnects >= 1
    assert set(seen) == set(range(n))  # at least once, none lost


async def test_worker_process_stops_gracefully_on_sigterm(
    broker: BrokerProcess, tmp_path: Path, anyio_backend: str
) -> None:
    """The example worker, on the test's event loop (trio or asyncio), on SIGTERM."""
    n = 300
    async with client.connect(broker.url, reconnect=POLICY) as conn:
        async with conn.channel() as ch:
            await ch.declare_queue("jobs")
            for i in range(n):
                await ch.start_publish("", "jobs", f"{i}".encode(), properties={"message_id": f"m{i}"})
            await ch.wait_for_confirms()

        journal = tmp_path / "journal.txt"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = await anyio.open_process(
            [sys.executable, str(ROOT / "scripts" / "examples" / "worker.py"), "--url", broker.url,
             "--queue", "jobs", "--prefetch", "20", "--work-ms", "20", "--journal", str(journal),
             "--backend", anyio_backend],
            env=env,
        )
        try:
            with anyio.fail_after(60):
                while not journal.exists() or journal.read_text().count("acked") < 30:
                    await anyio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(20):
                code = await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert code == 0

        lines = journal.read_text().split()
        entries = list(zip(lines[::2], lines[1::2]))
        handled = [mid for kind, mid in entries if kind == "handled"]
        acked = [mid for kind, mid in entries if kind == "acked"]
        assert len(acked) == len(set(acked))  # nothing acked twice
        assert set(acked) <= set(handled)  # every acked message was fully handled
        assert not [mid for kind, mid in entries if kind == "stale"]

        remaining = await _drain(conn, "jobs", n - len(acked))
    remaining_ids = {f"m{int(b)}" for b in remaining}
    assert len(remaining) == len(remaining_ids)
    assert remaining_ids == {f"m{i}" for i in range(n)} - set(acked)  # the rest is back


async def test_cli_against_the_real_broker(broker: BrokerProcess) -> None:
    async def ackbus(*argv: str, stdin: bytes = b"") -> tuple[int, str]:
        proc = await anyio.run_process(
            [sys.executable, "-m", "client", "--url", broker.url, "--timeout", "10", *argv],
            input=stdin, check=False, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        return proc.returncode, proc.stdout.decode() + proc.stderr.decode()

    assert (await ackbus("declare", "queue", "cliq"))[0] == 0
    assert (await ackbus("declare", "exchange", "clix", "--type", "fanout"))[0] == 0
    code, out = await ackbus("declare", "exchange", "clid", "--type", "x-delayed-message", "--arg", "x-delayed-type=direct")
    assert code == 0, out
    assert (await ackbus("bind", "clix", "cliq"))[0] == 0
    code, out = await ackbus("publish", "-e", "clix", stdin=b"".join(b"%d\n" % i for i in range(100)))
    assert code == 0, out
    code, out = await ackbus("queues")
    assert code == 0 and any(line.split()[:2] == ["cliq", "100"] for line in out.splitlines()), out
    code, out = await ackbus("consume", "cliq", "--count", "10")
    assert code == 0 and out.split() == [str(i) for i in range(10)]
    code, out = await ackbus("get", "cliq", "--count", "5")
    assert code == 0 and out.split() == [str(i) for i in range(10, 15)]
    code, out = await ackbus("publish", "-k", "nowhere", "--mandatory", "x")
    assert code == 4, out
    code, out = await ackbus("exchanges")
    rows = [line.split() for line in out.splitlines()]
    assert code == 0 and rows[0][:3] == ["name", "type", "durable"] and ["clix", "fanout", "yes", "no", "{}"] in rows, out
    assert any(row[:2] == ["clid", "x-delayed-message"] for row in rows), out
    code, out = await ackbus("bindings", "--json")
    assert code == 0 and [orjson.loads(line)["queue"] for line in out.splitlines()] == ["cliq"], out
    async with client.connect(broker.url) as conn, conn.channel() as ch, ch.consume("cliq", prefetch=1):
        code, out = await ackbus("connections")
        rows = [line.split() for line in out.splitlines()]
        assert code == 0 and rows[0][:3] == ["id", "kind", "remote"], out
        assert len(rows) == 2 and rows[1][1] == "channel" and rows[1][3].startswith("ackbus-client/"), out
        assert rows[1][-1].startswith("cliq(") and rows[1][5] == "1", out
        code, out = await ackbus("close-channel", rows[1][0], "--reason", "moving the worker")
        assert code == 0 and out.strip() == f"closed channel {rows[1][0]}: moving the worker", out
        code, out = await ackbus("close-channel", "999999")
        assert code == 1 and "no open channel" in out, out
    code, out = await ackbus("overview")
    assert code == 0 and "version" in out and "queues" in out, out
    code, out = await ackbus("--version")
    assert code == 0 and out.strip() == f"ackbus {client.__version__}", out
    code, out = await ackbus("--url", broker.url.removeprefix("http://"), "delete", "exchange", "clix")
    assert code == 0 and out.strip() == "deleted exchange clix", out
    code, out = await ackbus("bindings")
    assert code == 0 and len(out.splitlines()) == 1, out  # the header only: the binding went with it
    code, out = await ackbus("get", "no-such-queue")
    assert code == 1, out


async def test_channel_errors_are_blamed_on_their_operation(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "data", args=("--max-body-bytes", "1024"))
    await anyio.to_thread.run_sync(proc.start)
    try:
        async with client.connect(proc.url, reconnect=POLICY) as conn:
            async with conn.channel() as ch:
                await ch.declare_queue("q")
                small1 = ch.publish_nowait("", "q", b"a")
                big = ch.publish_nowait("", "q", b"x" * 2048)
                small2 = ch.publish_nowait("", "q", b"b")
                await small1
                with pytest.raises(client.PublishRefused) as refused:
                    await big
                assert refused.value.code == "payload_too_large"
                await small2
                with pytest.raises(client.ChannelClosedByBroker):
                    await ch.declare_queue("q", durable=False)  # exists with other settings
                # a refused consume right after: the broker's refusal, as on a fresh channel
                with pytest.raises(client.ChannelClosedByBroker):
                    async with ch.consume("missing"):
                        pass  # pragma: no cover
                await ch.publish("", "q", b"c")
                with pytest.raises(client.PublishNacked):
                    await ch.publish("no-such-exchange", "q", b"d")
            bodies = await _drain(conn, "q", 3)
        assert bodies == [b"a", b"b", b"c"]
    finally:
        await anyio.to_thread.run_sync(proc.stop)


async def test_ack_timeout_and_touch(broker: BrokerProcess) -> None:
    """A consumer's ``ack_timeout_s`` reaches the broker: an untouched delivery expires
    and comes back redelivered (its late ack returns False); one that is touched in
    time stays with the consumer."""
    async with client.connect(broker.url) as conn, conn.channel() as ch:
        await ch.declare_queue("slow")
        await ch.publish("", "slow", b"touched")
        with anyio.fail_after(20):
            # 1 s timeout, touched every 0.1 s: a stall of 0.9 s would be needed to lose it
            async with ch.consume("slow", prefetch=1, ack_timeout_s=1.0) as messages:
                msg = await messages.receive()
                assert msg.body == b"touched" and not msg.redelivered
                for _ in range(25):  # 2.5 s in all, well past the timeout
                    await anyio.sleep(0.1)
                    assert await msg.touch()
                assert await msg.ack()

                await ch.publish("", "slow", b"forgotten")
                msg = await messages.receive()
                assert msg.body == b"forgotten" and not msg.redelivered
                again = await messages.receive()  # comes once the first delivery expired
                assert again.body == b"forgotten" and again.redelivered
                assert not await msg.ack()  # expired: the broker took it back
                assert await again.ack()
    with pytest.raises(ValueError):
        async with client.connect(broker.url) as conn, conn.channel() as ch:
            async with ch.consume("slow", ack_timeout_s=0):
                pass


async def test_a_lock_is_held_refreshed_and_released_on_either_event_loop(broker: BrokerProcess) -> None:
    """``conn.lock()`` (docs/coordination.md) under trio and under asyncio: held with
    its token past its first ttl (the background refresh), then released; a second
    owner meanwhile is told who holds it."""
    async with client.connect(broker.url, reconnect=POLICY) as conn:
        async with conn.lock("nightly", ttl_s=1.0, owner="first") as lock:
            assert lock.token >= 1
            import time
            from datetime import datetime

            from tests.support.wait import wait_until_sync

            first_expiry = (await anyio.to_thread.run_sync(broker.request, "GET", "/locks/nightly"))[1]["expires_at"]
            first_expiry_s = datetime.fromisoformat(first_expiry.replace("Z", "+00:00")).timestamp()

            def held_past_its_first_ttl() -> dict | None:
                # past the first expiry and still held: only a refresh keeps it
                status, info = broker.request("GET", "/locks/nightly")
                past = time.time() > first_expiry_s + 0.1
                return info if status == 200 and info["held"] and past and info["expires_at"] > first_expiry else None

            info = await anyio.to_thread.run_sync(wait_until_sync, held_past_its_first_ttl, 15.0)
            assert info["owner"] == "first" and info["token"] == lock.token
            with pytest.raises(client.LockHeld):
                async with conn.lock("nightly", ttl_s=1.0, owner="second"):
                    raise AssertionError("granted while held")
        status, info = await anyio.to_thread.run_sync(broker.request, "GET", "/locks/nightly")
        assert status == 200 and not info["held"]
