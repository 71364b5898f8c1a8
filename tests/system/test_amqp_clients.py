"""RabbitMQ's own clients, unchanged, against a broker subprocess's AMQP port: pika
(blocking), aio-pika (asyncio), kombu on py-amqp; and messages crossing between AMQP
and HTTP with their properties and every AMQP header type (docs/amqp.md)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import decimal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess, amqp_broker, free_port
from tests.support.rawchannel import RawChannel

pika = pytest.importorskip("pika")
aio_pika = pytest.importorskip("aio_pika")
kombu = pytest.importorskip("kombu")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with amqp_broker(tmp_path_factory.mktemp("amqp") / "data") as proc:
        yield proc


def _pika(broker: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port, heartbeat=30))


def test_pika_confirms_returns_consume_get_nack_tx(broker: BrokerProcess) -> None:
    conn = _pika(broker)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        q = ch.queue_declare("pika-q", durable=True).method.queue
        ch.basic_publish("", q, b"one", pika.BasicProperties(delivery_mode=2, content_type="text/plain"))
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("amq.direct", "nowhere", b"lost", mandatory=True)
        ch.basic_publish("", q, b"two")
        method, props, body = ch.basic_get(q)
        assert body == b"one" and props.content_type == "text/plain" and props.delivery_mode == 2
        ch.basic_nack(method.delivery_tag, requeue=True)
        ch.basic_qos(prefetch_count=10)
        got = []
        for method, _props, body in ch.consume(q, inactivity_timeout=5):
            assert method is not None, "a delivery was missing"
            got.append((body, method.redelivered))
            ch.basic_ack(method.delivery_tag)
            if len(got) == 2:
                break
        ch.cancel()
        assert sorted(got) == [(b"one", True), (b"two", False)]
        tx = conn.channel()
        tx.tx_select()
        tx.basic_publish("", q, b"rolled back")
        tx.tx_rollback()
        tx.basic_publish("", q, b"committed")
        tx.tx_commit()
        assert ch.queue_declare(q, passive=True).method.message_count == 1
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare("missing", passive=True)
        assert err.value.reply_code == 404
        assert conn.is_open
    finally:
        conn.close()



def test_aio_pika(broker: BrokerProcess) -> None:
    async def main() -> list[bytes]:
        conn = await aio_pika.connect_robust(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/")
        async with conn:
            channel = await conn.channel(publisher_confirms=True)
            await channel.set_qos(prefetch_count=5)
            exchange = await channel.declare_exchange("aio-x", aio_pika.ExchangeType.TOPIC)
            queue = await channel.declare_queue("", exclusive=True)
            await queue.bind(exchange, "a.#")
            for i in range(5):
                await exchange.publish(aio_pika.Message(b"m%d" % i, headers={"i": i}), routing_key=f"a.{i}")
            got = []
            async with queue.iterator() as it:
                async for message in it:
                    async with message.process():
                        assert message.headers["i"] == int(message.body[1:])
                        got.append(message.body)
                    if len(got) == 5:
                        break
            return got

    assert asyncio.run(main()) == [b"m%d" % i for i in range(5)]


def test_kombu_on_py_amqp(broker: BrokerProcess) -> None:
    with kombu.Connection(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}//", transport_options={"confirm_publish": True}) as conn:
        queue = conn.SimpleQueue("kombu-q")
        queue.put({"hello": "world"})
        message = queue.get(timeout=10)
        assert message.payload == {"hello": "world"}
        message.ack()
        queue.close()


def test_amqp_headers_of_every_type_reach_http_and_come_back(broker: BrokerProcess) -> None:
    headers = {
        "str": "text", "int": 7, "big": 1 << 40, "neg": -3, "bool": True,
        "list": [1, "a", False], "table": {"nested": "yes"}, "none": None,
        "dec": decimal.Decimal("1.5"), "when": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
        "bytes": b"\x00\x01",
    }
    conn = _pika(broker)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("interop", durable=True)
        props = pika.BasicProperties(content_type="application/json", correlation_id="c1", message_id="m1",
                                     priority=4, timestamp=1700000000, type="t", app_id="app",
                                     expiration="600000", headers=headers, reply_to="r", delivery_mode=2)
        ch.basic_publish("", "interop", b"\xffbinary", props)
        status, listing = broker.request("GET", "/queues/interop/messages?limit=1")
        assert status == 200
        seen = listing["messages"][0]
        assert base64.b64decode(seen["body_b64"]) == b"\xffbinary"
        p = seen["properties"]
        assert p["content_type"] == "application/json" and p["expiration"] == 600000 and p["priority"] == 4
        h = p["headers"]
        assert h["int"] == 7 and h["big"] == 1 << 40 and h["table"] == {"nested": "yes"} and h["none"] is None
        assert h["dec"] == {"$amqp": "decimal", "value": "1.5"}
        assert h["when"] == {"$amqp": "timestamp", "value": 1704164645}
        assert h["bytes"] == {"$amqp": "bytes", "value": "AAE="}
        # and back out over AMQP with the same types
        method, back, body = ch.basic_get("interop", auto_ack=True)
        assert body == b"\xffbinary"
        assert back.headers == headers
        assert (back.expiration, back.message_id, back.timestamp, back.type) == ("600000", "m1", 1700000000, "t")
    finally:
        conn.close()


def test_http_publish_reaches_an_amqp_consumer(broker: BrokerProcess) -> None:
    conn = _pika(broker)
    try:
        ch = conn.channel()
        ch.queue_declare("from-http")
        channel = RawChannel(broker.port)
        channel.send({"op": "publish", "exchange": "", "routing_key": "from-http", "body": "hi",
                      "properties": {"headers": {"n": 5, "l": [1, 2], "t": {"$amqp": "int8", "value": 3}},
                                     "content_type": "text/plain", "expiration": 60000}},
                     {"op": "close"})
        while channel.next_event().get("ev") != "close_ok":
            pass
        channel.close()
        method, props, body = ch.basic_get("from-http", auto_ack=True)
        assert body == b"hi" and props.content_type == "text/plain" and props.expiration == "60000"
        assert props.headers == {"n": 5, "l": [1, 2], "t": 3}
    finally:
        conn.close()


def test_headers_with_no_amqp_form_are_refused_at_the_publish(broker: BrokerProcess) -> None:
    """A header name over 255 bytes has no AMQP form: an HTTP publish of one is
    refused (the channel's error), so no AMQP consumer is ever handed it (messages
    stored before: tests/amqp/test_unsendable_headers.py)."""
    conn = _pika(broker)
    try:
        ch = conn.channel()
        ch.queue_declare("no-form")
        channel = RawChannel(broker.port)
        properties = {"headers": {"k" * 300: 1}, "content_type": "text/plain"}
        channel.send({"op": "publish", "exchange": "", "routing_key": "no-form", "body": "m", "properties": properties})
        error = channel.next_event()
        assert error["ev"] == "error" and "longer than 255 bytes" in error["message"], error
        channel.close()
        method, _props, _body = ch.basic_get("no-form", auto_ack=True)
        assert method is None
    finally:
        conn.close()


def test_amqp_channels_are_listed_with_the_http_ones(broker: BrokerProcess) -> None:
    named = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.amqp_port, heartbeat=30,
        client_properties={"connection_name": "billing-worker-3"}))
    conn = _pika(broker)
    try:
        named.channel()
        conn.channel()
        status, body = broker.request("GET", "/channels")
        assert status == 200
        amqp = [c for c in body["channels"] if c["kind"] == "amqp"]
        # RabbitMQ's client-provided name, and the library with its version
        assert sorted(c["connection_name"] or "" for c in amqp) == ["", "billing-worker-3"]
        assert {c["user_agent"] for c in amqp} == {f"Pika Python Client Library/{pika.__version__}"}
        status, one = broker.request("GET", f"/channels/{amqp[0]['id']}")
        assert status == 200 and one["connection_name"] == amqp[0]["connection_name"]
    finally:
        conn.close()
        named.close()


def test_taken_amqp_port_is_a_clear_start_error(broker: BrokerProcess, tmp_path: Path) -> None:
    other = BrokerProcess(tmp_path / "data", env={"ACKBUS_AMQP_PORT": str(broker.amqp_port)})
    with pytest.raises(Exception):
        other.start(timeout_s=15)
    other.stop()
    assert "cannot listen for AMQP" in other.log_path.read_text()


def test_an_operator_closes_one_amqp_channel(broker: BrokerProcess) -> None:
    conn = _pika(broker)
    try:
        ch = conn.channel()
        other = conn.channel()
        ch.queue_declare("op-close")
        status, body = broker.request("GET", "/channels")
        ids = [c["id"] for c in body["channels"] if c["kind"] == "amqp"]
        assert len(ids) == 2
        status, _ = broker.request("DELETE", f"/channels/{min(ids)}", {"reason": "maintenance"})
        assert status == 200
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare("op-close", passive=True)
        assert err.value.reply_code == 320
        assert other.queue_declare("op-close", passive=True).method.message_count == 0
    finally:
        conn.close()


def test_graceful_shutdown_closes_amqp_connections_with_320(tmp_path: Path) -> None:
    import signal
    import time

    port = free_port()
    proc = BrokerProcess(tmp_path / "data", env={"ACKBUS_AMQP_PORT": str(port)})
    proc.start()
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("shutdown-q", durable=True)
        ch.basic_publish("", "shutdown-q", b"kept", pika.BasicProperties(delivery_mode=2))
        started = time.monotonic()
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGTERM)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as err:
            for _ in range(200):
                conn.process_data_events(time_limit=0.1)
        assert err.value.reply_code == 320
        assert time.monotonic() - started < 5
        assert proc.proc.wait(timeout=30) == 0
        proc.start()
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
        assert conn.channel().queue_declare("shutdown-q", passive=True).method.message_count == 1
        conn.close()
    finally:
        proc.stop()


def test_connections_over_the_per_address_cap_are_closed(tmp_path: Path) -> None:
    port = free_port()
    proc = BrokerProcess(tmp_path / "data", env={"ACKBUS_AMQP_PORT": str(port)},
                         args=("--max-connections-per-address", "2"))
    proc.start()
    try:
        kept = [pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)) for _ in range(2)]
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1))
        kept[0].close()
        third = None
        for _ in range(50):  # the broker counts the closed one out once it has seen the close
            try:
                third = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1))
                break
            except pika.exceptions.AMQPConnectionError:
                import time

                time.sleep(0.05)
        assert third is not None
        third.close()
        kept[1].close()
    finally:
        proc.stop()
