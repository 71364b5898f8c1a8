"""Threads that keep publishing to and consuming from a broker subprocess, with the
bookkeeping crash tests check afterwards (raw channel client, never resending)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from tests.support.broker import BrokerProcess
from tests.support.rawchannel import ChannelGone, PublishLedger, RawChannel

__all__ = ["Publisher", "Consumer"]


class Publisher(threading.Thread):
    """Publishes batches of uniquely numbered messages; records what was acked."""

    def __init__(self, broker: BrokerProcess, pid: int, queue: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.stop = stop
        self.ledger = PublishLedger(pid, queue)
        self.attempted, self.acked, self.nacked = self.ledger.attempted, self.ledger.acked, self.ledger.nacked
        self.errors = self.ledger.errors
        self.rng = random.Random(pid)  # batch sizes: fixed per publisher

    def run(self) -> None:
        ledger = self.ledger
        while not self.stop.is_set():
            try:
                ch = RawChannel(self.broker.port, timeout_s=10)
            except (OSError, ChannelGone):
                time.sleep(0.05)  # retry interval while the broker restarts
                continue
            ledger.new_channel()
            try:
                while not self.stop.is_set():
                    ch.send(*ledger.batch(self.rng.randint(1, 60)))
                    while ledger.confirmed < ledger.tag:
                        ev = ch.next_event()
                        if ev["ev"] in ("ack", "nack"):
                            ledger.settle(ev)
            except ChannelGone:
                pass
            finally:
                ch.close()


def ack(ev: dict[str, Any]) -> dict[str, Any]:
    return {"op": "ack", "delivery_tag": ev["delivery_tag"]}


class Consumer(threading.Thread):
    """Consumes with manual settling (``settle`` makes the op for each delivery: an ack
    by default); records the body of every delivery it settled."""

    def __init__(
        self,
        broker: BrokerProcess,
        queue: str,
        stop: threading.Event,
        settle: Callable[[dict[str, Any]], dict[str, Any]] = ack,
    ) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.queue = queue
        self.stop = stop
        self.settle = settle
        self.acked: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                ch = RawChannel(self.broker.port, timeout_s=1)
                ch.send({"op": "consume", "queue": self.queue, "prefetch": 50})
            except (OSError, ChannelGone):
                time.sleep(0.05)  # retry interval while the broker restarts
                continue
            try:
                while not self.stop.is_set():
                    try:
                        ev = ch.next_event()
                    except ChannelGone:
                        break
                    if ev["ev"] == "deliver":
                        ch.send(self.settle(ev))
                        self.acked.append(ev["message"]["body"])
            except ChannelGone:
                pass
            finally:
                ch.close()
