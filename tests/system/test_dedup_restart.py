"""The deduplication window is durable state: a resend after kill -9 (window rebuilt from
the WAL) or after a clean restart (rebuilt from the checkpoint) is still deduplicated;
the scope is one exchange; an outage longer than the window forgets the id."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow


def publish(broker: BrokerProcess, exchange: str, routing_key: str, body: str, message_id: str) -> int:
    """Publish one persistent message; return how many queues it was routed to
    (0 when deduplicated)."""
    status, reply = broker.request(
        "POST",
        f"/exchanges/{exchange}/publish?routing_key={routing_key}",
        body.encode(),
        headers={"X-Message-Id": message_id},
    )
    assert status == 200 and reply["confirm"] == "ack", (status, reply)
    return int(reply["routed"])


def bodies(broker: BrokerProcess, queue: str) -> list[str]:
    status, reply = broker.request("POST", f"/queues/{queue}/get?max=100&lease=600")
    assert status == 200, reply
    return [m["body"] for m in reply["messages"]]


def test_dedup_survives_kill9_and_checkpoint_and_is_per_exchange(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        assert broker.request("PUT", "/queues/q", {})[0] == 201
        assert broker.request("PUT", "/exchanges/ex", {"type": "direct"})[0] == 201
        assert broker.request("POST", "/bindings", {"exchange": "ex", "queue": "q", "routing_key": "k"})[0] == 201
        assert publish(broker, "amq.default", "q", "first", "id-1") == 1
        assert publish(broker, "amq.default", "q", "resend", "id-1") == 0

        # crash: the window comes back from the WAL (the ENQUEUE record carries the id)
        broker.kill()
        broker.start()
        _, overview = broker.request("GET", "/overview")
        assert overview["recovery"]["checkpoint_records"] == 0 and overview["recovery"]["wal_records"] > 0
        assert publish(broker, "amq.default", "q", "resend after crash", "id-1") == 0

        # clean restart: the final checkpoint carries the window (no WAL record replayed)
        assert broker.terminate() == 0
        broker.start()
        _, overview = broker.request("GET", "/overview")
        assert overview["recovery"]["wal_records"] == 0 and overview["recovery"]["checkpoint_records"] > 0
        assert publish(broker, "amq.default", "q", "resend after checkpoint", "id-1") == 0

        # the same id through another exchange is another message
        assert publish(broker, "ex", "k", "via ex", "id-1") == 1
        assert publish(broker, "ex", "k", "via ex again", "id-1") == 0
        assert bodies(broker, "q") == ["first", "via ex"]
    finally:
        broker.stop()


def test_an_outage_longer_than_the_window_forgets_the_id(tmp_path: Path) -> None:
    window_s = 1.0
    broker = BrokerProcess(tmp_path / "data", args=("--dedup-window-s", str(window_s)))
    broker.start()
    try:
        assert broker.request("PUT", "/queues/q", {})[0] == 201
        assert publish(broker, "amq.default", "q", "first", "id-1") == 1
        published_at = time.time()
        broker.kill()
        # the window is wall-clock time since the original publish, downtime included
        time.sleep(max(0.0, published_at + window_s + 0.2 - time.time()))
        broker.start()
        assert publish(broker, "amq.default", "q", "resend", "id-1") == 1
        assert bodies(broker, "q") == ["first", "resend"]
    finally:
        broker.stop()
