"""kill -9 the broker at random moments under load; every confirmed message survives.

The broker runs as a real subprocess with small segments and frequent checkpoints so
that crashes also land during rollover and checkpoint writing. Publishers use their
own raw channel client (tests/support/rawchannel.py), record which message ids got an
``ack``, and never resend, so a duplicate can only come from the broker.
"""

from __future__ import annotations

import collections
import random
import re
import threading
import time
from pathlib import Path

import pytest

from tests.support.broker import STRESS_ARGS, BrokerProcess
from tests.support.load import Consumer, Publisher
from tests.support.wait import wait_until_sync

pytestmark = pytest.mark.slow

BROKER_ARGS = STRESS_ARGS  # crashes also land during rollover and checkpoints


def crash_rounds(broker: BrokerProcess, rounds: int, rng: random.Random) -> None:
    for _ in range(rounds):
        time.sleep(rng.uniform(0.3, 1.2))  # pacing: the kill lands at a random moment of the load
        broker.kill()
        broker.start()


def test_kill9_during_publish_storm_loses_no_confirmed_message(
    tmp_path: Path, seeded_random: random.Random
) -> None:
    rng = seeded_random
    broker = BrokerProcess(tmp_path / "data", args=BROKER_ARGS)
    broker.start()
    try:
        assert broker.request("PUT", "/queues/crash", {})[0] == 201
        stop = threading.Event()
        publishers = [Publisher(broker, pid, "crash", stop) for pid in range(3)]
        for p in publishers:
            p.start()
        crash_rounds(broker, 4, rng)
        time.sleep(0.3)  # pacing: some load after the last restart too
        stop.set()
        for p in publishers:
            p.join(timeout=30)
        broker.kill()
        broker.start()
        found = collections.Counter(m["body"] for m in broker.drain("crash"))
    finally:
        broker.stop()

    acked = set().union(*(p.acked for p in publishers))
    attempted = set().union(*(p.attempted for p in publishers))
    assert not [e for p in publishers for e in p.errors]
    assert len(acked) > 500, "the test did not publish enough to mean anything"
    assert not acked - set(found), f"{len(acked - set(found))} confirmed messages lost"
    assert not [m for m, c in found.items() if c > 1], "a message came back twice"
    assert not set(found) - attempted, "a message nobody published appeared"


def test_kill9_with_consumers_acking_loses_nothing_unacked(
    tmp_path: Path, seeded_random: random.Random
) -> None:
    rng = seeded_random
    broker = BrokerProcess(tmp_path / "data", args=BROKER_ARGS)
    broker.start()
    try:
        assert broker.request("PUT", "/queues/work", {})[0] == 201
        stop = threading.Event()
        publishers = [Publisher(broker, pid, "work", stop) for pid in range(2)]
        consumer = Consumer(broker, "work", stop)
        for t in (*publishers, consumer):
            t.start()
        crash_rounds(broker, 3, rng)
        time.sleep(0.3)  # pacing: some load after the last restart too
        stop.set()
        for t in (*publishers, consumer):
            t.join(timeout=30)
        broker.kill()
        broker.start()
        left = broker.drain("work")
    finally:
        broker.stop()

    acked = set().union(*(p.acked for p in publishers))
    attempted = set().union(*(p.attempted for p in publishers))
    consumed = collections.Counter(consumer.acked)
    remaining = collections.Counter(m["body"] for m in left)
    assert len(acked) > 300
    # nothing confirmed is lost: it was consumed and acked, or it is still queued
    assert not acked - set(consumed) - set(remaining)
    # the queue never holds two copies
    assert not [m for m, c in remaining.items() if c > 1]
    # a consumer ack may be lost in a crash (acks are synced lazily); such a message
    # comes back, but marked redelivered, never silently as new
    for m in left:
        if m["body"] in consumed:
            assert m["redelivered"], m
    assert not (set(remaining) | set(consumed)) - attempted


