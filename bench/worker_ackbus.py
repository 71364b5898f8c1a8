"""The ackbus side of every workload, with ackbus's own client library (``client``).

One process runs one operation (see ``bench.workercommon`` for the handshake). Every
message is persistent (``delivery_mode`` 2) to a durable queue; publishes are confirmed
(confirms are always on in an ackbus channel). A channel whose connection dropped and
reconnected would still give correct counts (the client resends with the same message
id, the broker deduplicates), but the numbers would not mean much: the result carries
the channel statistics and the harness refuses a run with reconnects. The client runs
under trio, or under asyncio with ``scripts/bench --client-backend asyncio``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Any

import anyio
import anyio.to_thread

import client
from bench.workercommon import (
    body_of,
    emit_result,
    latency_summary,
    read_spec,
    signal_ready,
    stamp_of,
    stamped_body,
    wait_go,
)

PERSISTENT = client.Properties(delivery_mode=2)


async def _handshake() -> None:
    signal_ready()
    await anyio.to_thread.run_sync(wait_go)


async def _declare(ch: client.Channel, spec: dict[str, Any]) -> None:
    arguments = spec.get("queue_arguments") or {}
    for queue in spec.get("queues", ()):
        await ch.declare_queue(queue, durable=True, arguments=arguments.get(queue))
    fanout = spec.get("fanout")
    if fanout:
        await ch.declare_exchange(fanout, "fanout", durable=True)
        for queue in spec.get("queues", ()):
            await ch.bind_queue(queue, fanout, "")


def _stats(ch: client.Channel) -> dict[str, int]:
    s = ch.statistics()
    return {"reconnects": s.reconnects, "resent": s.resent, "failed": s.failed}


async def publish_seq(spec: dict[str, Any]) -> dict[str, Any]:
    """One publish at a time, each awaited until confirmed."""
    body = body_of(spec["size"])
    exchange, key = spec.get("exchange", ""), spec["routing_key"]
    async with client.connect(spec["url"], ca_file=spec.get("ca_file")) as conn, conn.channel() as ch:
        await _declare(ch, spec)
        await _handshake()
        warm_until = time.perf_counter() + spec["warmup_s"]
        while time.perf_counter() < warm_until:
            await ch.publish(exchange, key, body, properties=PERSISTENT)
        latencies: list[float] = []
        start = time.perf_counter()
        deadline = start + spec["duration_s"]
        end = start
        while end < deadline:
            t = time.perf_counter()
            await ch.publish(exchange, key, body, properties=PERSISTENT)
            end = time.perf_counter()
            latencies.append(end - t)
        stats = _stats(ch)
    return {"count": len(latencies), "elapsed_s": end - start, **latency_summary(latencies), **stats}


async def publish_pipelined(spec: dict[str, Any]) -> dict[str, Any]:
    """Keep up to ``window`` publishes unconfirmed; stop at ``count`` or ``duration_s``.

    The channel's pending buffer (``max_pending``) is the window: ``start_publish``
    waits for room, so at most ``window`` messages are ever unconfirmed. With
    ``channels``: k (default 1), k channels of one connection (each its own TCP
    connection, as every ackbus channel) publish at once, one task each in a task
    group, each with its own window; ``count`` is shared among them.
    """
    window = spec["window"]
    k = spec.get("channels") or 1
    async with client.connect(spec["url"], ca_file=spec.get("ca_file"), max_pending=window) as conn:
        async with contextlib.AsyncExitStack() as stack:
            channels = [await stack.enter_async_context(conn.channel()) for _ in range(k)]
            await _declare(channels[0], spec)
            await _handshake()
            start, cpu0 = time.perf_counter(), time.process_time()
            deadline = start + spec.get("duration_s", math.inf)
            total = spec.get("count") or math.inf
            if k == 1:
                sent = [await _pipeline(channels[0], spec, total, deadline)]
            else:
                sent = [0] * k

                async def lane(i: int) -> None:
                    share = total if math.isinf(total) else total // k + (i < total % k)
                    sent[i] = await _pipeline(channels[i], spec, share, deadline)

                async with anyio.create_task_group() as tg:
                    for i in range(k):
                        tg.start_soon(lane, i)
            elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu0
            stats = [_stats(ch) for ch in channels]
    summed = {key: sum(s[key] for s in stats) for key in stats[0]}
    return {"count": sum(sent), "elapsed_s": elapsed, "cpu_s": cpu_s, "channels": k, **summed}


async def _pipeline(ch: client.Channel, spec: dict[str, Any], count: float, deadline: float) -> int:
    """Publish on ``ch`` until ``count`` or ``deadline``, then wait for every confirm;
    return how many were published."""
    body = body_of(spec["size"])
    exchange, key = spec.get("exchange", ""), spec["routing_key"]
    sent = 0
    delay_s = spec.get("delay_s")
    # with "priorities": N, message i carries priority i % N
    props = [client.Properties(delivery_mode=2, priority=i) for i in range(spec.get("priorities") or 0)]
    props = props or [PERSISTENT]
    levels = len(props)
    while sent < count:
        await ch.start_publish(exchange, key, body, properties=props[sent % levels], delay_s=delay_s)
        sent += 1
        if time.perf_counter() >= deadline:
            break
    await ch.wait_for_confirms()
    return sent


async def consume(spec: dict[str, Any]) -> dict[str, Any]:
    """Settle ``count`` messages, one op per message: an ack; with ``nack_every`` N,
    every Nth first delivery is nacked back to the queue instead (a retry: it counts
    once acked); with ``reject_all``, every one is rejected (dead-lettered)."""
    count = spec["count"]
    nack_every = spec.get("nack_every") or 0
    reject_all = spec.get("reject_all", False)
    async with client.connect(spec["url"], ca_file=spec.get("ca_file")) as conn, conn.channel() as ch:
        await _handshake()
        received = deliveries = 0
        start = time.perf_counter()
        async with ch.consume(spec["queue"], prefetch=spec["prefetch"]) as messages:
            async for message in messages:
                deliveries += 1
                if reject_all:
                    await message.reject()
                elif nack_every and message.delivery_count == 0 and deliveries % nack_every == 0:
                    await message.nack()
                    continue
                else:
                    await message.ack()
                received += 1
                if received >= count:
                    break
        elapsed = time.perf_counter() - start
        stats = _stats(ch)
    return {"count": received, "elapsed_s": elapsed, **stats}


async def e2e_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """Receive stamped messages; latency = now - the publisher's stamp."""
    total, warmup = spec["total"], spec["warmup_count"]
    latencies: list[float] = []
    received = 0
    async with client.connect(spec["url"], ca_file=spec.get("ca_file")) as conn, conn.channel() as ch:
        await _declare(ch, spec)
        async with ch.consume(spec["queue"], prefetch=spec["prefetch"]) as messages:
            await _handshake()
            with anyio.move_on_after(spec["timeout_s"]):
                async for message in messages:
                    now = time.monotonic_ns()
                    sent_ns, seq = stamp_of(message.body)
                    if seq >= warmup:
                        latencies.append((now - sent_ns) / 1e9)
                    await message.ack()
                    received += 1
                    if seq >= total - 1:
                        break
        stats = _stats(ch)
    return {"received": received, **latency_summary(latencies), **stats}


