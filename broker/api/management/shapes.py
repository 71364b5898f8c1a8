"""ackbus's objects in RabbitMQ 3.10's JSON shapes (pure functions of views' dicts).

What maps to what (docs/management-api.md has the table): a queue's ``messages``,
``messages_ready`` and ``messages_unacknowledged`` are ackbus's counts; its
``message_stats`` are its counters (``publish``: messages enqueued, ``deliver_get``:
deliveries and gets, ``ack``, ``redeliver``) with ``_details.rate`` where ackbus
keeps a history of the number (``rates.py``). Fields ackbus cannot know (Erlang
memory, reductions, garbage collection, message bytes) are left out; a few that
tools read and that have a true neutral value here are given it (``policy``: ackbus
has no policies, so ``null``; ``state``: ``running``).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any
from urllib.parse import quote_plus

import orjson

__all__ = [
    "binding_json",
    "default_bindings",
    "exchange_json",
    "properties_key",
    "queue_json",
    "rate",
]



def rate(value: float) -> dict[str, float]:
    """A ``_details`` object: ``{"rate": per second}``."""
    return {"rate": round(value, 1)}


def message_counts(counts: dict[str, Any], rates: dict[str, float]) -> dict[str, Any]:
    """RabbitMQ's ``messages``, ``messages_ready`` and ``messages_unacknowledged``,
    each with its ``_details`` rate, from ackbus's counts (a queue's, or the totals)."""
    return {
        "messages": counts["messages"],
        "messages_details": rate(rates.get("messages", 0.0)),
        "messages_ready": counts["messages_ready"],
        "messages_ready_details": rate(rates.get("messages_ready", 0.0)),
        "messages_unacknowledged": counts["messages_unacked"],
        "messages_unacknowledged_details": rate(rates.get("messages_unacked", 0.0)),
    }


def queue_json(info: dict[str, Any], vhost: str, node: str, rates: dict[str, float]) -> dict[str, Any]:
    """A queue as ``/api/queues`` lists it, from ``BrokerViews.queue_info`` and the
    rates of its numbers (``rates.queue_rates``)."""
    stats = info["message_stats"]
    arguments = info["arguments"]
    out: dict[str, Any] = {
        "name": info["name"],
        "vhost": vhost,
        "node": node,
        "durable": info["durable"],
        "auto_delete": info["auto_delete"],
        "exclusive": info["exclusive"],
        "arguments": arguments,
        "type": str(arguments.get("x-queue-type", "classic")),
        "state": "running",
        "policy": None,
        "operator_policy": None,
        "effective_policy_definition": {},
        "consumers": info["consumers"],
        **message_counts(info, rates),
        "messages_paged_out": info.get("messages_paged_out", 0),
    }
    if stats["published"] or stats["delivered"]:
        # (RabbitMQ shows no message_stats before a queue's first message)
        out["message_stats"] = {
            "publish": stats["published"],
            "publish_details": rate(rates.get("published", 0.0)),
            "deliver_get": stats["delivered"],
            "ack": stats["acked"],
            "redeliver": stats["redelivered"],
        }
    return out


def exchange_json(info: dict[str, Any], vhost: str) -> dict[str, Any]:
    """An exchange as ``/api/exchanges`` lists it, from ``BrokerViews.exchange_info(s)``
    (the default exchange's name is ``""``, as RabbitMQ lists it)."""
    stats = info.get("message_stats") or {}
    out: dict[str, Any] = {
        "name": info["name"],
        "vhost": vhost,
        "type": info["type"],
        "durable": info["durable"],
        "auto_delete": info["auto_delete"],
        "internal": info["internal"],
        "arguments": info["arguments"],
    }
    if stats.get("messages_in") or stats.get("messages_out"):
        # (RabbitMQ shows no message_stats before an exchange's first message)
        out["message_stats"] = {"publish_in": stats.get("messages_in", 0), "publish_out": stats.get("messages_out", 0)}
    return out


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """The name of a binding in ``/api/bindings/.../{props}`` paths, as RabbitMQ makes
    it for a binding without arguments: the routing key ``quote_plus``-ed, ``~`` as
    ``%7E``, and ``~`` alone for the empty key. With arguments RabbitMQ appends ``~``
    and a hash of its Erlang term, which ackbus cannot reproduce: it appends ``~`` and
    a hash of the arguments' JSON (stable, so a key read from a listing names the same
    binding in a ``DELETE``)."""
    quoted = _quote(routing_key)
    if not arguments:
        return quoted or "~"
    digest = hashlib.sha256(orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)).digest()[:4]
    return quoted + "~" + _quote(base64.urlsafe_b64encode(digest).decode("ascii").rstrip("="))


def _quote(text: str) -> str:
    return quote_plus(text, safe="").replace("~", "%7E")


def binding_json(binding: dict[str, Any], vhost: str) -> dict[str, Any]:
    """A binding from ``BrokerViews.bindings`` in RabbitMQ's shape."""
    to_queue = "queue" in binding
    arguments = binding["arguments"] or {}
    return {
        "source": binding["exchange"],
        "vhost": vhost,
        "destination": binding["queue"] if to_queue else binding["to_exchange"],
        "destination_type": "queue" if to_queue else "exchange",
        "routing_key": binding["routing_key"],
        "arguments": arguments,
        "properties_key": properties_key(binding["routing_key"], arguments),
    }


def default_bindings(queue_names: list[str], vhost: str) -> list[dict[str, Any]]:
    """The default exchange's implicit binding of each queue (its name as the routing
    key), which RabbitMQ lists first among a queue's bindings."""
    return [
        {
            "source": "",
            "vhost": vhost,
            "destination": name,
            "destination_type": "queue",
            "routing_key": name,
            "arguments": {},
            "properties_key": properties_key(name, {}),
        }
        for name in queue_names
    ]