def test_a_delivery_whose_mark_never_reached_the_disk_comes_back_redelivered(tmp_path: Path) -> None:
    """A delivery does not wait for its delivered mark to be synced, so a crash can
    lose the mark. The message must still come back marked redelivered (the consumer
    may have seen, even acked, it), never looking fresh. The fault fails exactly the
    write of the batch holding the mark (1: declare, 2: publish, 3: the mark), which
    the log then cuts off."""
    broker = BrokerProcess(tmp_path / "data", env={"ACKBUS_FAULTS": "wal.write_error@2:1"})
    broker.start()
    try:
        assert broker.request("PUT", "/queues/q", {})[0] == 201
        status, body = broker.request("POST", "/exchanges/amq.default/publish?routing_key=q", b"m1")
        assert status == 200 and body["confirm"] == "ack", body
        status, got = broker.request("POST", "/queues/q/get?lease=600")
        assert status == 200 and [m["body"] for m in got["messages"]] == ["m1"]
        assert got["messages"][0]["redelivered"] is False
        wait_until_sync(lambda: "write-ahead log IO failed" in broker.log_tail(), 10, what="the IO failure logged")
        broker.kill()
        broker.env = {}
        broker.start()
        status, got = broker.request("POST", "/queues/q/get")
    finally:
        broker.stop()
    assert status == 200 and [m["body"] for m in got["messages"]] == ["m1"]
    assert got["messages"][0]["redelivered"] is True


def test_after_a_clean_stop_undelivered_messages_are_not_marked_redelivered(tmp_path: Path) -> None:
    """The conservative marking above is for unclean stops only."""
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        assert broker.request("PUT", "/queues/q", {})[0] == 201
        for body in (b"a", b"b"):
            assert broker.request("POST", "/exchanges/amq.default/publish?routing_key=q", body)[0] == 200
        assert broker.terminate() == 0
        broker.start()
        status, got = broker.request("POST", "/queues/q/get?max=10")
    finally:
        broker.stop()
    assert status == 200
    assert [(m["body"], m["redelivered"]) for m in got["messages"]] == [("a", False), ("b", False)]


def _wal_counters(broker: BrokerProcess) -> tuple[int, int]:
    """(records written, fsyncs) of the broker's WAL, from ``/metrics``."""
    status, text = broker.request("GET", "/metrics")
    assert status == 200
    values = dict(re.findall(r"^(ackbus_wal_(?:records_written|fsyncs)_total) (\S+)$", text.decode(), re.M))
    return int(float(values["ackbus_wal_records_written_total"])), int(float(values["ackbus_wal_fsyncs_total"]))


def test_an_ack_written_but_not_yet_fsynced_survives_kill9(tmp_path: Path) -> None:
    """Acks are synced lazily (an ack's record alone gets no fsync for up to 200 ms),
    but the record is written at once, so a crash of the process alone (the page
    cache survives) loses none: the acked message does not come back."""
    broker = BrokerProcess(tmp_path / "data")
    broker.start()
    try:
        assert broker.request("PUT", "/queues/q", {})[0] == 201
        assert broker.request("PUT", "/queues/sync", {})[0] == 201
        for body in (b"acked", b"kept"):
            status, answer = broker.request("POST", "/exchanges/amq.default/publish?routing_key=q", body)
            assert status == 200 and answer["confirm"] == "ack", answer
        status, got = broker.request("POST", "/queues/q/get?max=1&lease=600")
        assert status == 200 and [m["body"] for m in got["messages"]] == ["acked"]
        # The lease's delivery mark is synced lazily; a persistent publish's confirm
        # means an fsync covering every record before it, the mark's included.
        status, answer = broker.request("POST", "/exchanges/amq.default/publish?routing_key=sync", b"s")
        assert status == 200 and answer["confirm"] == "ack", answer
        records, fsyncs = _wal_counters(broker)
        status, _ = broker.request("POST", "/queues/q/ack", {"lease_ids": [got["messages"][0]["lease_id"]]})
        assert status == 200
        deadline = time.monotonic() + 10
        while (counters := _wal_counters(broker))[0] == records:
            assert time.monotonic() < deadline, broker.log_tail()
        # the ack's record is written, and no fsync has happened since
        assert counters == (records + 1, fsyncs)
        broker.kill()
        broker.start()
        left = broker.drain("q")
    finally:
        broker.stop()
    assert [m["body"] for m in left] == ["kept"]
