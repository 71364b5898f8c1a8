"""The client given several nodes of a cluster: when the node it is connected to
dies, it moves to another, resends what was not confirmed (deduplicated by message id
at the queue's owner) and re-subscribes its consumer: nothing lost, nothing
published twice (real etcd, real broker subprocesses)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

import client
from tests.cluster.conftest import cluster_nodes, wait_for
from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow

Nodes = Callable[[str], BrokerProcess]
COUNT = 300


def test_the_client_moves_to_another_node_without_losing_or_duplicating(nodes: Nodes) -> None:
    a, b, c = nodes("a"), nodes("b"), nodes("c")
    wait_for("three alive", lambda: sum(n["alive"] for n in cluster_nodes(a).values()) == 3)
    status, _ = c.request("PUT", "/queues/orders", {"arguments": {"x-queue-leader-locator": "client-local"}})
    assert status == 201
    wait_for("orders seen on a and b", lambda: a.request("GET", "/queues/orders")[0] == b.request("GET", "/queues/orders")[0] == 200)
    consumed: list[str] = []

    async def main() -> None:
        async with client.connect(f"{a.url},{b.url}", connect_timeout_s=5) as conn:
            async with conn.channel() as pub, conn.channel() as sub:
                async def consume(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                    async with sub.consume("orders", prefetch=20) as messages:
                        task_status.started()
                        async for message in messages:
                            consumed.append(message.body.decode())
                            await message.ack()
                            if len(set(consumed)) == COUNT:
                                return

                with trio.fail_after(120):
                    async with trio.open_nursery() as nursery:
                        await nursery.start(consume)
                        for i in range(COUNT):
                            await pub.start_publish("", "orders", f"m{i}")
                            if i == COUNT // 3:
                                await trio.to_thread.run_sync(a.kill)  # the node both channels are on
                        await pub.wait_for_confirms(timeout_s=60)

    trio.run(main)
    assert sorted(set(consumed), key=lambda s: int(s[1:])) == [f"m{i}" for i in range(COUNT)]
    # the owner holds no duplicate: everything was consumed and acked exactly once there
    wait_for("orders empty on its owner", lambda: c.request("GET", "/queues/orders")[1]["messages_ready"] == 0)
    info = c.request("GET", "/queues/orders")[1]
    assert info["messages_unacked"] == 0
    assert c.drain("orders") == []
    stats = c.request("GET", "/overview")[1]["stats"]
    assert stats["acked"] == COUNT, stats  # each message taken once: resends were deduplicated


def test_the_cli_takes_several_nodes_and_skips_a_dead_one(nodes: Nodes) -> None:
    import subprocess
    import sys

    from tests.support.broker import ROOT, free_port

    a = nodes("a")
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-m", "client", "--url", f"{dead},{a.url}", "cluster"],
        capture_output=True, text=True, timeout=60, cwd=str(ROOT),
    )
    assert done.returncode == 0, done.stderr
    assert "a *" in done.stdout
