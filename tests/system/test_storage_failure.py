"""A failing fsync nacks what it covered, refuses persistent publishes until writes
work again, never crashes the broker, and never acks what is not on disk."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess

pytestmark = pytest.mark.slow


def publish(broker: BrokerProcess, body: str) -> int:
    status, _ = broker.request(
        "POST", "/exchanges/amq.default/publish?routing_key=q", body.encode(), headers={"X-Message-Id": body}
    )
    return status


def test_fsync_failure_nacks_then_recovers_and_loses_nothing_acked(tmp_path: Path) -> None:
    # fsyncs 1-2 succeed (queue declare, first publish); the next two fail
    broker = BrokerProcess(tmp_path / "data", env={"ACKBUS_FAULTS": "wal.fsync_error@2:2"})
    broker.start()
    try:
        assert broker.request("PUT", "/queues/q", {})[0] == 201
        assert publish(broker, "ok-1") == 200
        statuses = {}
        statuses["bad-1"] = publish(broker, "bad-1")
        assert statuses["bad-1"] == 503, "a publish whose fsync failed must be nacked"
        status, health = broker.request("GET", "/healthz")
        assert status == 200 and health["storage_ok"] is False
        # while failed, persistent publishes are refused, not queued
        acked = ["ok-1"]
        deadline = time.monotonic() + 20
        n = 0
        while time.monotonic() < deadline:
            n += 1
            body = f"retry-{n}"
            status = publish(broker, body)
            assert status in (200, 503)
            if status == 200:
                acked.append(body)
                break
            time.sleep(0.1)
        assert len(acked) == 2, "the broker never accepted publishes again"
        assert broker.request("GET", "/healthz")[1]["storage_ok"] is True
        assert publish(broker, "ok-2") == 200
        acked.append("ok-2")
        status, info = broker.request("GET", "/queues/q")
        assert info["messages"] == len(acked)
        broker.kill()
        broker.start()
        status, got = broker.request("POST", "/queues/q/get?max=100")
        bodies = [m["body"] for m in got["messages"]]
        assert bodies == acked
    finally:
        broker.stop()
