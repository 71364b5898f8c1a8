"""kill -9 the broker while confirmed messages of many priorities pile up in a priority
queue whose bodies are paged out to the log, with checkpoints taken meanwhile: after
every restart each confirmed message is there once, highest priority first and in
publish order within a priority."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from tests.support.broker import STRESS_ARGS, BrokerProcess
from tests.support.rawchannel import ChannelGone, RawChannel

pytestmark = pytest.mark.slow

MAX_PRIORITY = 5


def publish_round(broker: BrokerProcess, rng: random.Random, start: int, batches: int) -> tuple[dict[str, int], int]:
    """Publish ``batches`` confirmed batches, then one more left in flight: returns the
    confirmed bodies with their priorities, and the next index."""
    confirmed: dict[str, int] = {}
    ch = RawChannel(broker.port)
    n = start
    acked = 0
    try:
        for _ in range(batches):
            batch = []
            for _ in range(rng.randint(50, 300)):
                p = rng.choice([None, 0, 1, 2, 3, 5, 7, 200])  # (above the maximum counts as it)
                body = f"m{n:06d}"
                props = {} if p is None else {"priority": p}
                batch.append((body, p, {"op": "publish", "routing_key": "prio", "body": body, "properties": props}))
                n += 1
            ch.send(*[op for _b, _p, op in batch])
            sent = n - start  # (delivery tags count this channel's publishes; confirms come in order)
            while acked < sent:
                ev = ch.next_event()
                assert ev["ev"] == "ack", ev
                acked = ev["delivery_tag"]
            confirmed.update((body, p or 0) for body, p, _op in batch)
        ch.send(*[{"op": "publish", "routing_key": "prio", "body": f"x{n}-{i}", "properties": {"priority": 3}}
                  for i in range(100)])  # in flight at the crash: may or may not survive
        time.sleep(rng.uniform(0.0, 0.05))  # pacing: the crash lands at a random moment
    except ChannelGone:
        raise AssertionError("the broker went away before it was killed") from None
    finally:
        broker.kill()
        ch.close()
    return confirmed, n


def test_kill9_with_a_paged_priority_queue_keeps_every_confirmed_message_in_order(
    tmp_path: Path, seeded_random: random.Random
) -> None:
    rng = seeded_random
    broker = BrokerProcess(tmp_path / "data", args=(*STRESS_ARGS, "--queue-memory-messages", "16"))
    broker.start()
    try:
        status, body = broker.request("PUT", "/queues/prio", {"arguments": {"x-max-priority": MAX_PRIORITY}})
        assert status == 201, body
        expected: dict[str, int] = {}
        n = 0
        for _round in range(3):
            confirmed, n = publish_round(broker, rng, n, rng.randint(3, 8))
            expected.update(confirmed)
            broker.start()
            status, info = broker.request("GET", "/queues/prio")
            assert status == 200 and info["arguments"] == {"x-max-priority": MAX_PRIORITY}
            assert info["messages_ready"] >= len(expected)
        messages = broker.drain("prio")
    finally:
        broker.stop()
    bodies = [m["body"] for m in messages]
    assert len(bodies) == len(set(bodies)), "a message came back twice"
    assert set(expected) <= set(bodies), f"{len(set(expected) - set(bodies))} confirmed messages lost"
    # highest priority first, publish order within one priority
    levels = [min((m.get("properties") or {}).get("priority") or 0, MAX_PRIORITY) for m in messages]
    assert levels == sorted(levels, reverse=True)
    for level in set(levels):
        same = [b for b, lv in zip(bodies, levels) if lv == level and b.startswith("m")]
        assert same == sorted(same), f"priority {level} out of publish order"
    for body, p in expected.items():
        assert min(p, MAX_PRIORITY) == levels[bodies.index(body)]
