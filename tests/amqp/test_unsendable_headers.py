"""Messages whose headers AMQP cannot carry (stored before publishes were refused
such headers, or from a WAL of an older broker): a field name over 255 bytes, a
tagged value out of its type's range. Each goes out over AMQP (deliver, get-ok)
without the fields that have no AMQP form, the others kept, and the connection and
its other messages go on."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from pamqp import commands

from broker.runtime import CommandGateway
from tests.amqp.rawclient import open_amqp

Basic = commands.Basic

LONG = "k" * 256

#: Headers with one field of no AMQP form each (and a good one, kept).
UNSENDABLE: list[dict[str, Any]] = [
    {LONG: 1, "ok": "kept"},
    {"nested": {LONG: 1, "in": 2}, "ok": "kept"},
    {"list": [{LONG: 1}], "ok": "kept"},
    {"f": {"$amqp": "float", "value": 1e300}, "ok": "kept"},
    {"i": {"$amqp": "int8", "value": 1000}, "ok": "kept"},
    {"t": {"$amqp": "timestamp", "value": -1}, "ok": "kept"},
    {"b": {"$amqp": "bytes", "value": "!!"}, "ok": "kept"},
    {"d": {"$amqp": "decimal", "value": "NaN"}, "ok": "kept"},
    {"d": {"$amqp": "decimal", "value": "1e-300"}, "ok": "kept"},
]


def _stored(app: Any, headers: dict[str, Any]) -> None:
    """A message with ``headers`` straight into the core (as recovery would hold it)."""
    gateway = CommandGateway(app.runtime)
    props = {"headers": headers, "content_type": "text/plain"}
    gateway.run(lambda core: core.publish(core.open_channel(), "", "q", b"m", props))


@pytest.mark.parametrize("headers", UNSENDABLE, ids=range(len(UNSENDABLE)))
async def test_a_stored_message_goes_out_without_the_unsendable_field(app: Any, headers: dict[str, Any]) -> None:
    with trio.fail_after(10):  # (a message that never comes fails, not hangs)
        async with open_amqp(app) as c:
            await c.open_channel(1)
            await c.declare(1, "q")
            _stored(app, headers)
            await c.send(1, Basic.Get(queue="q", no_ack=True))
            method, props, body = await c.message()
            assert isinstance(method, Basic.GetOk) and body == b"m"
            assert props.content_type == "text/plain" and props.headers["ok"] == "kept"
            assert LONG not in str(props.headers)
            await c.send(1, Basic.Consume(queue="q", consumer_tag="w", no_ack=True))
            await c.expect(Basic.ConsumeOk, 1)
            _stored(app, headers)
            _stored(app, {"plain": 1})
            method, props, body = await c.message()
            assert isinstance(method, Basic.Deliver) and props.headers["ok"] == "kept"
            method, props, body = await c.message()
            assert isinstance(method, Basic.Deliver) and props.headers == {"plain": 1}


async def test_headers_past_the_connections_frame_max_are_left_out(app: Any) -> None:
    """A content header frame cannot be split: headers that would make it larger than
    the connection's frame_max (4096 here) go out left out, the rest of the message
    sent; a client on a larger frame_max gets them."""
    big = {"big": "x" * 5000}
    with trio.fail_after(10):  # (a message that never comes fails, not hangs)
        async with open_amqp(app, frame_max=4096) as c, open_amqp(app, remote=("127.0.0.1", 40001)) as wide:
            await c.open_channel(1)
            await c.declare(1, "q")
            for _ in range(2):
                _stored(app, big)
            await c.send(1, Basic.Get(queue="q", no_ack=True))
            method, props, body = await c.message()
            assert isinstance(method, Basic.GetOk) and body == b"m"
            assert props.content_type == "text/plain" and props.headers is None
            await wide.open_channel(1)
            await wide.send(1, Basic.Get(queue="q", no_ack=True))
            _method, props, _body = await wide.message()
            assert props.headers == big


async def test_a_stored_string_property_over_255_bytes_is_cut_on_a_character(app: Any) -> None:
    gateway = CommandGateway(app.runtime)
    with trio.fail_after(10):  # (a message that never comes fails, not hangs)
        async with open_amqp(app) as c:
            await c.open_channel(1)
            await c.declare(1, "q")
            props = {"app_id": "ab" + "é" * 200}  # 402 bytes: the 255th byte is inside an é
            gateway.run(lambda core: core.publish(core.open_channel(), "", "q", b"m", props))
            await c.send(1, Basic.Get(queue="q", no_ack=True))
            _method, got, _body = await c.message()
            assert got.app_id == "ab" + "é" * 126  # 254 bytes, valid UTF-8
