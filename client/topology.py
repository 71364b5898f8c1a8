"""What a channel declared, so a new session can declare it again after a reconnect.

Rules: declarations (exchanges, queues, bindings) are remembered in the order they were
first made, keyed by what they name, so declaring the same thing twice is replayed
once (with the latest arguments). Deleting an exchange or queue forgets it and every
binding that mentions it; unbinding forgets that binding. Passive declarations check
and create nothing, so they are not remembered; nor is a declaration of direct
reply-to's pseudo-queue or of a reply address (``amq.rabbitmq.reply-to...``), which
is the requester's check, passive or not (an address ends with its session). The ops are replayed verbatim (minus
their ``id``), in order: exchanges and queues come before the bindings that use them
because they were declared before those bindings could succeed.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["Topology", "describe_op"]

#: Direct reply-to's pseudo-queue: a declaration of a name beginning so is a check.
REPLY_TO = "amq.rabbitmq.reply-to"

Key = tuple[Any, ...]


def _binding_key(op: dict[str, Any]) -> Key:
    if op.get("to_exchange") is not None:
        dest = ("exchange", op["to_exchange"])
    else:
        dest = ("queue", op.get("queue", ""))
    arguments = orjson.dumps(op.get("arguments") or {}, option=orjson.OPT_SORT_KEYS)
    return ("bind", op.get("exchange", ""), dest, op.get("routing_key", ""), arguments)


def describe_op(op: dict[str, Any]) -> str:
    """A short human description of a declaration op, for error messages."""
    kind = op.get("op")
    if kind == "declare_exchange":
        return f"exchange {op.get('exchange')!r}"
    if kind == "declare_queue":
        return f"queue {op.get('queue')!r}"
    if kind in ("bind", "unbind"):
        dest = op.get("to_exchange") or op.get("queue")
        return f"binding {op.get('exchange')!r} -> {dest!r} ({op.get('routing_key', '')!r})"
    return str(kind)


class Topology:
    """The ordered set of declarations to replay."""

    def __init__(self) -> None:
        self._ops: dict[Key, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._ops)

    def ops(self) -> list[dict[str, Any]]:
        """The declarations to replay, in order."""
        return list(self._ops.values())

    def record(self, op: dict[str, Any]) -> None:
        """Remember a successful ``declare_exchange``, ``declare_queue`` or ``bind``
        (and forget what a successful delete or ``unbind`` removed)."""
        op = {k: v for k, v in op.items() if k != "id"}
        kind = op.get("op")
        if op.get("passive") or (kind == "declare_queue" and str(op.get("queue", "")).startswith(REPLY_TO)):
            return
        if kind == "declare_exchange":
            self._ops[("exchange", op["exchange"])] = op
        elif kind == "declare_queue":
            self._ops[("queue", op["queue"])] = op
        elif kind == "bind":
            self._ops[_binding_key(op)] = op
        elif kind == "unbind":
            self._ops.pop(_binding_key(op), None)
        elif kind == "delete_exchange":
            self._forget(lambda key: key[:2] == ("exchange", op["exchange"])
                         or (key[0] == "bind" and (key[1] == op["exchange"]
                                                   or key[2] == ("exchange", op["exchange"]))))
        elif kind == "delete_queue":
            self._forget(lambda key: key[:2] == ("queue", op["queue"])
                         or (key[0] == "bind" and key[2] == ("queue", op["queue"])))

    def _forget(self, predicate: Any) -> None:
        for key in [k for k in self._ops if predicate(k)]:
            del self._ops[key]
