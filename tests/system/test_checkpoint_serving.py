"""The broker keeps serving while a checkpoint is written.

A backlog of 100,000 persistent messages makes each checkpoint take a while. The test
watches the checkpoint directory: once ``<lsn>.ckpt.tmp`` exists, that checkpoint has
begun. It then sends requests, and proves each was answered before that checkpoint
finished by the broker's own state: ``/overview`` answers ``last_checkpoint_lsn`` (set
only when a checkpoint completed) still below ``<lsn>``. No wall-clock assertion.

Then a crash: what was published during the checkpoint comes back from checkpoint + WAL.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.rawchannel import publish_confirmed

pytestmark = pytest.mark.slow

BACKLOG = 100_000
BODY = "p" * 100
# A checkpoint every half second when the log grew; the size trigger off.
ARGS = ("--checkpoint-interval-s", "0.5", "--checkpoint-wal-bytes", "0")
ATTEMPTS = 10


def publish_backlog(broker: BrokerProcess, n: int) -> None:
    publish_confirmed(broker.port, "backlog", [BODY] * n, batch=2000)


def wait_for_checkpoint_tmp(checkpoint_dir: Path, timeout_s: float = 10.0) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in checkpoint_dir.glob("*.ckpt.tmp"):
            return path
        time.sleep(0.001)
    raise AssertionError(f"no checkpoint began within {timeout_s} s")


def publish(broker: BrokerProcess, body: str) -> None:
    status, reply = broker.request("POST", "/exchanges/amq.default/publish?routing_key=live", body.encode())
    assert status == 200 and reply == {"confirm": "ack", "routed": 1}, (status, reply)


def last_checkpoint_lsn(broker: BrokerProcess) -> int:
    status, overview = broker.request("GET", "/overview")
    assert status == 200
    return int(overview["storage"]["last_checkpoint_lsn"])


def test_requests_are_answered_while_a_checkpoint_is_written(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", args=ARGS)
    broker.start()
    published: list[str] = []
    try:
        for queue in ("backlog", "live"):
            assert broker.request("PUT", f"/queues/{queue}", {})[0] == 201
        publish_backlog(broker, BACKLOG)
        checkpoint_dir = broker.data_dir / "checkpoint"

        served_during: list[str] = []
        for attempt in range(ATTEMPTS):
            # make the log grow so that the timer takes a checkpoint
            body = f"tick-{attempt}"
            publish(broker, body)
            published.append(body)
            tmp = wait_for_checkpoint_tmp(checkpoint_dir)
            lsn = int(tmp.name[:16], 16)
            k = 0
            while tmp.exists():
                # every step below starts after the checkpoint at `lsn` began
                status, health = broker.request("GET", "/healthz")
                assert status == 200 and health["ready"] is True
                body = f"during-{attempt}-{k}"
                publish(broker, body)
                published.append(body)
                if last_checkpoint_lsn(broker) >= lsn:
                    break  # that checkpoint ended meanwhile: this round proves nothing
                # healthz and the confirmed publish were answered before it ended
                served_during.append(body)
                k += 1
            if len(served_during) >= 2:
                break
            served_during.clear()
        assert len(served_during) >= 2, (
            f"in {ATTEMPTS} checkpoints never answered two requests while one was written"
        )
        # that checkpoint did complete (it was not abandoned)
        deadline = time.monotonic() + 30
        while last_checkpoint_lsn(broker) < lsn:
            assert time.monotonic() < deadline, "the checkpoint never completed"
            time.sleep(0.01)

        # recovery from that checkpoint + the WAL keeps what was published meanwhile
        broker.kill()
        broker.start()
        _, overview = broker.request("GET", "/overview")
        assert overview["recovery"]["checkpoint_records"] > 0, overview["recovery"]
        _, backlog = broker.request("GET", "/queues/backlog")
        assert backlog["messages"] == BACKLOG
        status, got = broker.request("POST", "/queues/live/get?max=1000&lease=600")
        assert status == 200
        assert [m["body"] for m in got["messages"]] == published
    finally:
        broker.stop()
