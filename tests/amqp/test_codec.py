"""The sans-IO codec: field tables keep every AMQP type through JSON, properties and
the hand-written per-message frames agree with pamqp's encoding."""

from __future__ import annotations

import datetime
import decimal
import struct

import orjson
import pytest
from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from broker.amqp.frames import (
    Ack,
    FrameError,
    FrameReader,
    Nack,
    Publish,
    Reject,
    decode_content_header,
    decode_method,
    encode_confirm,
    encode_deliver,
    encode_properties,
)
from broker.amqp.tables import TableError, decode_table, encode_table

# one value of every AMQP 0-9-1 field type (RabbitMQ's dialect), written by hand
_EVERY_TYPE = b"".join(
    [
        b"\x04bool" b"t\x01",
        b"\x02i8" b"b" + struct.pack(">b", -5),
        b"\x02u8" b"B" + struct.pack(">B", 200),
        b"\x03i16" b"s" + struct.pack(">h", -300),
        b"\x03u16" b"u" + struct.pack(">H", 60000),
        b"\x03i32" b"I" + struct.pack(">i", -70000),
        b"\x03u32" b"i" + struct.pack(">I", 4000000000),
        b"\x03i64" b"l" + struct.pack(">q", 1 << 40),
        b"\x05small" b"l" + struct.pack(">q", 7),
        b"\x03f32" b"f" + struct.pack(">f", 1.5),
        b"\x03f64" b"d" + struct.pack(">d", 2.25),
        b"\x03dec" b"D\x02" + struct.pack(">i", 12345),
        b"\x03str" b"S" + struct.pack(">I", 5) + "héllo".encode()[:5],
        b"\x03bin" b"S" + struct.pack(">I", 2) + b"\xff\xfe",
        b"\x02ts" b"T" + struct.pack(">Q", 1700000000),
        b"\x03arr" b"A" + struct.pack(">I", 8) + b"I" + struct.pack(">i", 1) + b"t\x00" + b"V",
        b"\x03tbl" b"F" + struct.pack(">I", 4) + b"\x01kt\x01",
        b"\x04void" b"V",
        b"\x05bytes" b"x" + struct.pack(">I", 3) + b"\x00\x01\x02",
    ]
)


def _table_bytes() -> bytes:
    return struct.pack(">I", len(_EVERY_TYPE)) + _EVERY_TYPE


def test_every_field_type_survives_json_and_back() -> None:
    table, end = decode_table(_table_bytes())
    assert end == len(_table_bytes())
    assert table["bool"] is True and table["i32"] == -70000 and table["i64"] == 1 << 40
    assert table["i8"] == {"$amqp": "int8", "value": -5}
    assert table["small"] == {"$amqp": "int64", "value": 7}
    assert table["dec"] == {"$amqp": "decimal", "value": "123.45"}
    assert table["ts"] == {"$amqp": "timestamp", "value": 1700000000}
    assert table["bin"]["$amqp"] == "longstr" and table["bytes"]["$amqp"] == "bytes" and table["void"] is None
    # through JSON (what the core keeps and HTTP consumers see) and back: same bytes
    through_json = orjson.loads(orjson.dumps(table))
    assert encode_table(through_json) == _table_bytes()


def test_untyped_tables_give_plain_values() -> None:
    table, _ = decode_table(_table_bytes(), typed=False)
    assert table["i8"] == -5 and table["u32"] == 4000000000 and table["ts"] == 1700000000


def test_plain_json_is_encoded_as_rabbitmq_clients_do() -> None:
    raw = encode_table({"n": 1, "big": 1 << 40, "s": "x", "f": 0.5, "l": [True, None], "t": {"a": "b"}})
    table, _ = decode_table(raw)
    assert table == {"n": 1, "big": 1 << 40, "s": "x", "f": 0.5, "l": [True, None], "t": {"a": "b"}}
    assert b"nI" in raw and b"bigl" in raw


def test_pamqp_reads_what_we_write() -> None:
    from pamqp import decode

    _n, value = decode.field_table(_table_bytes())
    assert value["dec"] == decimal.Decimal("123.45")
    assert value["ts"] == datetime.datetime.fromtimestamp(1700000000, tz=datetime.UTC)


@pytest.mark.parametrize(
    "raw",
    [
        struct.pack(">I", 10) + b"\x01a",  # longer than its data
        struct.pack(">I", 3) + b"\x01aZ",  # unknown type
        struct.pack(">I", 6) + b"\x01aS\x00\x00",  # truncated string length
        struct.pack(">I", 2) + b"\x05a",  # name past the end
    ],
)
def test_malformed_tables_are_refused(raw: bytes) -> None:
    with pytest.raises(TableError):
        decode_table(raw)


def test_tagged_values_out_of_range_are_refused() -> None:
    with pytest.raises(TableError):
        encode_table({"x": {"$amqp": "int8", "value": 1000}})


def test_hot_methods_match_pamqp() -> None:
    for method, expected in [
        (commands.Basic.Publish(exchange="ex", routing_key="rk", mandatory=True), Publish("ex", "rk", True, False)),
        (commands.Basic.Ack(delivery_tag=7, multiple=True), Ack(7, True)),
        (commands.Basic.Nack(delivery_tag=8, multiple=False, requeue=True), Nack(8, False, True)),
        (commands.Basic.Reject(delivery_tag=9, requeue=False), Reject(9, False)),
    ]:
        payload = pframe.marshal(method, 1)[7:-1]
        assert decode_method(payload)[1] == expected


