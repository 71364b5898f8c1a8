"""``Broker.totals()`` keeps running counts (O(1) a call, for ``GET /overview``): after
any sequence of operations they must equal the counts summed over every queue and
channel, as ``totals()`` used to compute them."""

from __future__ import annotations

import random
from typing import Any

import pytest

from broker.core import Broker, ChannelError, ErrorReply

from .durable_view import restart_from_log
from .helpers import Harness


def summed(b: Broker) -> dict[str, int]:
    """The totals counted the slow way: over every queue and channel."""
    ready = sum(q.ready_count() for q in b.queues.values())
    unacked = sum(q.unacked for q in b.queues.values())
    return {
        "paged_out": sum(q.paged_count() for q in b.queues.values()),
        "exchanges": len(b.exchanges),
        "queues": len(b.queues),
        "channels": len(b.channels) - 1,
        "consumers": sum(len(ch.consumers) for ch in b.channels.values()),
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacked": unacked,
    }


QUEUE_KINDS: list[dict[str, Any]] = [
    {"durable": True},
    {"durable": False},
    {"arguments": {"x-message-ttl": 3000, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}},
    {"arguments": {"x-max-length": 4}},
    {"arguments": {"x-max-priority": 3}},
    {"arguments": {"x-delivery-limit": 1, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}},
    {"auto_delete": True},
]


def random_walk(h: Harness, rng: random.Random, steps: int) -> int:
    """Run ``steps`` random operations, checking the totals after each; return the
    most messages seen paged out at once."""
    b = h.b
    names = [f"q{i}" for i in range(6)]
    b.declare_queue("dead")
    channels = [h.channel(), h.channel()]
    leases: list[str] = []
    most_paged = 0
    for _ in range(steps):
        op = rng.choice(
            ["declare", "publish", "publish", "publish", "get", "ack_leases", "nack_leases", "consume",
             "cancel", "ack", "nack", "purge", "delete", "sleep", "sync", "close", "delayed_nack"]
        )
        name = rng.choice(names)
        ch = rng.choice(channels)
        try:
            if op == "declare":
                b.declare_queue(name, **rng.choice(QUEUE_KINDS))
            elif op == "publish":
                props: dict[str, Any] = {}
                if rng.random() < 0.4:
                    props["expiration"] = rng.choice([0, 500, 1500, 4000, 60_000])
                if rng.random() < 0.3:
                    props["priority"] = rng.randrange(5)
                if rng.random() < 0.3:
                    props["delivery_mode"] = 1
                b.publish(ch, "", name, b"m", props or None)
            elif op == "get":
                leases.extend(lid for lid, _d, _r in b.get(name, rng.randrange(1, 4), lease_s=rng.choice([1, 5])))
            elif op in ("ack_leases", "nack_leases") and leases:
                lid = leases.pop(rng.randrange(len(leases)))
                if op == "ack_leases":
                    b.ack_leases([lid])
                else:
                    b.nack_leases([lid], requeue=rng.random() < 0.7)
            elif op == "consume":
                b.consume(ch, name, prefetch=rng.randrange(0, 3))
            elif op == "cancel":
                tags = list(b.channels[ch].consumers)
                if tags:
                    b.cancel(ch, rng.choice(tags))
            elif op in ("ack", "nack", "delayed_nack"):
                tags = list(b.channels[ch].deliveries)
                if tags:
                    tag = rng.choice(tags)
                    if op == "ack":
                        b.ack(ch, tag, multiple=rng.random() < 0.2)
                    elif op == "nack":
                        b.nack(ch, tag, requeue=rng.random() < 0.6)
                    else:
                        b.nack(ch, tag, delay_s=rng.choice([0.5, 2.0]))
            elif op == "purge":
                b.purge_queue(name)
            elif op == "delete":
                b.delete_queue(name)
            elif op == "sleep":
                h.sleep(rng.choice([0.3, 1.0, 2.5]))
            elif op == "sync":
                h.sync()
            elif op == "close":
                b.close_channel(ch)
                channels[channels.index(ch)] = h.channel()
        except (ErrorReply, ChannelError):
            pass
        h.step()
        assert {**b.totals(), "paged_out": b.views.paged_out_total()} == summed(b), op
        most_paged = max(most_paged, b.views.paged_out_total())
    return most_paged


@pytest.mark.parametrize("memory", [2048, 2])
def test_totals_equal_the_sums_after_a_random_walk(seeded_random: random.Random, memory: int) -> None:
    h = Harness(queue_memory_messages=memory)  # 2: most messages paged out
    most_paged = random_walk(h, seeded_random, 4000)
    assert most_paged > 0 if memory == 2 else most_paged == 0


def test_totals_are_recounted_after_recovery() -> None:
    h = Harness(queue_memory_messages=2)
    ch = h.channel()
    h.queue("a")
    for _ in range(5):
        h.publish(ch, "", "a")
    h.b.get("a")
    h.sync()
    b = restart_from_log(h, queue_memory_messages=2)
    assert b.totals()["messages_ready"] == 5  # the unacked one is ready again
    assert {**b.totals(), "paged_out": b.views.paged_out_total()} == summed(b)
