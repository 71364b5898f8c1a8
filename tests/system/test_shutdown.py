"""Graceful shutdown of a real broker process on SIGTERM, under load.

What the broker promises (docs/operations.md, "Signals"): on SIGTERM it stops
accepting, sends ``closing`` on every channel, delivers nothing new, lets publishes
already received reach disk and get their confirms, returns unacked deliveries to
their queues, writes a final checkpoint and exits 0. A second SIGTERM exits at once;
since an ack is only ever sent for a record on disk, that loses nothing confirmed.
SIGHUP reopens the log file.

The clients are the raw, blocking channel client of tests/support/rawchannel.py, so
that a bug in the product client cannot hide one in the broker.
"""

from __future__ import annotations

import collections
import json
import random
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import STRESS_ARGS, BrokerProcess
from tests.support.rawchannel import ChannelGone, PublishLedger, RawChannel
from tests.support.wait import wait_until_sync

pytestmark = pytest.mark.slow

BROKER_ARGS = STRESS_ARGS  # crashes also land during rollover and checkpoints


def _open_connections(broker: BrokerProcess) -> int:
    """Open HTTP connections, from ``/metrics`` (the scrape's own included)."""
    status, text = broker.request("GET", "/metrics")
    assert status == 200
    found = re.search(rb"^ackbus_connections (\S+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def wait_until(predicate: Any, timeout_s: float = 10.0, what: str = "condition") -> None:
    wait_until_sync(predicate, timeout_s, what=what)


def publish_confirmed(broker: BrokerProcess, queue: str, bodies: list[str]) -> None:
    """Publish ``bodies`` on one channel and wait for every confirm (all must be acks)."""
    ch = RawChannel(broker.port)
    try:
        for i in range(0, len(bodies), 10):
            ch.send(
                *(
                    {"op": "publish", "routing_key": queue, "body": b}
                    for b in bodies[i : i + 10]
                )
            )
        confirmed = 0
        while confirmed < len(bodies):
            ev = ch.next_event()
            assert ev["ev"] == "ack", ev
            confirmed = ev["delivery_tag"] if ev["multiple"] else confirmed + 1
        ch.send({"op": "close"})
        while ch.next_event()["ev"] != "close_ok":
            pass
    finally:
        ch.close()


class Publisher(threading.Thread):
    """One channel publishing uniquely numbered batches as fast as confirms come back.

    ``polite``: on ``closing`` it stops publishing and waits for the confirms still
    due, as the product client does. Otherwise it keeps publishing until the broker
    ends the channel (the worst case). Never reconnects or resends, so every message
    id is published at most once and a duplicate can only come from the broker.
    """

    def __init__(self, broker: BrokerProcess, pid: int, queue: str, *, polite: bool) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.pid = pid
        self.polite = polite
        self.ledger = PublishLedger(pid, queue)
        self.attempted, self.acked, self.nacked = self.ledger.attempted, self.ledger.acked, self.ledger.nacked
        self.errors = self.ledger.errors
        self.saw_closing = False
        self.opened = threading.Event()

    def run(self) -> None:
        try:
            ch = RawChannel(self.broker.port, timeout_s=15)
        except (OSError, ChannelGone) as exc:
            self.errors.append(f"could not open a channel: {exc}")
            self.opened.set()
            return
        self.opened.set()
        rng = random.Random(self.pid)  # fixed per publisher: replays with the test
        ledger = self.ledger
        try:
            while not (self.polite and self.saw_closing):
                ch.send(*ledger.batch(rng.randint(1, 60)))
                while ledger.confirmed < ledger.tag:
                    ev = ch.next_event()
                    if ev["ev"] == "closing":
                        self.saw_closing = True
                        continue
                    if ev["ev"] not in ("ack", "nack"):
                        self.errors.append(f"unexpected event {ev}")
                        continue
                    ledger.settle(ev)
            # Polite: everything sent is confirmed; end the channel as a client would.
            ch.send({"op": "close"})
            while ch.next_event()["ev"] != "close_ok":
                pass
        except ChannelGone:
            pass
        finally:
            ch.close()


def assert_no_loss_no_duplicates(publishers: list[Publisher], found: list[str]) -> None:
    counts = collections.Counter(found)
    acked = set().union(*(p.acked for p in publishers))
    attempted = set().union(*(p.attempted for p in publishers))
    assert not [e for p in publishers for e in p.errors]
    assert len(acked) > 300, "the test did not publish enough to mean anything"
    assert not acked - set(counts), f"{len(acked - set(counts))} confirmed messages lost"
    assert not [m for m, c in counts.items() if c > 1], "a message is queued twice"
    assert not set(counts) - attempted, "a message nobody published appeared"


@pytest.mark.parametrize("polite", [False, True], ids=["publishing-through", "stop-on-closing"])
def test_sigterm_during_publish_storm(tmp_path: Path, polite: bool) -> None:
    broker = BrokerProcess(tmp_path / "data", args=BROKER_ARGS)
    broker.start()
    try:
        assert broker.request("PUT", "/queues/storm", {})[0] == 201
        publishers = [Publisher(broker, pid, "storm", polite=polite) for pid in range(4)]
        for p in publishers:
            p.start()
            p.opened.wait(10)
        wait_until(lambda: sum(len(p.acked) for p in publishers) > 2000, what="publishes to get going")
        started = time.monotonic()
        code = broker.terminate(timeout_s=15)
        took = time.monotonic() - started
        for p in publishers:
            p.join(timeout=15)
            assert not p.is_alive(), "a publisher is stuck: its channel never ended"
        assert code == 0, broker.log_tail()
        assert took < 8, f"shutdown took {took:.1f} s"
        assert all(p.saw_closing for p in publishers), "a channel ended without a closing event"
        log = broker.log_tail(400)
        assert "shutting down" in log and "stopped drained=true" in log, log
        broker.start()
        found = [m["body"] for m in broker.drain("storm")]
    finally:
        broker.stop()

    assert_no_loss_no_duplicates(publishers, found)
    # A clean shutdown nacks nothing: the disk is fine.
    assert not set().union(*(p.nacked for p in publishers))


def test_sigterm_confirms_every_publish_it_took(tmp_path: Path) -> None:
    """In-flight publishes finish their fsync and get their confirms: a publish the
    broker took (it is in the queue after the restart) was acked before its channel
    ended. Publishes still in the network when the broker stopped reading are neither
    confirmed nor kept; a client resends them (deduplicated by message_id)."""
    broker = BrokerProcess(tmp_path / "data", args=BROKER_ARGS)
    broker.start()
    try:
        assert broker.request("PUT", "/queues/storm", {})[0] == 201
        publishers = [Publisher(broker, pid, "storm", polite=pid % 3 == 0) for pid in range(6)]
        for p in publishers:
            p.start()
            p.opened.wait(10)
        wait_until(lambda: sum(len(p.acked) for p in publishers) > 2000, what="publishes to get going")
        assert broker.terminate(timeout_s=15) == 0, broker.log_tail()
        for p in publishers:
            p.join(timeout=15)
        broker.start()
        found = [m["body"] for m in broker.drain("storm")]
    finally:
        broker.stop()
    assert_no_loss_no_duplicates(publishers, found)
    kept_unconfirmed = set(found) - set().union(*(p.acked for p in publishers))
    assert not kept_unconfirmed, f"the broker kept {len(kept_unconfirmed)} publishes it never confirmed"


def test_sigterm_while_fsyncs_fail_acks_nothing_unsynced(tmp_path: Path) -> None:
    """From the 40th fsync on, every fsync fails (EIO): the records stay unsynced, so
    their publishes must never be acked, not even by the shutdown that cannot wait
    for them. The drain gives up at its deadline and the broker still exits."""
    broker = BrokerProcess(
        tmp_path / "data",
        args=(*BROKER_ARGS, "--shutdown-timeout-s", "3"),
        env={"ACKBUS_FAULTS": "wal.fsync_error@40"},
    )
    broker.start()
    try:
        assert broker.request("PUT", "/queues/storm", {})[0] == 201
        publishers = [Publisher(broker, pid, "storm", polite=False) for pid in range(3)]
        for p in publishers:
            p.start()
            p.opened.wait(10)
        wait_until(lambda: any(p.nacked for p in publishers), what="the first nack")
        time.sleep(0.3)  # pacing: the storm goes on a while before the signal
        started = time.monotonic()
        code = broker.terminate(timeout_s=15)
        took = time.monotonic() - started
        for p in publishers:
            p.join(timeout=15)
        assert code == 0, broker.log_tail()
        assert took < 3 + 3, f"shutdown took {took:.1f} s despite --shutdown-timeout-s 3"
        assert "stopped drained=false" in broker.log_tail()
        broker.env = {}  # restart with a healthy disk
        broker.start()
        found = set(m["body"] for m in broker.drain("storm"))
    finally:
        broker.stop()
    acked = set().union(*(p.acked for p in publishers))
    nacked = set().union(*(p.nacked for p in publishers))
    assert len(acked) > 300 and nacked
    assert acked <= found, "a confirmed message was lost"
    assert not nacked & found, "a nacked message was enqueued after all"
    assert not [e for p in publishers for e in p.errors]
    for p in publishers:
        # Tags are confirmed in order; once the log fails, no later publish is acked.
        acked_tags = sorted(int(m.split("-")[1]) for m in p.acked)
        nacked_tags = sorted(int(m.split("-")[1]) for m in p.nacked)
        if nacked_tags:
            assert not acked_tags or acked_tags[-1] < nacked_tags[0], p.pid


class Consumer(threading.Thread):
    """Consumes with manual acks. Acks every delivery except those ``hold`` selects,
    which it keeps unacked; records what it saw and acked."""

    def __init__(self, broker: BrokerProcess, queue: str, *, prefetch: int, hold: Any) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.queue = queue
        self.prefetch = prefetch
        self.hold = hold
        self.delivered: list[str] = []
        self.acked: set[str] = set()
        #: Acked with a barrier answered before ``closing``: certainly applied.
        self.acked_for_sure: set[str] = set()
        self.held: set[str] = set()
        self.saw_closing = False
        self.delivered_after_closing: list[str] = []
        self.consuming = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        ch = RawChannel(self.broker.port, timeout_s=15)
        try:
            ch.send({"op": "consume", "queue": self.queue, "prefetch": self.prefetch, "consumer_tag": "c"})
            pending_acks: set[str] = set()
            barrier = 0
            in_barrier: dict[str, set[str]] = {}
            while True:
                ev = ch.next_event()
                kind = ev["ev"]
                if kind == "consume_ok":
                    self.consuming.set()
                elif kind == "closing":
                    self.saw_closing = True
                elif kind == "deliver":
                    body = ev["message"]["body"]
                    self.delivered.append(body)
                    if self.saw_closing:
                        self.delivered_after_closing.append(body)
                    if self.hold(body):
                        self.held.add(body)
                        continue
                    ops: list[dict[str, Any]] = [{"op": "ack", "delivery_tag": ev["delivery_tag"]}]
                    pending_acks.add(body)
                    self.acked.add(body)
                    if len(pending_acks) >= 10:
                        # qos is answered only after every earlier op was applied.
                        barrier += 1
                        in_barrier[f"b{barrier}"] = pending_acks
                        pending_acks = set()
                        ops.append({"op": "qos", "prefetch": self.prefetch, "id": f"b{barrier}"})
                    ch.send(*ops)
                elif kind == "ok" and ev.get("id") in in_barrier:
                    done = in_barrier.pop(ev["id"])
                    if not self.saw_closing:
                        self.acked_for_sure |= done
                elif kind == "error":
                    self.errors.append(f"channel error {ev}")
        except ChannelGone:
            pass
        finally:
            ch.close()


def test_sigterm_during_consumption_requeues_unacked(tmp_path: Path) -> None:
    # the held deliveries are never acked: the shutdown waits its whole timeout for
    # them (10 s by default), then requeues them
    broker = BrokerProcess(tmp_path / "data", args=(*BROKER_ARGS, "--shutdown-timeout-s", "3"))
    broker.start()
    try:
        assert broker.request("PUT", "/queues/work", {})[0] == 201
        bodies = [f"m{i}" for i in range(3000)]
        publish_confirmed(broker, "work", bodies)
        # Every 7th message is held unacked; the consumer acks the rest as they come.
        consumer = Consumer(broker, "work", prefetch=300, hold=lambda b: int(b[1:]) % 7 == 0)
        consumer.start()
        assert consumer.consuming.wait(10)
        wait_until(lambda: len(consumer.acked) > 600, what="consumption to get going")
        code = broker.terminate(timeout_s=15)
        consumer.join(timeout=15)
        assert not consumer.is_alive(), "the consumer's channel never ended"
        assert code == 0, broker.log_tail()
        assert consumer.saw_closing
        broker.start()
        left = broker.drain("work")
    finally:
        broker.stop()

    assert not consumer.errors
    assert consumer.held, "nothing was held unacked: the test proves nothing"
    assert not consumer.delivered_after_closing, "a delivery followed the closing event"
    by_body = {m["body"]: m for m in left}
    counts = collections.Counter(m["body"] for m in left)
    assert not [b for b, c in counts.items() if c > 1], "a message is queued twice"
    # Nothing confirmed is lost: each message was acked by the consumer or is back.
    assert not set(bodies) - consumer.acked - set(by_body)
    # Every delivery left unacked at SIGTERM is back, marked redelivered.
    missing = consumer.held - set(by_body)
    assert not missing, f"{len(missing)} unacked deliveries were not requeued"
    assert all(by_body[b]["redelivered"] for b in consumer.held)
    # Acks the broker applied before shutting down stay applied: a clean shutdown
    # syncs them and writes them into the final checkpoint.
    assert not consumer.acked_for_sure & set(by_body), "an applied consumer ack was lost"
    # Whatever was never delivered is back as it was, not redelivered.
    never_delivered = set(bodies) - set(consumer.delivered)
    assert never_delivered and never_delivered <= set(by_body)
    assert not any(by_body[b]["redelivered"] for b in never_delivered)
    # Queue order survives: the remaining messages come back in publish order, the
    # requeued ones in their original positions.
    numbers = [int(m["body"][1:]) for m in left]
    assert numbers == sorted(numbers)


def test_sigterm_with_a_consumer_that_stops_reading(tmp_path: Path) -> None:
    """A consumer that never reads cannot hold the shutdown past its deadline, and its
    unacked deliveries come back."""
    broker = BrokerProcess(tmp_path / "data", args=("--shutdown-timeout-s", "4"))
    broker.start()
    sock = None
    try:
        assert broker.request("PUT", "/queues/big", {})[0] == 201
        body = "x" * 60000
        publish_confirmed(broker, "big", [f"{i:04d}{body}" for i in range(200)])
        sock = socket.create_connection(("127.0.0.1", broker.port))
        op = json.dumps({"op": "consume", "queue": "big", "prefetch": 1000}).encode() + b"\n"
        sock.sendall(
            b"POST /channel HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"%x\r\n" % len(op)
            + op
            + b"\r\n"
        )
        wait_until(
            lambda: broker.request("GET", "/queues/big")[1]["messages_unacked"] > 0, what="deliveries"
        )
        started = time.monotonic()
        code = broker.terminate(timeout_s=20)
        took = time.monotonic() - started
        assert code == 0, broker.log_tail()
        assert took < 4 + 2, f"shutdown took {took:.1f} s despite --shutdown-timeout-s 4"
        broker.start()
        left = broker.drain("big")
    finally:
        if sock is not None:
            sock.close()
        broker.stop()
    assert sorted(m["body"][:4] for m in left) == [f"{i:04d}" for i in range(200)]


def test_second_sigterm_exits_at_once_and_loses_nothing_confirmed(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", args=("--shutdown-timeout-s", "60", "--body-timeout-s", "60"))
    broker.start()
    stalled = None
    try:
        assert broker.request("PUT", "/queues/q", {})[0] == 201
        bodies = [f"m{i}" for i in range(100)]
        publish_confirmed(broker, "q", bodies)
        # A REST publish whose body never finishes arriving: the graceful shutdown
        # waits for it (up to --body-timeout-s / --shutdown-timeout-s).
        stalled = socket.create_connection(("127.0.0.1", broker.port))
        stalled.sendall(
            b"POST /exchanges/amq.default/publish?routing_key=q HTTP/1.1\r\n"
            b"Host: t\r\nContent-Length: 100\r\n\r\nonly part of it"
        )
        # the broker holds the stalled connection (and the scrape's own): 2 open
        wait_until(lambda: _open_connections(broker) >= 2, what="the stalled upload accepted")
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "shutting down" in broker.log_tail(), what="the shutdown to begin")
        time.sleep(1.0)  # the thing tested: a second later the shutdown still waits
        assert broker.proc.poll() is None, "the stalled upload should keep the shutdown waiting"
        started = time.monotonic()
        broker.proc.send_signal(signal.SIGTERM)
        code = broker.proc.wait(timeout=10)
        took = time.monotonic() - started
        assert code == 128 + signal.SIGTERM, broker.log_tail()
        assert took < 2, f"the second signal took {took:.1f} s to end the process"
        assert "second signal" in broker.log_tail()
        broker.start()
        left = broker.drain("q")
    finally:
        if stalled is not None:
            stalled.close()
        broker.stop()
    assert sorted(m["body"] for m in left) == sorted(bodies)


def test_sighup_reopens_the_log_file(tmp_path: Path) -> None:
    log_file = tmp_path / "broker.log"
    broker = BrokerProcess(tmp_path / "data", args=("--log-file", str(log_file)))
    broker.start()
    try:
        assert "broker ready" in log_file.read_text()
        rotated = tmp_path / "broker.log.1"
        log_file.rename(rotated)
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGHUP)
        wait_until(log_file.exists, what="a new log file")
        wait_until(lambda: "log files reopened" in log_file.read_text(), what="the reopen to be logged")
        assert broker.proc.poll() is None, "SIGHUP must not stop the broker"
        assert broker.request("GET", "/healthz")[0] == 200
        assert broker.terminate() == 0
    finally:
        broker.stop()
    new_text = log_file.read_text()
    old_text = rotated.read_text()
    assert "shutting down" in new_text and "stopped" in new_text
    assert "shutting down" not in old_text
    assert "broker ready" in old_text and "broker ready" not in new_text