def test_properties_round_trip_with_pamqp() -> None:
    props = {
        "content_type": "application/json", "content_encoding": "gzip", "headers": {"k": [1, "two"]},
        "delivery_mode": 2, "priority": 5, "correlation_id": "c", "reply_to": "r", "expiration": 1500,
        "message_id": "m", "timestamp": 1700000000, "type": "t", "user_id": "guest", "app_id": "a",
        "cluster_id": "cl",
    }
    raw = encode_properties(props)
    header_payload = struct.pack(">HHQ", 60, 0, 3) + raw
    parsed = decode_content_header(header_payload).properties
    assert parsed == {**props, "expiration": "1500"}
    theirs = pheader.ContentHeader()
    theirs.unmarshal(header_payload)
    assert theirs.properties.message_type == "t" and theirs.properties.headers == {"k": [1, "two"]}


def test_deliver_and_confirm_frames_parse_with_pamqp() -> None:
    data = encode_deliver(3, "ctag", 42, True, "ex", "rk", encode_properties({"content_type": "x"}), b"a" * 10, 4096)
    n, channel, method = pframe.unmarshal(data)
    assert channel == 3 and isinstance(method, commands.Basic.Deliver)
    assert (method.consumer_tag, method.delivery_tag, method.redelivered, method.exchange) == ("ctag", 42, True, "ex")
    n2, _, head = pframe.unmarshal(data[n:])
    assert head.body_size == 10 and head.properties.content_type == "x"
    _n3, _, body = pframe.unmarshal(data[n + n2:])
    assert body.value == b"a" * 10
    _n, _, ack = pframe.unmarshal(encode_confirm(1, 5, True, False))
    assert isinstance(ack, commands.Basic.Nack) and ack.delivery_tag == 5 and ack.multiple


def test_large_bodies_are_split_at_frame_max() -> None:
    data = encode_deliver(1, "c", 1, False, "", "q", b"\x00\x00", b"z" * 10000, 4096)
    frames = []
    while data:
        n, _, value = pframe.unmarshal(data)
        assert n <= 4096
        frames.append(value)
        data = data[n:]
    assert [type(f).__name__ for f in frames] == ["Deliver", "ContentHeader", "ContentBody", "ContentBody", "ContentBody"]


def test_frame_reader_enforces_frame_max_and_frame_end() -> None:
    reader = FrameReader(4096)
    reader.feed(struct.pack(">BHI", 3, 1, 5000))
    with pytest.raises(FrameError) as err:
        reader.next_frame()
    assert err.value.code == 501
    reader = FrameReader(4096)
    reader.feed(struct.pack(">BHI", 8, 0, 0) + b"\x00")
    with pytest.raises(FrameError):
        reader.next_frame()
    reader = FrameReader(4096)
    reader.feed(struct.pack(">BHI", 9, 0, 0) + b"\xce")
    with pytest.raises(FrameError):
        reader.next_frame()


def test_frame_reader_waits_for_whole_frames() -> None:
    data = encode_confirm(1, 1, False, True)
    reader = FrameReader(4096)
    for byte in data[:-1]:
        reader.feed(bytes([byte]))
        assert reader.next_frame() is None
    reader.feed(data[-1:])
    assert reader.next_frame() == (1, 1, data[7:-1])


@pytest.mark.parametrize("size", [0, 1, 4088, 4089, 9000])
def test_deliveries_are_the_frames_pamqp_makes(size: int) -> None:
    """encode_deliver (a packed template per consumer and key) against pamqp's
    marshalling of the same deliver, header and body frames, byte for byte, for bodies
    that are empty, fill a frame exactly, spill into a second, or take three; the same
    key twice (the template reused) and another key."""
    props = {"content_type": "t", "delivery_mode": 2}
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    for tag, redelivered, key in ((7, False, "rk"), (2**40, True, "rk"), (8, False, "other.key")):
        ours = encode_deliver(5, "ctag-1", tag, redelivered, "ex", key, encode_properties(props), body, 4096)
        expected = pframe.marshal(commands.Basic.Deliver(
            consumer_tag="ctag-1", delivery_tag=tag, redelivered=redelivered, exchange="ex", routing_key=key), 5)
        expected += pframe.marshal(pheader.ContentHeader(0, size, commands.Basic.Properties(**props)), 5)
        for start in range(0, size, 4088):
            expected += pframe.marshal(pbody.ContentBody(body[start : start + 4088]), 5)
        assert ours == expected


def test_x_death_goes_out_with_rabbitmq_field_types() -> None:
    """ackbus keeps an x-death count and time as plain numbers; over AMQP they are a
    long and a timestamp, as RabbitMQ sends them (Java clients cast them to Long and
    Date). Other headers and the stored properties are untouched."""
    death = {"queue": "q", "reason": "expired", "count": 2, "time": 1700000000, "routing-keys": ["q"]}
    props = {"headers": {"x-death": [death], "n": 2}}
    raw = encode_properties(props)
    parsed, _end = decode_table(raw, 2)  # (after the property flags)
    (entry,) = parsed["x-death"]
    assert entry["count"] == {"$amqp": "int64", "value": 2}
    assert entry["time"] == {"$amqp": "timestamp", "value": 1700000000}
    assert parsed["n"] == 2 and entry["routing-keys"] == ["q"]
    assert props["headers"]["x-death"][0]["count"] == 2  # (the message's own copy stays)