async def e2e_publish(spec: dict[str, Any]) -> dict[str, Any]:
    """Publish ``total`` stamped messages at a fixed rate (pipelined confirms).

    Message i is due at start + i/rate; all messages that are due go out, then the
    publisher sleeps until the next is due. The stamp is taken just before the
    message is handed to the client library.
    """
    size, rate, total = spec["size"], spec["rate"], spec["total"]
    key = spec["routing_key"]
    async with client.connect(spec["url"], ca_file=spec.get("ca_file")) as conn, conn.channel() as ch:
        await _declare(ch, spec)
        await _handshake()
        start_ns = time.monotonic_ns()
        interval_ns = 1e9 / rate
        seq = 0
        while seq < total:
            now = time.monotonic_ns()
            while seq < total and start_ns + seq * interval_ns <= now:
                await ch.start_publish("", key, stamped_body(size, seq), properties=PERSISTENT)
                seq += 1
                now = time.monotonic_ns()
            if seq < total:
                await anyio.sleep(max(0.0, (start_ns + seq * interval_ns - time.monotonic_ns()) / 1e9))
        elapsed = (time.monotonic_ns() - start_ns) / 1e9
        await ch.wait_for_confirms()
        stats = _stats(ch)
    return {"count": total, "rate": total / elapsed, **stats}