def test_sigterm_during_recovery_exits_0_once_recovery_ends(tmp_path: Path) -> None:
    """Nothing is served before recovery ends, so there is nothing to drain: the broker
    stops when recovery has finished (it cannot be interrupted), and loses nothing."""
    no_checkpoints = ("--checkpoint-interval-s", "0", "--checkpoint-wal-bytes", "0")
    broker = BrokerProcess(tmp_path / "data", args=no_checkpoints)
    broker.start()
    n = 200_000
    try:
        assert broker.request("PUT", "/queues/big", {})[0] == 201
        ch = RawChannel(broker.port)
        for i in range(0, n, 2000):
            ch.send(*({"op": "publish", "routing_key": "big", "body": "m"} for _ in range(2000)))
        while (ev := ch.next_event())["delivery_tag"] < n:
            assert ev["ev"] == "ack"
        ch.close()
        broker.kill()  # no final checkpoint: the next start replays every record
        broker.start(wait_ready=False)

        def recovering() -> bool:
            try:
                return broker.request("GET", "/healthz", timeout_s=1)[1].get("status") == "recovering"
            except OSError:
                return False

        wait_until(recovering, what="the broker to be recovering")
        assert broker.terminate(timeout_s=30) == 0, broker.log_tail()
        log = broker.log_tail()
        assert "recovery still running" in log, log
        assert "broker ready" not in log.rsplit("starting", 1)[-1]
        broker.start()
        status, queue = broker.request("GET", "/queues/big")
        assert status == 200 and queue["messages_ready"] == n
    finally:
        broker.stop()


