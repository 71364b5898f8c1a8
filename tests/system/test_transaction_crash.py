"""kill -9 the broker while transactions commit: after any crash each transaction is
in the queue whole or not at all, and every commit that was answered is there."""

from __future__ import annotations

import collections
import random
import threading
import time
from pathlib import Path

import pytest

from tests.support.broker import STRESS_ARGS, BrokerProcess
from tests.support.rawchannel import ChannelGone, RawChannel

pytestmark = pytest.mark.slow

PER_TX = 20


class Committer(threading.Thread):
    """Commits transactions of PER_TX publishes, numbered; records the answered ones."""

    def __init__(self, broker: BrokerProcess, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.broker, self.stop = broker, stop
        self.next_tx = 0
        self.committed: set[int] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                ch = RawChannel(self.broker.port, timeout_s=5)
            except (ChannelGone, OSError):
                time.sleep(0.05)  # retry interval while the broker restarts
                continue
            try:
                ch.send({"op": "tx_select", "id": "select"})
                while ch.next_event().get("id") != "select":
                    pass
                while not self.stop.is_set():
                    n = self.next_tx
                    self.next_tx += 1
                    ch.send(*({"op": "publish", "routing_key": "q", "body": f"tx{n}-{i}"} for i in range(PER_TX)))
                    ch.send({"op": "tx_commit", "id": n})
                    while True:
                        ev = ch.next_event()
                        if ev.get("ev") == "ok" and ev.get("id") == n:
                            self.committed.add(n)
                            break
                        assert ev.get("ev") in ("ack", "nack"), ev
            except (ChannelGone, OSError):
                time.sleep(0.05)  # retry interval while the broker restarts
            finally:
                ch.close()


def test_kill9_during_commits_leaves_each_transaction_whole_or_absent(
    tmp_path: Path, seeded_random: random.Random
) -> None:
    broker = BrokerProcess(tmp_path / "data", args=STRESS_ARGS)
    broker.start()
    try:
        assert broker.request("PUT", "/queues/q", {})[0] == 201
        stop = threading.Event()
        committer = Committer(broker, stop)
        committer.start()
        for _ in range(3):
            time.sleep(seeded_random.uniform(0.3, 1.0))  # pacing: the kill lands at a random moment
            broker.kill()
            broker.start()
        time.sleep(0.3)  # pacing: some load after the last restart too
        stop.set()
        committer.join(timeout=30)
        broker.kill()
        broker.start()
        bodies = [m["body"] for m in broker.drain("q")]
    finally:
        broker.stop()

    per_tx = collections.Counter(body.split("-")[0] for body in bodies)
    assert len(committer.committed) > 20, "the test did not commit enough to mean anything"
    assert all(count == PER_TX for count in per_tx.values()), {k: v for k, v in per_tx.items() if v != PER_TX}
    assert {f"tx{n}" for n in committer.committed} <= set(per_tx), "an answered commit was lost"
    assert len(bodies) == len(set(bodies)), "a message came back twice"