async def get_any_consume(spec: dict[str, Any]) -> dict[str, Any]:
    """Long-poll ``POST /get`` over ``queues`` (REST leases), ack what comes; latency =
    now - the publisher's stamp."""
    total, warmup = spec["total"], spec["warmup_count"]
    latencies: list[float] = []
    received = 0
    async with client.connect(spec["url"], ca_file=spec.get("ca_file")) as conn:
        for queue in spec["queues"]:
            await conn.declare_queue(queue)
        await _handshake()
        with anyio.move_on_after(spec["timeout_s"]):
            while received < total:
                got = await conn.get_any(spec["queues"], max_messages=spec["max"], wait_s=5, lease_s=30)
                now = time.monotonic_ns()
                for message in got:
                    _sent_ns, seq = stamp_of(message.body)
                    if seq >= warmup:
                        latencies.append((now - _sent_ns) / 1e9)
                if got:
                    await conn.ack_leases(got[0].queue, [m.lease_id for m in got])
                received += len(got)
    return {"received": received, **latency_summary(latencies), "reconnects": 0, "resent": 0, "failed": 0}


async def tx_publish(spec: dict[str, Any]) -> dict[str, Any]:
    """Transactions of ``per_tx`` publishes, one after another (``start_publish`` in
    ``ch.transaction()``; the block ends once the commit is on disk)."""
    body = body_of(spec["size"])
    key, per_tx = spec["routing_key"], spec["per_tx"]
    async with client.connect(spec["url"], ca_file=spec.get("ca_file"), max_pending=max(per_tx, 1)) as conn, conn.channel() as ch:
        await _declare(ch, spec)
        await _handshake()
        commits = 0
        start = time.perf_counter()
        deadline = start + spec["duration_s"]
        end = start
        while end < deadline:
            async with ch.transaction():
                for _ in range(per_tx):
                    await ch.start_publish("", key, body, properties=PERSISTENT)
            commits += 1
            end = time.perf_counter()
        stats = _stats(ch)
    return {"commits": commits, "count": commits * per_tx, "elapsed_s": end - start, **stats}


async def lock_roundtrips(spec: dict[str, Any]) -> dict[str, Any]:
    """``async with conn.lock(...)`` blocks with an empty body, one after another: each
    is an acquire and a release, each answered once its record is on disk."""
    count = 0
    async with client.connect(spec["url"]) as conn:
        await _handshake()
        start = time.perf_counter()
        deadline = start + spec["duration_s"]
        end = start
        while end < deadline:
            async with conn.lock(spec["lock"], ttl_s=30, owner=spec["owner"]):
                pass
            count += 1
            end = time.perf_counter()
    return {"roundtrips": count, "elapsed_s": end - start, "reconnects": 0, "resent": 0, "failed": 0}


OPS = {
    "lock_roundtrips": lock_roundtrips,
    "publish_seq": publish_seq,
    "publish_pipelined": publish_pipelined,
    "consume": consume,
    "e2e_consume": e2e_consume,
    "e2e_publish": e2e_publish,
    "get_any_consume": get_any_consume,
    "tx_publish": tx_publish,
}


def main() -> None:
    spec = read_spec()
    # The client runs under trio (the default) or asyncio (uvloop when installed):
    # scripts/bench --client-backend sets this for every worker.
    backend = os.environ.get("ACKBUS_BENCH_CLIENT_BACKEND", "trio")
    options: dict[str, Any] = {}
    if backend == "asyncio":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            pass
        else:
            options["use_uvloop"] = True
    result = anyio.run(OPS[spec["op"]], spec, backend=backend, backend_options=options)
    emit_result(result)


if __name__ == "__main__":
    main()
