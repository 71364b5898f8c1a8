"""The NDJSON codec: line splitting, bodies, properties, event decoding."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.codec import (
    Ack,
    BrokerCancel,
    CancelOk,
    CloseOk,
    Closing,
    ConsumeOk,
    Deliver,
    Error,
    Expired,
    LineSplitter,
    Nack,
    Ok,
    Open,
    Properties,
    Return,
    UnknownEvent,
    decode_body,
    decode_event,
    encode_body,
    encode_op,
    encode_publish,
)
from client.errors import ProtocolError


@settings(deadline=None)  # a loaded CI machine must not fail a pure test
@given(
    lines=st.lists(st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"\n", b"x").strip() or b"y")),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=20),
)
def test_splitter_reassembles_lines_whatever_the_chunking(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    splitter = LineSplitter()
    out: list[bytes] = []
    for a, b in zip(points, points[1:]):
        out += splitter.feed(data[a:b])
    assert out == [line.rstrip(b"\r") for line in lines if line.rstrip(b"\r")]
    assert splitter.buffered_bytes == 0
    splitter.check_at_end()


def test_splitter_skips_blank_lines_and_strips_cr() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b'{"a":1}\r\n\n\r\n{"b"') == [b'{"a":1}']
    assert splitter.feed(b":2}\n") == [b'{"b":2}']


def test_splitter_refuses_overlong_lines_before_buffering_them() -> None:
    splitter = LineSplitter(max_line_bytes=10)
    with pytest.raises(ProtocolError):
        splitter.feed(b"x" * 11)
    splitter = LineSplitter(max_line_bytes=10)
    splitter.feed(b"x" * 6)
    with pytest.raises(ProtocolError):
        splitter.feed(b"y" * 6 + b"\n")


def test_splitter_reports_a_partial_last_line() -> None:
    splitter = LineSplitter()
    splitter.feed(b'{"ev":"ack"')
    with pytest.raises(ProtocolError):
        splitter.check_at_end()


@settings(deadline=None)  # a loaded CI machine must not fail a pure test
@given(st.binary(max_size=300))
def test_body_round_trip(body: bytes) -> None:
    encoded = encode_body(body)
    assert set(encoded) in ({"body"}, {"body_b64"})
    wire = orjson.loads(orjson.dumps(encoded))
    assert decode_body(wire) == body


def test_text_bodies_travel_as_text() -> None:
    assert encode_body("héllo".encode()) == {"body": "héllo"}
    assert encode_body(b"\xff\x00") == {"body_b64": "/wA="}


def test_bad_bodies_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        decode_body({})
    with pytest.raises(ProtocolError):
        decode_body({"body_b64": "!!!"})


def test_properties_round_trip_and_omit_absent_fields() -> None:
    props = Properties(content_type="text/plain", headers={"k": [1, 2]}, priority=3, message_id="m")
    wire = props.to_json()
    assert wire == {"content_type": "text/plain", "headers": {"k": [1, 2]}, "priority": 3, "message_id": "m"}
    assert Properties.from_json(wire) == props
    assert Properties.from_json(None) == Properties()
    assert Properties.from_json({"future_field": 1}) == Properties()


@pytest.mark.parametrize(
    "bad, exc",
    [
        ({"nope": 1}, TypeError),
        ({"priority": 256}, ValueError),
        ({"delivery_mode": 3}, ValueError),
        ({"expiration": -1}, ValueError),
        ({"message_id": "x" * 256}, ValueError),
        ({"priority": True}, TypeError),
        ({"headers": [1]}, TypeError),
    ],
)
def test_properties_are_checked_like_the_broker_does(bad: dict, exc: type[Exception]) -> None:
    with pytest.raises(exc):
        Properties.coerce(bad)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(
    st.sampled_from(["content_type", "headers", "delivery_mode", "priority", "message_id", "timestamp", "app_id",
                     "expiration", "reply_to", "correlation_id", "type", "content_encoding", "unknown"]),
    st.one_of(st.none(), st.text(max_size=5), st.integers(0, 255), st.dictionaries(st.text(max_size=3), st.integers())),
))
def test_wire_properties_are_the_dataclass_built_from_them(wire: dict) -> None:
    """``from_json`` builds its instance without the dataclass's ``__init__``: it is
    equal to (and hashes, compares and prints as) the one built with it."""
    try:
        built = Properties.from_json(wire)
    except ProtocolError:
        return
    fields = {k: v for k, v in wire.items() if k != "unknown" and v is not None}
    expected = Properties(**fields)
    assert built == expected and repr(built) == repr(expected)
    assert built.to_json() == expected.to_json()
    with pytest.raises(AttributeError):
        built.priority = 1  # type: ignore[misc]  # still frozen
    if "headers" not in fields:
        assert hash(built) == hash(expected)


def test_wrongly_typed_wire_properties_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError):
        Properties.from_json({"priority": "high"})
    with pytest.raises(ProtocolError):
        Properties.from_json([1])


def test_encode_publish() -> None:
    line = encode_publish(exchange="x", routing_key="k", body=b"hi", properties=Properties(message_id="m"),
                          mandatory=True, op_id="m")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert orjson.loads(line) == {"op": "publish", "exchange": "x", "routing_key": "k", "body": "hi",
                                  "properties": {"message_id": "m"}, "mandatory": True, "id": "m"}
    assert orjson.loads(encode_op({"op": "close"})) == {"op": "close"}


def _ev(**obj: object) -> bytes:
    return orjson.dumps(obj)


def test_decode_every_event() -> None:
    msg = {"body": "hi", "properties": {"message_id": "m"}}
    assert decode_event(_ev(ev="open", channel=3, server="ackbus")) == Open("3", "ackbus")
    assert decode_event(_ev(ev="ack", delivery_tag=4, multiple=True)) == Ack(4, True)
    assert decode_event(_ev(ev="ack", delivery_tag=4)) == Ack(4, False)
    assert decode_event(_ev(ev="nack", delivery_tag=5, multiple=False, reason="full")) == Nack(5, False, "full")
    ret = decode_event(_ev(ev="return", delivery_tag=6, reply_code=312, reason="NO_ROUTE", exchange="x",
                           routing_key="k", message=msg))
    assert isinstance(ret, Return) and ret.message.body == b"hi" and ret.message.routing_key == "k"
    d = decode_event(_ev(ev="deliver", consumer_tag="c", delivery_tag=1, redelivered=True, exchange="",
                         routing_key="q", message={"body_b64": "/w==", "properties": {}}))
    assert d == Deliver("c", 1, True, "", "q", b"\xff", Properties())
    assert decode_event(_ev(ev="consume_ok", consumer_tag="c", id=7)) == ConsumeOk("c", 7)
    assert decode_event(_ev(ev="cancel_ok", consumer_tag="c", id="x")) == CancelOk("c", "x")
    assert decode_event(_ev(ev="cancel", consumer_tag="c", reason="deleted")) == BrokerCancel("c", "deleted")
    assert decode_event(_ev(ev="expired", consumer_tag="c", delivery_tag=2)) == Expired("c", 2)
    assert decode_event(_ev(ev="ok", id=1, op="declare_queue", queue="q", messages=0)) == Ok(
        1, "declare_queue", {"queue": "q", "messages": 0})
    assert decode_event(_ev(ev="error", error="not_found", message="no", id=2)) == Error("not_found", "no", 2)
    assert decode_event(_ev(ev="close_ok")) == CloseOk()
    assert decode_event(_ev(ev="closing", reason="bye")) == Closing("bye")
    assert isinstance(decode_event(_ev(ev="future", x=1)), UnknownEvent)


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1,2]",
        b'{"no_ev": 1}',
        b'{"ev": "ack"}',
        b'{"ev": "ack", "delivery_tag": "1"}',
        b'{"ev": "ack", "delivery_tag": true}',
        b'{"ev": "ack", "delivery_tag": 1, "multiple": "yes"}',
        b'{"ev": "deliver", "consumer_tag": "c", "delivery_tag": 1}',
        b'{"ev": "deliver", "consumer_tag": "c", "delivery_tag": 1, "message": {"properties": {}}}',
        b'{"ev": "ok", "id": [1]}',
    ],
)
def test_malformed_events_are_protocol_errors(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_event(line)


def test_a_deliveries_event_and_its_rows() -> None:
    from client.codec import DeliverBatch, delivery_fields

    event = decode_event(
        b'{"ev":"deliveries","d":[["c",1,false,0,"","q",{"message_id":"m"},"hi"],'
        b'["c",2,true,1,"x","k",null,{"b64":"/w=="}]]}'
    )
    assert isinstance(event, DeliverBatch) and len(event.rows) == 2
    tag, dtag, redelivered, count, exchange, routing_key, props, body = delivery_fields(event.rows[0])
    assert (tag, dtag, redelivered, count, exchange, routing_key, props.message_id, body) == (
        "c", 1, False, 0, "", "q", "m", b"hi"
    )
    assert delivery_fields(event.rows[1])[7] == b"\xff"
    for bad in (None, [], ["c", 1], ["c", "1", False, 0, "", "q", None, "x"], ["c", 1, 0, 0, "", "q", None, "x"],
                ["c", 1, False, -1, "", "q", None, "x"], ["c", 1, False, 0, "", "q", None, 5],
                ["c", 1, False, 0, "", "q", None, {"b64": "!"}], ["c", 1, False, 0, "", "q", 3, "x"]):
        with pytest.raises(ProtocolError):
            delivery_fields(bad)
    with pytest.raises(ProtocolError):
        decode_event(b'{"ev":"deliveries","d":{}}')


def test_a_rows_properties_are_checked_at_once_and_built_when_read() -> None:
    from client.codec import Properties, delivery_row
    from client.consumer import Message

    props = {"message_id": "m", "delivery_mode": 2, "unknown": 1}
    row = ["c", 1, False, 0, "", "q", props, "hi"]
    fields = delivery_row(row)
    assert fields[6] is props and fields[7] == b"hi"
    assert delivery_row(["c", 1, False, 0, "", "q", None, "hi"])[6] is None
    # a wrong type is refused on arrival, as Properties.from_json refuses it
    bads: list[object] = [{"message_id": 5}, {"delivery_mode": True}, {"headers": []}, [], "x"]
    for bad in bads:
        with pytest.raises(ProtocolError):
            delivery_row(["c", 1, False, 0, "", "q", bad, "hi"])
        with pytest.raises(ProtocolError):
            Properties.from_json(bad)
    message = Message(
        None, 1, body=b"hi", raw_properties=props, exchange="", routing_key="q", redelivered=False,  # type: ignore[arg-type]
        delivery_tag=1, consumer_tag="c",
    )
    built = message.properties
    assert built == Properties.from_json(props) == Properties(message_id="m", delivery_mode=2)
    assert message.properties is built and message.message_id == "m"
    empty = Message(
        None, 1, body=b"", exchange="", routing_key="q", redelivered=False,  # type: ignore[arg-type]
        delivery_tag=2, consumer_tag="c",
    )
    assert empty.properties == Properties() and empty.message_id is None
