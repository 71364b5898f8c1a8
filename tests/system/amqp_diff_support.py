"""Shared pieces of the differential AMQP tests (test_amqp_differential*.py and
test_amqp_reply_to_differential.py): the servers (one private RabbitMQ and one ackbus broker, shared by every differential
module a worker runs: the session fixtures ``rabbit`` and ``ackbus`` of
tests/system/conftest.py), pika helpers that turn what a script observes into log
lines, and the comparison of two logs.

The modules share the two servers (a RabbitMQ start is ~5-9 s), so each declares
names of its own (``d.``/``g.``, ``cc.``, ``e.``/``o.``/``n.``/``t.``/``h.``/``mid.``/``c.``,
``rt.``): a new differential module takes a prefix no other uses."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerProcess, amqp_broker

pika = pytest.importorskip("pika")
from bench.servers import RabbitServer, rabbitmq_installed  # noqa: E402

Log = list[Any]


def connect(port: int) -> Any:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0, connection_attempts=3,
                                                             retry_delay=0.5))


def refused(log: Log, conn: Any, what: str, op: Callable[[Any], Any]) -> Any:
    """Run ``op`` on a fresh channel; log the reply code it was refused with (or "ok")."""
    ch = conn.channel()
    try:
        op(ch)
        # an asynchronous refusal (an ack of an unknown tag) arrives by the next round trip
        ch.basic_qos(prefetch_count=0)
        log.append((what, "ok"))
    except pika.exceptions.ChannelClosedByBroker as exc:
        log.append((what, exc.reply_code))
        return None
    except pika.exceptions.ConnectionClosedByBroker as exc:
        log.append((what, "connection", exc.reply_code))
        return "reconnect"
    if ch.is_open:
        ch.close()
    return None


def get_all(ch: Any, queue: str) -> list[tuple[bytes, bool]]:
    """Take every ready message of ``queue`` (auto-ack): (body, redelivered) in order."""
    out = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((body, method.redelivered))


def collect(conn: Any, got: list[Any], n: int, timeout_s: float = 10) -> None:
    """Let pika deliver until ``got`` holds ``n`` items (or the deadline passes)."""
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)


def compare(theirs: Log, ours: Log) -> None:
    """Fail naming every line where ackbus's log differs from RabbitMQ's."""
    differences = [(a, b) for a, b in zip(theirs, ours) if a != b]
    if len(theirs) != len(ours):
        longer = theirs if len(theirs) > len(ours) else ours
        side = "rabbitmq" if longer is theirs else "ackbus"
        differences.append((f"{side} logged {len(longer) - min(len(theirs), len(ours))} more lines",
                            longer[min(len(theirs), len(ours)):]))
    assert not differences, "\n".join(f"rabbitmq: {a}\nackbus:   {b}" for a, b in differences)


@contextmanager
def private_rabbit(directory: Path) -> Iterator[RabbitServer]:
    """A private RabbitMQ node in ``directory`` (skips the test where it is not
    installed), stopped by PID at the end."""
    if not rabbitmq_installed():
        pytest.skip("rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server)")
    server = RabbitServer(directory)
    try:
        server.start(120)
        yield server
    finally:
        server.stop()


@contextmanager
def private_ackbus(directory: Path) -> Iterator[BrokerProcess]:
    """An ackbus broker subprocess with its AMQP port (``amqp_port``), data in
    ``directory``."""
    with amqp_broker(directory / "data") as proc:
        yield proc
