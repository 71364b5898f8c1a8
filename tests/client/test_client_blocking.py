"""The blocking client (client.connect_blocking) against a real broker subprocess,
with its event loop thread on trio and on asyncio."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import client
from client import ConnectionLost, PublishNacked, ReconnectPolicy
from tests.support.broker import BrokerProcess, free_port

pytestmark = pytest.mark.slow

BACKENDS = ["trio", "asyncio"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(Path(tmp_path_factory.mktemp("blocking")) / "data")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("backend", BACKENDS)
def test_publish_consume_ack(broker: BrokerProcess, backend: str) -> None:
    queue = f"blocking-{backend}"
    with client.connect_blocking(broker.url, backend=backend) as conn:
        with conn.channel() as ch:
            ch.declare_queue(queue)
            message_id = ch.publish("", queue, b"one")
            assert isinstance(message_id, str)
            handles = [ch.start_publish("", queue, f"m{i}") for i in range(50)]
            assert [h.wait() for h in handles][0]
            ch.wait_for_confirms()
            with pytest.raises(PublishNacked):
                ch.publish("no-such-exchange", "k", b"x")
        assert conn.queue_info(queue).messages_ready == 51
        got = []
        with conn.channel() as ch, ch.consume(queue, prefetch=10) as messages:
            for msg in messages:
                got.append(msg.body)
                assert msg.ack() is True
                if len(got) == 51:
                    break
        assert got == [b"one"] + [f"m{i}".encode() for i in range(50)]
        assert conn.queue_info(queue).messages == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_rest_get_and_lease_settling(broker: BrokerProcess, backend: str) -> None:
    queue = f"blocking-get-{backend}"
    with client.connect_blocking(broker.url, backend=backend) as conn:
        conn.declare_queue(queue)
        with conn.channel() as ch:
            ch.publish("", queue, b"a")
            ch.publish("", queue, b"b")
        first, second = conn.get(queue, max_messages=2, lease_s=30)
        assert (first.body, second.body) == (b"a", b"b")
        first.ack()
        second.nack()
        assert conn.queue_info(queue).messages_ready == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_stop_consuming_from_another_thread_ends_the_iteration(broker: BrokerProcess, backend: str) -> None:
    queue = f"blocking-stop-{backend}"
    with client.connect_blocking(broker.url, backend=backend) as conn:
        with conn.channel() as ch:
            ch.declare_queue(queue)
            ch.publish("", queue, b"only")
            with ch.consume(queue) as messages:
                first = messages.receive(timeout_s=10)
                assert first is not None and first.body == b"only"
                first.ack()
                assert messages.receive(timeout_s=0.1) is None
                threading.Timer(0.2, conn.stop_consuming).start()
                assert list(messages) == []  # ends instead of blocking forever


@pytest.mark.parametrize("backend", BACKENDS)
def test_first_connect_to_nothing_gives_up_with_a_clear_error(backend: str, caplog: pytest.LogCaptureFixture) -> None:
    # the retries are warnings: seen whatever level another test left the root logger at
    caplog.set_level(logging.WARNING, logger="ackbus.client")
    url = f"http://127.0.0.1:{free_port()}"
    policy = ReconnectPolicy(initial_delay_s=0.01, max_delay_s=0.05, first_connect_give_up_after_s=0.5)
    start = time.monotonic()
    with client.connect_blocking(url, backend=backend, reconnect=policy) as conn:
        with pytest.raises(ConnectionLost, match="could not open a channel") as lost:
            with conn.channel():
                pass  # pragma: no cover
    assert isinstance(lost.value, ConnectionError)
    assert time.monotonic() - start < 30
    attempts = [r for r in caplog.records if r.name == "ackbus.client" and "retrying in" in r.getMessage()]
    assert attempts and "[Errno 111]" in attempts[0].getMessage()  # the cause, not anyio's summary
