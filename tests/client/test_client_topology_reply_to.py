"""The client's replayed declarations leave out direct reply-to's check: a
``declare_queue`` of ``amq.rabbitmq.reply-to`` or of a reply address creates nothing
(the broker answers it as a check, passive or not: docs/protocol.md), and a reply
address ends with its session, so replaying it after a reconnect would fail."""

from __future__ import annotations

from client.topology import Topology


def test_reply_to_declarations_are_not_replayed() -> None:
    topology = Topology()
    topology.record({"op": "declare_queue", "queue": "amq.rabbitmq.reply-to", "id": 1})
    topology.record({"op": "declare_queue", "queue": "amq.rabbitmq.reply-to.R6a.3", "passive": False, "id": 2})
    topology.record({"op": "declare_queue", "queue": "jobs", "id": 3})
    topology.record({"op": "bind", "exchange": "amq.direct", "queue": "jobs", "routing_key": "k", "id": 4})
    assert topology.ops() == [
        {"op": "declare_queue", "queue": "jobs"},
        {"op": "bind", "exchange": "amq.direct", "queue": "jobs", "routing_key": "k"},
    ]
