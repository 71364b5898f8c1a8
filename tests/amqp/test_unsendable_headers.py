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
