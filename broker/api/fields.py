"""Typed fields of a JSON object, and the decoders REST and channels share.

A channel op and its REST twin (``declare_queue`` and ``PUT /queues/{name}``,
``bind`` and ``POST /bindings``, ...) decode their fields here, with one
:class:`Fields` and one field list each, so both accept and refuse exactly the same
inputs with the same error (``invalid_argument``). Unknown fields are refused
everywhere: a typo (``routng_key``) must not silently mean something else.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from typing import Any

from broker.core import InvalidArgument

__all__ = [
    "BINDING_FIELDS",
    "DEFAULT_EXCHANGE_ALIAS",
    "EXCHANGE_DECLARE_FIELDS",
    "LOCK_ACQUIRE_FIELDS",
    "LOCK_REFRESH_FIELDS",
    "LOCK_RELEASE_FIELDS",
    "QUEUE_DECLARE_FIELDS",
    "Binding",
    "ExchangeDeclare",
    "Fields",
    "QueueDeclare",
    "decode_binding",
    "decode_exchange_declare",
    "decode_queue_declare",
    "deadline_ms",
    "exchange_name",
    "unknown_fields",
]

DEFAULT_EXCHANGE_ALIAS = "amq.default"


def exchange_name(name: str) -> str:
    """``amq.default`` names the default exchange ("") in paths and bodies."""
    return "" if name == DEFAULT_EXCHANGE_ALIAS else name


# Fields has methods named str, bool, dict and list, which hide the builtins inside its
# body: its annotations use these aliases.
_Text = str
_Bool = bool
_Dict = dict
_List = list


class Fields:
    """Typed access to a JSON request object; unknown fields are an error (catches typos)."""

    def __init__(self, obj: Any, allowed: Set[_Text], what: _Text = "request body") -> None:
        if not isinstance(obj, dict):
            raise InvalidArgument(f"{what} must be a JSON object")
        for key in obj:
            if key not in allowed:
                raise unknown_fields(obj, allowed, what)
        self.obj: _Dict[_Text, Any] = obj

    def str(self, name: _Text, default: _Text | None = None) -> _Text:
        value = self.obj.get(name, default)
        if value is None:
            raise InvalidArgument(f"field {name} is required")
        if not isinstance(value, str):
            raise InvalidArgument(f"field {name} must be a string")
        return value

    def opt_str(self, name: _Text) -> _Text | None:
        value = self.obj.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"field {name} must be a string")
        return value

    def bool(self, name: _Text, default: _Bool) -> _Bool:
        value = self.obj.get(name, default)
        if not isinstance(value, bool):
            raise InvalidArgument(f"field {name} must be true or false")
        return value

    def dict(self, name: _Text) -> _Dict[_Text, Any]:
        value = self.obj.get(name, {})
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise InvalidArgument(f"field {name} must be an object")
        return value

    def number(self, name: _Text, default: float | None, *, minimum: float = 0) -> float | None:
        value = self.obj.get(name)
        if value is None:  # absent or null: the default
            value = default
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
            raise InvalidArgument(f"field {name} must be a number >= {minimum:g}")
        return float(value)

    def list(self, name: _Text) -> _List[Any]:
        value = self.obj.get(name)
        if not isinstance(value, list) or not value:
            raise InvalidArgument(f"field {name} must be a non-empty list")
        return value


#: The longest publish deadline a client may give (one hour).
MAX_DEADLINE_MS = 3_600_000


def deadline_ms(value: object, what: str) -> int:
    """A publisher's deadline (``X-Deadline-Ms`` over REST, ``deadline_ms`` on a
    channel publish): whole milliseconds, 0..``MAX_DEADLINE_MS``, or InvalidArgument
    naming ``what``. A publish that would wait past it (publishing blocked) is refused
    with the reason ``deadline``."""
    if isinstance(value, str):
        try:
            value = int(value.strip(), 10)
        except ValueError:
            raise InvalidArgument(f"{what} must be a whole number of milliseconds") from None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DEADLINE_MS:
        raise InvalidArgument(f"{what} must be a whole number of milliseconds, 0..{MAX_DEADLINE_MS}")
    return value


def unknown_fields(obj: dict[str, Any], allowed: Set[str], what: str) -> InvalidArgument:
    """The error for the fields of ``obj`` outside ``allowed``."""
    unknown = sorted(k for k in obj if k not in allowed)
    return InvalidArgument(f"unknown field(s) in {what}: {', '.join(unknown)}")


#: The fields of an exchange declare (``PUT /exchanges/{name}``, ``declare_exchange``).
EXCHANGE_DECLARE_FIELDS = frozenset({"type", "durable", "auto_delete", "internal", "arguments", "passive"})
#: The fields of a queue declare (``PUT /queues/{name}``, ``declare_queue``).
QUEUE_DECLARE_FIELDS = frozenset({"durable", "exclusive", "auto_delete", "arguments", "passive"})
#: The fields of a binding (``POST``/``DELETE /bindings``, ``bind``/``unbind``).
BINDING_FIELDS = frozenset({"exchange", "queue", "to_exchange", "routing_key", "arguments"})
#: The fields of the lock calls besides the lock's name (the core checks their values).
LOCK_ACQUIRE_FIELDS = frozenset({"owner", "ttl_s", "wait_s"})
LOCK_REFRESH_FIELDS = frozenset({"owner", "token", "ttl_s"})
LOCK_RELEASE_FIELDS = frozenset({"owner", "token"})


@dataclass(frozen=True)
class ExchangeDeclare:
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]
    passive: bool


def decode_exchange_declare(f: Fields) -> ExchangeDeclare:
    """An exchange declare's settings (the type is the core's to check)."""
    return ExchangeDeclare(
        type=f.str("type", "direct"),
        durable=f.bool("durable", True),
        auto_delete=f.bool("auto_delete", False),
        internal=f.bool("internal", False),
        arguments=f.dict("arguments"),
        passive=f.bool("passive", False),
    )


@dataclass(frozen=True)
class QueueDeclare:
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict[str, Any]
    passive: bool


def decode_queue_declare(f: Fields) -> QueueDeclare:
    return QueueDeclare(
        durable=f.bool("durable", True),
        exclusive=f.bool("exclusive", False),
        auto_delete=f.bool("auto_delete", False),
        arguments=f.dict("arguments"),
        passive=f.bool("passive", False),
    )


@dataclass(frozen=True)
class Binding:
    """A binding from exchange ``source`` to queue (or, ``to_exchange``, exchange)
    ``destination`` (exchanges by their core names: ``""`` is the default)."""

    source: str
    destination: str
    routing_key: str
    arguments: dict[str, Any]
    to_exchange: bool


def decode_binding(f: Fields) -> Binding:
    """A binding's fields: ``exchange`` (required), exactly one of ``queue`` and
    ``to_exchange``, ``routing_key``, ``arguments``."""
    source = exchange_name(f.str("exchange"))
    queue = f.opt_str("queue")
    to_exchange = f.opt_str("to_exchange")
    if (queue is None) == (to_exchange is None):
        raise InvalidArgument("give exactly one of queue and to_exchange")
    dest = queue if queue is not None else exchange_name(to_exchange or "")
    return Binding(source, dest, f.str("routing_key", ""), f.dict("arguments"), to_exchange is not None)
