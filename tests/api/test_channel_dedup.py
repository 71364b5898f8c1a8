"""The publish op's ``dedup`` flag (docs/protocol.md): absent or true, a publish whose
``message_id`` its exchange saw within the window is confirmed but not enqueued;
false, every copy is enqueued (the way a cluster node forwards an AMQP publish); any
other value is refused like any other bad field."""

from __future__ import annotations

from typing import Any

import pytest

from broker.app import BrokerApp
from tests.support.channel import Clients

# with headers, a publish takes the reader's general path; without, the typed one
PATHS = {
    "typed": {"message_id": "order-7"},
    "general": {"message_id": "order-7", "headers": {"h": 1}},
}


async def _publish_twice(clients: Clients, properties: dict[str, Any], **flag: Any) -> list[dict[str, Any]]:
    """Publish the same message id twice to queue "q"; the messages delivered."""
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "q"})
    await ch.send(*[
        {"op": "publish", "routing_key": "q", "body": body, "properties": properties, **flag}
        for body in ("first", "second")
    ])
    events = await ch.sync()
    assert [e["ev"] for e in events] == ["ack"] * len([e for e in events if e["ev"] == "ack"]), events
    await ch.ok({"op": "consume", "queue": "q", "no_ack": True})
    return [e["message"] for e in await ch.sync() if e["ev"] == "deliver"]


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_dedup_false_enqueues_every_copy_with_its_id(app: BrokerApp, clients: Clients, path: str) -> None:
    messages = await _publish_twice(clients, PATHS[path], dedup=False)
    assert [m["body"] for m in messages] == ["first", "second"]
    assert [m["properties"] for m in messages] == [PATHS[path]] * 2
    assert app.runtime.core.stats["deduplicated"] == 0


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("flag", [{}, {"dedup": True}], ids=["absent", "true"])
async def test_the_default_deduplicates(app: BrokerApp, clients: Clients, path: str, flag: dict[str, Any]) -> None:
    messages = await _publish_twice(clients, PATHS[path], **flag)
    assert [m["body"] for m in messages] == ["first"]
    assert app.runtime.core.stats["deduplicated"] == 1


@pytest.mark.parametrize("value", ["no", 0, None, [False]])
async def test_a_dedup_that_is_not_a_boolean_is_refused(app: BrokerApp, clients: Clients, value: Any) -> None:
    ch = await clients.channel()
    await ch.ok({"op": "declare_queue", "queue": "q"})
    await ch.send({"op": "publish", "routing_key": "q", "body": "x", "dedup": value, "id": "p"})
    error = await ch.expect("error", id="p", error="invalid_argument")
    assert error["message"] == "dedup must be true or false"
    assert app.runtime.core.queues["q"].ready_count() == 0