def _consume_held(broker: BrokerProcess, queue: str, count: int) -> RawChannel:
    """A channel holding ``count`` unacked deliveries of ``queue``."""
    ch = RawChannel(broker.port)
    ch.send({"op": "consume", "queue": queue, "consumer_tag": "c", "prefetch": count, "id": 1})
    delivered = 0
    while delivered < count:
        ev = ch.next_event()
        if ev["ev"] == "deliver":
            delivered += 1
    return ch


def _until_closing(ch: RawChannel) -> None:
    while True:
        ev = ch.next_event()
        assert ev["ev"] != "deliver", "a delivery during shutdown"
        if ev["ev"] == "closing":
            return


def test_acks_sent_in_answer_to_closing_land(tmp_path: Path) -> None:
    """docs/operations.md: during the drain, acks still land. A consumer that acks
    some of its messages after `closing` and then closes: those stay acked after the
    restart, the rest come back redelivered. A second consumer that acks everything it
    holds after `closing` sees the broker end its channel without closing it."""
    broker = BrokerProcess(tmp_path / "data", args=[*BROKER_ARGS, "--shutdown-timeout-s", "60"])
    broker.start()
    try:
        for q in ("work", "other"):
            assert broker.request("PUT", f"/queues/{q}", {})[0] == 201
        publish_confirmed(broker, "work", [f"w{i}" for i in range(50)])
        publish_confirmed(broker, "other", [f"o{i}" for i in range(10)])
        partial = _consume_held(broker, "work", 50)
        complete = _consume_held(broker, "other", 10)
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGTERM)
        _until_closing(partial)
        _until_closing(complete)
        for tag in range(1, 31):  # one chunk per ack: the drain must outlast a few
            partial.send({"op": "ack", "delivery_tag": tag})
            time.sleep(0.005)  # pacing: one chunk per ack, spread over the drain
        complete.send({"op": "ack", "delivery_tag": 10, "multiple": True})
        partial.send({"op": "close", "id": 2})
        while (ev := partial.next_event())["ev"] != "close_ok":
            assert ev["ev"] not in ("deliver", "error"), ev
        with pytest.raises(ChannelGone):  # ended by the broker: nothing left to settle
            while True:
                ev = complete.next_event()
                assert ev["ev"] not in ("deliver", "error"), ev
        partial.close()
        complete.close()
        assert broker.proc.wait(timeout=30) == 0, broker.log_tail()
        broker.proc = None
        broker.start()
        left_work = broker.drain("work")
        left_other = broker.drain("other")
    finally:
        broker.stop()
    assert sorted(int(m["body"][1:]) for m in left_work) == list(range(30, 50))
    assert all(m["redelivered"] for m in left_work)
    assert left_other == []
