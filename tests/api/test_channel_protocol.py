"""``POST /channel`` over real loopback HTTP: the exchange itself, the ops and their
replies, publisher confirms, returns and nacks (docs/protocol.md)."""

from __future__ import annotations

import base64
from typing import Any

import h11
import orjson
import pytest
import trio
import trio.testing

from broker.app import BrokerApp
from tests.support.app import open_tcp_broker
from tests.support.channel import ChannelEnded, Clients


def settled_tags(confirms: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Expand ack/nack events (``multiple`` ranges included) into (tag, ev) pairs,
    checking that confirms never go backwards."""
    out: list[tuple[int, str]] = []
    last = 0
    for ev in confirms:
        tag = ev["delivery_tag"]
        assert tag > last, f"confirm for tag {tag} after tag {last}: {confirms}"
        first = last + 1 if ev["multiple"] else tag
        out.extend((t, ev["ev"]) for t in range(first, tag + 1))
        last = tag
    return out


# -- the exchange -------------------------------------------------------------------------


async def test_open_arrives_before_the_request_body_ends(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    assert ch.http.status == 200
    assert ch.http.headers["content-type"] == "application/x-ndjson"
    assert ch.http.headers["transfer-encoding"] == "chunked"
    assert ch.open_event is not None and isinstance(ch.open_event["channel"], int)
    assert ch.open_event["server"].startswith("ackbus/")
    assert not ch.body_ended



async def test_expect_100_continue_is_answered_before_the_response(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel(expect_continue=True)
    assert ch.http.informational == [100]
    assert ch.http.status == 200



async def test_channel_ids_differ_per_channel(app: BrokerApp, clients: Clients) -> None:
    a = await clients.channel()
    b = await clients.channel()
    assert a.channel_id != b.channel_id
    assert set(app.runtime.sinks) >= {a.channel_id, b.channel_id}




async def test_close_op_gives_close_ok_and_ends_the_response(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send({"op": "close", "id": 7})
    assert await ch.remaining_events() == [{"ev": "close_ok", "id": 7}]
    assert ch.http.ended


async def test_end_of_body_without_consumers_closes_the_channel(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send({"op": "declare_queue", "queue": "eob", "id": 1})
    await ch.end_body()
    events = await ch.remaining_events()
    assert [e["ev"] for e in events] == ["ok", "close_ok"]
    await trio.testing.wait_all_tasks_blocked()
    assert ch.channel_id not in app.runtime.core.channels


async def test_ops_split_across_chunks_and_several_per_chunk(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    line = b'{"op":"declare_queue","queue":"split","id":"a"}\n{"op":"declare_'
    await ch.send_raw(line)
    await ch.send_raw(b'queue","queue":"split","id":"b"}')
    await ch.send_raw(b"\n\n   \n")  # blank lines are ignored
    assert (await ch.expect("ok", id="a"))["created"] is True
    assert (await ch.expect("ok", id="b"))["created"] is False



async def test_last_op_without_newline_is_applied_at_end_of_body(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send_raw(b'{"op":"declare_queue","queue":"tail","id":"t"}')
    await ch.end_body()
    events = await ch.remaining_events()
    assert [e["ev"] for e in events] == ["ok", "close_ok"]
    assert "tail" in app.runtime.core.queues


# -- declare / bind ops --------------------------------------------------------------------


async def test_declare_bind_unbind_delete_ops(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    r = await ch.ok({"op": "declare_exchange", "exchange": "logs", "type": "topic"})
    assert r == {"ev": "ok", "id": r["id"], "op": "declare_exchange", "exchange": "logs", "created": True}
    r = await ch.ok({"op": "declare_queue", "queue": "errors"})
    assert r["op"] == "declare_queue" and r["queue"] == "errors"
    assert r["created"] is True and r["messages"] == 0 and r["consumers"] == 0
    await ch.ok({"op": "bind", "exchange": "logs", "queue": "errors", "routing_key": "*.error"})
    await ch.send(
        {"op": "publish", "exchange": "logs", "routing_key": "db.error", "body": "e1"},
        {"op": "publish", "exchange": "logs", "routing_key": "db.info", "body": "i1"},
    )
    r = await ch.ok({"op": "declare_queue", "queue": "errors", "passive": True})
    assert r["messages"] == 1 and r["created"] is False
    r = await ch.ok({"op": "purge_queue", "queue": "errors"})
    assert r["messages"] == 1
    await ch.ok({"op": "unbind", "exchange": "logs", "queue": "errors", "routing_key": "*.error"})
    await ch.send({"op": "publish", "exchange": "logs", "routing_key": "db.error", "body": "e2"})
    r = await ch.ok({"op": "delete_queue", "queue": "errors"})
    assert r["messages"] == 0
    r = await ch.ok({"op": "delete_exchange", "exchange": "logs"})
    assert "logs" not in app.runtime.core.exchanges



async def test_exchange_to_exchange_binding_and_server_named_queue(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_exchange", "exchange": "front", "type": "fanout"})
    await ch.ok({"op": "declare_exchange", "exchange": "back", "type": "direct"})
    r = await ch.ok({"op": "declare_queue", "queue": "", "exclusive": True})
    qname = r["queue"]
    assert qname.startswith("amq.gen-")
    await ch.ok({"op": "bind", "exchange": "front", "to_exchange": "back", "routing_key": ""})
    await ch.ok({"op": "bind", "exchange": "back", "queue": qname, "routing_key": "k"})
    await ch.send({"op": "publish", "exchange": "front", "routing_key": "k", "body": "via e2e"})
    r = await ch.ok({"op": "declare_queue", "queue": qname, "exclusive": True, "passive": True})
    assert r["messages"] == 1



async def test_default_exchange_alias_and_body_b64(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "bin"})
    raw = bytes(range(256))
    await ch.send(
        {"op": "publish", "exchange": "amq.default", "routing_key": "bin",
         "body_b64": base64.b64encode(raw).decode()},
        {"op": "publish", "routing_key": "bin", "body": "text ✓",
         "properties": {"content_type": "text/plain", "headers": {"h": 1}, "priority": 3,
                        "message_id": "m-1", "delivery_mode": 1}},
    )
    ok = await ch.ok({"op": "consume", "queue": "bin", "no_ack": True})
    events = await ch.sync()
    deliveries = [e for e in events if e["ev"] == "deliver"]
    assert len(deliveries) == 2
    assert base64.b64decode(deliveries[0]["message"]["body_b64"]) == raw
    assert "body" not in deliveries[0]["message"]
    second = deliveries[1]
    assert second["message"]["body"] == "text ✓"
    assert second["message"]["properties"] == {
        "content_type": "text/plain", "headers": {"h": 1}, "priority": 3,
        "message_id": "m-1", "delivery_mode": 1,
    }
    assert second["exchange"] == "" and second["routing_key"] == "bin"
    assert second["consumer_tag"] == ok["consumer_tag"]



async def test_replies_echo_the_op_id(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send(
        {"op": "declare_queue", "queue": "ids", "id": 1},
        {"op": "consume", "queue": "ids", "consumer_tag": "c", "id": "two"},
        {"op": "qos", "prefetch": 5, "id": [3]},
        {"op": "cancel", "consumer_tag": "c", "id": None},
    )
    events = [await ch.next_event() for _ in range(4)]
    assert [(e["ev"], e["id"]) for e in events] == [
        ("ok", 1), ("consume_ok", "two"), ("ok", [3]), ("cancel_ok", None)
    ]
    assert events[1]["consumer_tag"] == "c" and events[3]["consumer_tag"] == "c"
    assert events[2]["op"] == "qos"



# -- publisher confirms --------------------------------------------------------------------


async def test_many_publishes_in_flight_are_each_confirmed_once_in_order(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "many"})
    total = 5000

    async def publish_all() -> None:
        n = 0
        while n < total:
            batch = [
                {"op": "publish", "routing_key": "many", "body": f"m{i}"}
                for i in range(n, min(total, n + 1 + n % 97))  # ragged chunk sizes
            ]
            n += len(batch)
            await ch.send(*batch)

    confirms: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish_all)
        while not confirms or confirms[-1]["delivery_tag"] < total:
            event = await ch.next_event()
            assert event["ev"] == "ack", event
            confirms.append(event)
    tags = settled_tags(confirms)
    assert [t for t, _ in tags] == list(range(1, total + 1))  # contiguous, each once
    assert any(c["multiple"] for c in confirms)  # coalesced while in flight
    assert app.runtime.core.queues["many"].ready_count() == total
    # nothing else trails behind the last confirm
    assert await ch.sync() == []



async def test_confirm_multiple_ranges_with_nacks_interleaved(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "mix"})
    ops = []
    expected = {}
    for i in range(1, 61):
        if i % 7 == 0:
            ops.append({"op": "publish", "exchange": "missing", "routing_key": "x", "body": "n"})
            expected[i] = "nack"
        else:
            ops.append({"op": "publish", "routing_key": "mix", "body": str(i)})
            expected[i] = "ack"
    await ch.send(*ops)  # one chunk: acks coalesce between the nacks
    events = await ch.sync()
    tags = settled_tags(events)
    assert dict(tags) == expected
    assert [t for t, _ in tags] == list(range(1, 61))
    nacks = [e for e in events if e["ev"] == "nack"]
    assert all(not e["multiple"] for e in nacks)
    assert all("missing" in e["reason"] and e["reason"].startswith("not_found") for e in nacks)
    acks = [e for e in events if e["ev"] == "ack"]
    assert len(acks) == 9 and all(e["multiple"] for e in acks)  # 6 acks between nacks



async def test_publish_tags_are_per_channel(app: BrokerApp, clients: Clients) -> None:
    a = await clients.channel()
    b = await clients.channel()
    await a.send({"op": "publish", "routing_key": "none", "body": "1"})
    await b.send({"op": "publish", "routing_key": "none", "body": "1"})
    await a.send({"op": "publish", "routing_key": "none", "body": "2"})
    assert (await a.next_event())["delivery_tag"] == 1
    assert (await a.next_event())["delivery_tag"] == 2
    assert (await b.next_event())["delivery_tag"] == 1




async def test_mandatory_unroutable_publish_is_returned_before_its_ack(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "routable"})
    await ch.send(
        {"op": "publish", "routing_key": "routable", "body": "a", "mandatory": True},
        {"op": "publish", "routing_key": "nowhere", "body": "b", "mandatory": True,
         "properties": {"correlation_id": "c-2"}},
        {"op": "publish", "routing_key": "nowhere", "body": "c"},  # not mandatory: dropped
        {"op": "publish", "routing_key": "routable", "body": "d"},
    )
    events = await ch.sync()
    returns = [e for e in events if e["ev"] == "return"]
    assert returns == [{
        "ev": "return", "delivery_tag": 2, "reply_code": 312, "reason": "NO_ROUTE",
        "exchange": "", "routing_key": "nowhere",
        "message": {"body": "b", "properties": {"correlation_id": "c-2"}},
    }]
    confirms = [e for e in events if e["ev"] in ("ack", "nack")]
    assert settled_tags(confirms) == [(1, "ack"), (2, "ack"), (3, "ack"), (4, "ack")]
    # the return comes before the confirm that covers tag 2
    covering = next(i for i, e in enumerate(events) if e["ev"] == "ack" and e["delivery_tag"] >= 2)
    assert events.index(returns[0]) < covering
    assert len(events) == len(returns) + len(confirms)


async def test_return_precedes_ack_even_when_confirmed_alone(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    for i in range(1, 4):
        await ch.send({"op": "publish", "routing_key": "void", "body": str(i), "mandatory": True})
        await ch.expect("return", delivery_tag=i, routing_key="void")
        await ch.expect("ack", delivery_tag=i)


async def test_events_keep_the_order_of_the_publishes_that_caused_them(app: BrokerApp, clients: Clients) -> None:
    """A nack of tag 1 (no such exchange) comes before the return of tag 2 (mandatory,
    unroutable), as before its ack: events follow operation order."""
    ch = await clients.channel()
    await ch.send(
        {"op": "publish", "exchange": "missing", "routing_key": "k", "body": "1"},
        {"op": "publish", "routing_key": "nowhere", "body": "2", "mandatory": True},
    )
    events = await ch.events_until(lambda e: e["ev"] == "ack" and e["delivery_tag"] >= 2)
    assert [(e["ev"], e["delivery_tag"]) for e in events] == [("nack", 1), ("return", 2), ("ack", 2)]


async def test_nack_reasons(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "full", "arguments": {"x-max-length": 1, "x-overflow": "reject-publish"}})
    await ch.ok({"op": "declare_exchange", "exchange": "inner", "type": "direct", "internal": True})
    await ch.send(
        {"op": "publish", "routing_key": "full", "body": "fits"},
        {"op": "publish", "routing_key": "full", "body": "overflows"},
        {"op": "publish", "exchange": "inner", "routing_key": "k", "body": "internal"},
        {"op": "publish", "exchange": "nope", "routing_key": "k", "body": "no exchange"},
    )
    events = await ch.sync()
    assert events[0] == {"ev": "ack", "delivery_tag": 1, "multiple": False}
    reasons = {e["delivery_tag"]: e["reason"] for e in events[1:]}
    assert [e["ev"] for e in events[1:]] == ["nack"] * 3
    assert "full" in reasons[2]
    assert reasons[3].startswith("access_refused")
    assert reasons[4].startswith("not_found")
    assert app.runtime.core.queues["full"].ready_count() == 1



async def test_publish_with_unknown_exchange_does_not_close_the_channel(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send({"op": "publish", "exchange": "ghost", "routing_key": "k", "body": "x"})
    await ch.expect("nack", delivery_tag=1)
    await ch.ok({"op": "declare_queue", "queue": "still-open"})



async def test_close_waits_for_the_confirms_of_earlier_publishes(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "q"})
    await ch.send(
        *[{"op": "publish", "routing_key": "q", "body": str(i)} for i in range(10)],
        {"op": "close"},
    )
    events = await ch.remaining_events()
    assert events == [{"ev": "ack", "delivery_tag": 10, "multiple": True}, {"ev": "close_ok"}]


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"{not json\n", "invalid_json"),
        (b"[1,2]\n", "invalid_json"),
        (b'{"op":"frobnicate"}\n', "unknown_op"),
        (b'{"nop":1}\n', "unknown_op"),
        (b'{"op":"publish","routing_key":7}\n', "invalid_argument"),
        (b'{"op":"publish","body":1}\n', "invalid_argument"),
        (b'{"op":"publish","body_b64":"***"}\n', "invalid_argument"),
        (b'{"op":"publish","mandatory":"yes"}\n', "invalid_argument"),
        (b'{"op":"publish","dedup":"no"}\n', "invalid_argument"),
        (b'{"op":"publish","properties":{"priority":"high"}}\n', "invalid_argument"),
        (b'{"op":"consume","queue":"missing"}\n', "not_found"),
        (b'{"op":"consume","queue":"q","prefetch":-1}\n', "invalid_argument"),
        (b'{"op":"cancel"}\n', "invalid_argument"),
        (b'{"op":"ack","delivery_tag":1}\n', "unknown_delivery_tag"),
        (b'{"op":"ack","delivery_tag":"1"}\n', "invalid_argument"),
        (b'{"op":"declare_queue","queue":"q","durable":false}\n', "precondition_failed"),
        (b'{"op":"bind","exchange":"amq.direct"}\n', "invalid_argument"),
        (b'{"op":"delete_queue","queue":"nope"}\n', "not_found"),
        (b'{"op":"publish","routing_key":"q","delay_s":-1}\n', "invalid_argument"),
        (b'{"op":"publish","routing_key":"q","delay_s":"soon"}\n', "invalid_argument"),
        (b'{"op":"nack","delivery_tag":1,"delay_s":1e99}\n', "invalid_argument"),
        (b'{"op":"declare_queue","queue":"x","arguments":{"x-delivery-limt":3}}\n', "invalid_argument"),
        (b'{"op":"declare_queue","queue":"x","arguments":{"x-delivery-limit":-3}}\n', "invalid_argument"),
    ],
)
async def test_bad_ops_are_channel_errors_in_band(app: BrokerApp, clients: Clients, line: bytes, code: str) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "q"})
    await ch.send_raw(line)
    events = await ch.remaining_events()
    assert [e["ev"] for e in events if e["ev"] not in ("ack", "nack")] == ["error"], events
    error = events[-1]
    assert error["error"] == code, error
    assert isinstance(error["message"], str) and error["message"]
    assert ch.http.status == 200  # errors never change the status once open
    await trio.testing.wait_all_tasks_blocked()
    assert ch.channel_id not in app.runtime.core.channels


async def test_error_event_echoes_the_failing_op_id(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send({"op": "consume", "queue": "absent", "id": "c1"})
    error = await ch.expect("error", id="c1", error="not_found")
    assert "absent" in error["message"]
    with pytest.raises(ChannelEnded):
        await ch.next_event()


async def test_ops_after_a_failing_op_in_the_same_chunk_are_not_applied(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send(
        {"op": "declare_queue", "queue": "before"},
        {"op": "bogus"},
        {"op": "declare_queue", "queue": "after"},
    )
    events = await ch.remaining_events()
    assert [e["ev"] for e in events] == ["ok", "error"]
    assert "before" in app.runtime.core.queues and "after" not in app.runtime.core.queues


async def test_publishes_before_an_error_still_get_their_confirms(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send(
        {"op": "publish", "routing_key": "x", "body": "1"},
        {"op": "publish", "routing_key": "x", "body": "2"},
        {"op": "ack", "delivery_tag": 99},
    )
    events = await ch.remaining_events()
    assert events[0] == {"ev": "ack", "delivery_tag": 2, "multiple": True}
    assert events[1]["ev"] == "error" and events[1]["error"] == "unknown_delivery_tag"


async def test_oversized_body_is_an_error(app: BrokerApp, clients: Clients) -> None:
    async with open_tcp_broker(max_body_bytes=1000) as small, Clients(small.port) as c:
        ch = await c.channel()
        await ch.send({"op": "publish", "routing_key": "q", "body": "x" * 1001})
        error = await ch.expect("error")
        assert error["error"] == "payload_too_large"


async def test_endless_line_is_an_error(app: BrokerApp, clients: Clients) -> None:
    async with open_tcp_broker(max_body_bytes=1000) as small, Clients(small.port) as c:
        ch = await c.channel()
        # a line may hold a body twice over (JSON escapes) plus 64 KiB of the rest
        for _ in range((2 * 1000 + 65536) // 1000 + 2):
            try:
                await ch.send_raw(b"x" * 1000)
            except trio.BrokenResourceError:  # pragma: no cover - the broker hung up early
                break
        error = await ch.expect("error")
        assert error["error"] == "payload_too_large"


async def test_channel_refused_before_open_gets_an_http_status() -> None:
    async with open_tcp_broker(max_channels=1) as app, Clients(app.port) as c:
        await c.channel()
        status, body = await c.rest(
            "POST", "/channel", b"", headers=[("Content-Type", "application/x-ndjson")]
        )
        assert status == 503 and body["error"] == "limit_reached"


async def test_connection_is_kept_after_a_channel_whose_body_ended(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    await ch.send({"op": "declare_queue", "queue": "ka", "id": 1})
    await ch.end_body()
    assert [e["ev"] for e in await ch.remaining_events()] == ["ok", "close_ok"]
    # the same TCP connection carries the next request
    http = ch.http
    http.h11.start_next_cycle()
    http.ended = False
    await http.send_event(h11.Request(method="GET", target="/queues/ka", headers=[("Host", "t")]))
    await http.send_event(h11.EndOfMessage())
    await http.read_head()
    assert http.status == 200
    assert orjson.loads(await http.read_rest())["name"] == "ka"


async def test_a_body_with_content_length_is_a_channel_too(app: BrokerApp, clients: Clients) -> None:
    body = b'{"op":"declare_queue","queue":"cl","id":1}\n{"op":"publish","routing_key":"cl","body":"x"}\n'
    stream = await clients.new_stream()
    conn = h11.Connection(h11.CLIENT)
    head = h11.Request(
        method="POST", target="/channel",
        headers=[("Host", "t"), ("Content-Type", "application/x-ndjson"), ("Content-Length", str(len(body)))],
    )
    await stream.send_all(conn.send(head) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
    raw = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Response):
            assert event.status_code == 200
        elif isinstance(event, h11.Data):
            raw += event.data
        elif isinstance(event, h11.EndOfMessage):
            break
    events = [orjson.loads(line) for line in raw.splitlines()]
    assert [e["ev"] for e in events] == ["open", "ok", "ack", "close_ok"]


async def test_streams_count_against_max_channels_like_channels() -> None:
    # Each stream holds a core channel: before, 20 of 20 streams were served with
    # max_channels=5 while POST /channel already got 503.
    async with open_tcp_broker(max_channels=2) as app, Clients(app.port) as c:
        assert (await c.rest("PUT", "/queues/s"))[0] == 201
        first = await c.stream("s")
        second = await c.stream("s")
        assert first.status == 200 and second.status == 200
        status, body = await c.rest("GET", "/queues/s/stream")
        assert status == 503 and body["error"] == "limit_reached"
        status, body = await c.rest(
            "POST", "/channel", b"", headers=[("Content-Type", "application/x-ndjson")]
        )
        assert status == 503 and body["error"] == "limit_reached"
        assert len(app.runtime.sinks) == 2


async def test_an_op_id_nested_too_deep_is_an_error_event_not_a_dead_channel(
    app: BrokerApp, clients: Clients
) -> None:
    # before: echoing a 300-deep id failed to encode and the channel ended silently
    ch = await clients.channel()
    deep = b'{"a":' * 300 + b"1" + b"}" * 300
    await ch.send_raw(b'{"op": "declare_queue", "queue": "deep", "id": ' + deep + b"}\n")
    error = await ch.expect("error")
    assert error["error"] == "invalid_argument" and "id" not in error
    assert "deep" not in app.runtime.core.queues


@pytest.mark.parametrize("length", [256, 300, 70_000])
async def test_an_oversized_routing_key_on_a_channel_gets_an_error_event_naming_the_limit(
    app: BrokerApp, clients: Clients, length: int
) -> None:
    # before: 256 and 300 bytes were acked (REST refused them); 70,000 ended the
    # channel without an error event
    ch = await clients.channel()
    await ch.send({"op": "publish", "routing_key": "k" * length, "body": "x"})
    error = await ch.expect("error")
    assert error["error"] == "invalid_argument" and "255 bytes" in error["message"]
    assert app.runtime.core.stats["published"] == 0
