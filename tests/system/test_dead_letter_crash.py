"""kill -9 the broker while messages move between queues: dead-lettering (a nack
without requeue), delayed returns coming due, and redrive. A move is one MOVE record,
so after any crash each confirmed message is in exactly one queue."""

from __future__ import annotations

import collections
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import STRESS_ARGS, BrokerProcess
from tests.support.load import Consumer, Publisher
from tests.support.rawchannel import RawChannel
from tests.support.wait import wait_until_sync

pytestmark = pytest.mark.slow


def rejecter(broker: BrokerProcess, queue: str, stop: threading.Event) -> Consumer:
    """A consumer that acks nothing: it nacks most deliveries without requeue
    (dead-lettered), and every third first delivery with a short delay (it comes back
    later and is then dead-lettered)."""
    settled = 0

    def settle(ev: dict[str, Any]) -> dict[str, Any]:
        nonlocal settled
        settled += 1
        op: dict[str, Any] = {"op": "nack", "delivery_tag": ev["delivery_tag"], "requeue": False}
        if ev["delivery_count"] == 0 and settled % 3 == 0:
            op.update(requeue=True, delay_s=0.2)
        return op

    return Consumer(broker, queue, stop, settle)


def place_of_every_message(broker: BrokerProcess) -> tuple[collections.Counter[str], list[dict[str, Any]]]:
    """How many times each body is queued in ``work`` and ``dead`` together, and the
    messages of ``dead``."""
    found: collections.Counter[str] = collections.Counter()
    work, dead = broker.drain("work"), broker.drain("dead")
    found.update(m["body"] for m in work + dead)
    return found, dead


def setup_queues(broker: BrokerProcess) -> None:
    assert broker.request("PUT", "/exchanges/dlx", {"type": "fanout"})[0] == 201
    assert broker.request("PUT", "/queues/dead", {})[0] == 201
    assert broker.request("POST", "/bindings", {"exchange": "dlx", "queue": "dead"})[0] in (200, 201)
    status, body = broker.request("PUT", "/queues/work", {"arguments": {"x-dead-letter-exchange": "dlx"}})
    assert status == 201, body


def test_kill9_while_dead_lettering_and_delaying_loses_and_duplicates_nothing(
    tmp_path: Path, seeded_random: random.Random
) -> None:
    rng = seeded_random
    broker = BrokerProcess(tmp_path / "data", args=STRESS_ARGS)
    broker.start()
    try:
        setup_queues(broker)
        stop = threading.Event()
        publisher = Publisher(broker, 0, "work", stop)
        rejecting = rejecter(broker, "work", stop)
        publisher.start()
        rejecting.start()
        for _ in range(3):
            time.sleep(rng.uniform(0.4, 1.2))  # pacing: the kill lands at a random moment
            broker.kill()
            broker.start()
        time.sleep(0.3)  # pacing: some load after the last restart too
        stop.set()
        publisher.join(timeout=30)
        rejecting.join(timeout=30)
        broker.kill()
        broker.start()
        wait_until_sync(
            lambda: broker.request("GET", "/queues/work")[1]["messages_delayed"] == 0,
            30,
            what="the delayed returns came due",
        )
        found, dead = place_of_every_message(broker)
    finally:
        broker.stop()

    assert len(publisher.acked) > 300, "the test did not publish enough to mean anything"
    assert len(rejecting.acked) > 100, "the test did not dead-letter enough to mean anything"
    assert not publisher.acked - set(found), f"{len(publisher.acked - set(found))} confirmed messages lost"
    assert not [m for m, c in found.items() if c > 1], "a message is in two places"
    assert not set(found) - publisher.attempted
    assert dead and all(m["properties"]["headers"]["x-death"][0]["queue"] == "work" for m in dead)


def test_kill9_during_redrive_moves_each_message_once(tmp_path: Path, seeded_random: random.Random) -> None:
    rng = seeded_random
    broker = BrokerProcess(tmp_path / "data", args=STRESS_ARGS)
    broker.start()
    try:
        setup_queues(broker)
        # dead-letter 1,500 messages without a crash
        ch = RawChannel(broker.port)
        ch.send(*({"op": "publish", "routing_key": "work", "body": f"m{i}"} for i in range(1500)))
        ch.send({"op": "consume", "queue": "work", "prefetch": 500})
        rejected = 0
        while rejected < 1500:
            ev = ch.next_event()
            if ev["ev"] == "deliver":
                ch.send({"op": "nack", "delivery_tag": ev["delivery_tag"], "requeue": False})
                rejected += 1
        ch.send({"op": "close"})
        ch.close()
        wait_until_sync(lambda: broker.request("GET", "/queues/dead")[1]["messages_ready"] >= 1500, 30)
        # redrive in small steps while the broker is killed at random moments
        stop = threading.Event()

        def redrive() -> None:
            while not stop.is_set():
                try:
                    broker.request("POST", "/queues/dead/redrive", {"count": 20}, timeout_s=5)
                except Exception:
                    time.sleep(0.05)  # retry interval while the broker restarts

        worker = threading.Thread(target=redrive, daemon=True)
        worker.start()
        for _ in range(3):
            time.sleep(rng.uniform(0.2, 0.8))  # pacing: the kill lands at a random moment
            broker.kill()
            broker.start()
        stop.set()
        worker.join(timeout=30)
        broker.kill()
        broker.start()
        found, _dead = place_of_every_message(broker)
        moved = broker.request("GET", "/queues/work")[1]["messages"]
    finally:
        broker.stop()

    assert sorted(found) == sorted(f"m{i}" for i in range(1500)), "a message was lost"
    assert not [m for m, c in found.items() if c > 1], "a message was redriven twice"
    assert moved > 0, "the redrive never ran"
