"""The delayed-message exchange (``x-delayed-message``, RabbitMQ's plugin) from every
front end of one broker subprocess: pika declares it and publishes with ``x-delay``,
the HTTP channel's publish and REST publish carry the header in their properties; each
message arrives only once its delay has passed, and the publisher's confirm does not
wait for it. Also a restart (kill -9) while a message is delayed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.broker import BrokerProcess, amqp_broker
from tests.support.rawchannel import RawChannel
from tests.support.wait import wait_until_sync

pika = pytest.importorskip("pika")

pytestmark = pytest.mark.timeout(120)

DELAY_MS = 300


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with amqp_broker(tmp_path_factory.mktemp("delayed") / "data") as proc:
        yield proc


def _pika(broker: BrokerProcess) -> Any:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port, heartbeat=30))


def _delayed_exchange_and_queue(ch: Any, name: str) -> None:
    ch.exchange_declare(name, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_declare(name, durable=True)
    ch.queue_bind(name, name, routing_key="k")


def _queue(broker: BrokerProcess, name: str) -> dict[str, Any]:
    status, body = broker.request("GET", f"/queues/{name}")
    assert status == 200, body
    return dict(body)


def _get_one(broker: BrokerProcess, name: str) -> dict[str, Any] | None:
    """The queue's next ready message over REST (leased past the test's end), or None."""
    status, body = broker.request("POST", f"/queues/{name}/get?max=1&lease=600")
    assert status == 200, body
    return body["messages"][0] if body["messages"] else None


def test_pika_declares_publishes_with_x_delay_and_gets_it_only_when_due(broker: BrokerProcess) -> None:
    conn = _pika(broker)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        _delayed_exchange_and_queue(ch, "pika-delayed")
        # a long delay: the confirm (basic_publish blocks on it) comes at once
        before = time.monotonic()
        ch.basic_publish("pika-delayed", "k", b"much later", pika.BasicProperties(headers={"x-delay": 600_000}))
        assert time.monotonic() - before < 60
        got: dict[bytes, tuple[float, Any]] = {}
        ch.basic_consume(
            "pika-delayed", lambda c, m, p, b: got.setdefault(b, (time.monotonic(), p.headers)), auto_ack=True
        )
        sent = time.monotonic()
        ch.basic_publish("pika-delayed", "k", b"soon", pika.BasicProperties(headers={"x-delay": DELAY_MS}))
        ch.basic_publish("pika-delayed", "k", b"now", pika.BasicProperties(headers={"x-delay": 0}))
        assert _queue(broker, "pika-delayed")["messages_delayed"] >= 1

        def two_arrived() -> bool:
            conn.process_data_events(time_limit=0.05)
            return len(got) >= 2

        wait_until_sync(two_arrived, 30, interval_s=0, what="the undelayed and the 300 ms message")
        assert sorted(got) == [b"now", b"soon"]
        arrived, headers = got[b"soon"]
        assert arrived - sent >= DELAY_MS / 1000
        assert headers == {"x-delay": -DELAY_MS}  # the plugin's mark on a delayed message
        assert got[b"now"][1] == {"x-delay": 0}  # not delayed: untouched
        assert _queue(broker, "pika-delayed")["messages_delayed"] == 1  # the 10-minute one
    finally:
        conn.close()


def test_pika_declare_without_x_delayed_type_is_406(broker: BrokerProcess) -> None:
    conn = _pika(broker)
    try:
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.exchange_declare("no-routing-type", "x-delayed-message")
        assert err.value.reply_code == 406
        assert "x-delayed-type" in err.value.reply_text
        assert broker.request("GET", "/exchanges/no-routing-type")[0] == 404
    finally:
        conn.close()


def test_http_channel_and_rest_publish_delay_by_the_header(broker: BrokerProcess) -> None:
    status, body = broker.request(
        "PUT", "/exchanges/http-delayed", {"type": "x-delayed-message", "arguments": {"x-delayed-type": "fanout"}}
    )
    assert status == 201, body
    status, body = broker.request("PUT", "/exchanges/http-bad", {"type": "x-delayed-message"})
    assert status == 400 and "x-delayed-type" in body["message"], body
    assert broker.request("PUT", "/queues/http-delayed", {})[0] == 201
    assert broker.request("POST", "/bindings", {"exchange": "http-delayed", "queue": "http-delayed"})[0] in (200, 201)

    sent = time.monotonic()
    channel = RawChannel(broker.port)
    try:
        channel.send({"op": "publish", "exchange": "http-delayed", "routing_key": "", "body": "from-channel",
                      "properties": {"headers": {"x-delay": DELAY_MS}}})
        event = channel.next_event()
        while event["ev"] not in ("ack", "nack", "error"):
            event = channel.next_event()
        assert event["ev"] == "ack", event  # at once, not after the delay
    finally:
        channel.close()
    # REST: a header travels as X-Header-<name>, a string of digits (the plugin reads it too)
    status, body = broker.request(
        "POST", "/exchanges/http-delayed/publish", b"from-rest", headers={"X-Header-X-Delay": str(DELAY_MS)}
    )
    assert status == 200 and body == {"confirm": "ack", "routed": 1}, body
    assert _queue(broker, "http-delayed")["messages_delayed"] >= 1

    got: list[tuple[float, dict[str, Any]]] = []

    def both_arrived() -> bool:
        message = _get_one(broker, "http-delayed")
        if message is not None:
            got.append((time.monotonic(), message))
        return len(got) == 2

    wait_until_sync(both_arrived, 30, what="both delayed messages")
    assert all(arrived - sent >= DELAY_MS / 1000 for arrived, _m in got)
    bodies = sorted(m["body"] for _t, m in got)
    assert bodies == ["from-channel", "from-rest"]
    for _t, message in got:
        assert message["properties"]["headers"]["x-delay"] == -DELAY_MS


@pytest.mark.slow
def test_a_delayed_message_keeps_its_delay_across_a_crash(tmp_path: Any) -> None:
    proc = amqp_broker(tmp_path / "data")
    proc.start()
    try:
        conn = _pika(proc)
        try:
            ch = conn.channel()
            ch.confirm_delivery()
            _delayed_exchange_and_queue(ch, "crash-delayed")
            sent = time.monotonic()
            delay_ms = 3000
            ch.basic_publish("crash-delayed", "k", b"held", pika.BasicProperties(headers={"x-delay": delay_ms}))
        finally:
            conn.close()
        proc.kill()
        proc.start()
        queue = _queue(proc, "crash-delayed")
        if time.monotonic() - sent < delay_ms / 1000 - 0.5:  # (a slow restart may come after the due time)
            assert (queue["messages_delayed"], queue["messages_ready"]) == (1, 0), queue
        arrived = wait_until_sync(
            lambda: _get_one(proc, "crash-delayed"), 30, interval_s=0.05, what="the delayed message after the restart"
        )
        assert time.monotonic() - sent >= delay_ms / 1000
        # (a crash counts every message as possibly delivered: x-delivery-count joins it)
        assert arrived["body"] == "held" and arrived["properties"]["headers"]["x-delay"] == -delay_ms
    finally:
        proc.stop()
