"""Routing tables for the four AMQP exchange types, and consistent hashing.

Each table maps a published message (routing key, headers) to the set of destinations
bound to it. A destination is a hashable key chosen by the caller (the broker uses
``("q", name)`` and ``("x", name)``). Tables only answer "who matches"; following
exchange-to-exchange bindings is the broker's job.

Rules (AMQP 0-9-1 §3.1.3 and RabbitMQ's documented semantics):

* direct: the binding key equals the routing key.
* fanout: every binding matches; keys are ignored.
* topic: keys are dot-separated words; ``*`` matches exactly one word, ``#`` matches
  zero or more words. Words may be empty (``a..b`` has three words, the middle one
  empty), and ``""`` has no words (RabbitMQ's rule: ``#`` matches it, ``*`` does not).
* headers: ``x-match`` = ``all`` (default) or ``any``; arguments whose name starts with
  ``x-`` are ignored unless ``x-match`` is ``all-with-x`` / ``any-with-x``. A binding
  argument with value None matches when the header is merely present; other values
  compare as RabbitMQ compares them (numbers whatever their AMQP width, text and bytes
  alike, booleans apart).
* x-consistent-hash (RabbitMQ's plugin): each binding's key is a weight (an integer
  1..100); the routing key (or, with the exchange argument ``hash-header``, that
  header) is hashed onto a ring where each binding holds points in proportion to its
  weight, and the message goes to exactly one destination. The hash is stable across
  restarts and processes, and adding or removing a destination moves only the keys
  that must move.
* x-delayed-message (RabbitMQ's delayed-message plugin): routes by the rules of the
  type its required exchange argument ``x-delayed-type`` names (one of the types
  above); what makes it delayed, the publish's ``x-delay`` header, is publishing's
  business (delayheader.py), not the table's.
"""

from __future__ import annotations

import base64
import hashlib
from bisect import bisect_left
from typing import Any, Iterable

from .errors import InvalidArgument

__all__ = [
    "EXCHANGE_TYPES",
    "RoutingTable",
    "DirectTable",
    "FanoutTable",
    "TopicTable",
    "HeadersTable",
    "ConsistentHashTable",
    "make_table",
    "routing_type",
    "DELAYED_MESSAGE",
    "DELAYED_ROUTING_TYPES",
    "topic_matches",
    "headers_match",
]

# A binding's destination: ("q", queue name) or ("x", exchange name). The tables only
# hash and compare it.
Dest = tuple[str, str]
BindingKey = tuple[Dest, str, Any]

#: The delayed-message exchange's type: it routes as its ``x-delayed-type`` says.
DELAYED_MESSAGE = "x-delayed-message"
#: The types an ``x-delayed-message`` exchange may route as (its ``x-delayed-type``):
#: every type but itself (RabbitMQ's plugin would recurse for ever on its own).
DELAYED_ROUTING_TYPES = ("direct", "fanout", "topic", "headers", "x-consistent-hash")
EXCHANGE_TYPES = (*DELAYED_ROUTING_TYPES, DELAYED_MESSAGE)


class RoutingTable:
    """Bindings of one exchange, and matching of messages against them."""

    def __init__(self) -> None:
        # (destination, routing_key, frozen arguments) -> arguments dict
        self.bindings: dict[BindingKey, dict[str, Any]] = {}

    def add(self, dest: Dest, key: str, arguments: dict[str, Any]) -> bool:
        """Add a binding; return False if the same binding already exists."""
        bkey = (dest, key, _freeze(arguments))
        if bkey in self.bindings:
            return False
        # _added validates (headers x-match) before anything is stored, so a
        # rejected binding leaves no trace.
        self._added(dest, key, arguments)
        self.bindings[bkey] = arguments
        return True

    def remove(self, dest: Dest, key: str, arguments: dict[str, Any]) -> bool:
        """Remove a binding; return False if there was no such binding."""
        bkey = (dest, key, _freeze(arguments))
        if bkey not in self.bindings:
            return False
        del self.bindings[bkey]
        self._removed(dest, key, arguments)
        return True

    def remove_destination(self, dest: Dest) -> int:
        """Remove every binding to ``dest``; return how many were removed."""
        doomed = [bkey for bkey in self.bindings if bkey[0] == dest]
        for bkey in doomed:
            self.remove(bkey[0], bkey[1], self.bindings[bkey])
        return len(doomed)

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Iterable[Dest]:
        raise NotImplementedError

    def _added(self, dest: Dest, key: str, arguments: dict[str, Any]) -> None:
        pass

    def _removed(self, dest: Dest, key: str, arguments: dict[str, Any]) -> None:
        pass


class DirectTable(RoutingTable):
    def __init__(self) -> None:
        super().__init__()
        self._by_key: dict[str, dict[Dest, int]] = {}

    def _added(self, dest: Dest, key: str, arguments: dict[str, Any]) -> None:
        dests = self._by_key.setdefault(key, {})
        dests[dest] = dests.get(dest, 0) + 1

    def _removed(self, dest: Dest, key: str, arguments: dict[str, Any]) -> None:
        dests = self._by_key[key]
        dests[dest] -= 1
        if not dests[dest]:
            del dests[dest]
        if not dests:
            del self._by_key[key]

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Iterable[Dest]:
        return self._by_key.get(routing_key, ())


class FanoutTable(RoutingTable):
    def __init__(self) -> None:
        super().__init__()
        self._dests: dict[Dest, int] = {}

    def _added(self, dest: Dest, key: str, arguments: dict[str, Any]) -> None:
        self._dests[dest] = self._dests.get(dest, 0) + 1

    def _removed(self, dest: Dest, key: str, arguments: dict[str, Any]) -> None:
        self._dests[dest] -= 1
        if not self._dests[dest]:
            del self._dests[dest]

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Iterable[Dest]:
        return self._dests


class _TrieNode:
    __slots__ = ("children", "dests")

    def __init__(self) -> None:
        self.children: dict[str, _TrieNode] = {}
        self.dests: dict[Dest, int] = {}


def topic_words(key: str) -> list[str]:
    """The words of a topic routing key or binding key. The empty key has none (so `*`
    does not match it and `#` does, as in RabbitMQ); `"."` has two empty words."""
    return key.split(".") if key else []


class TopicTable(RoutingTable):
    """Topic bindings in a trie of words, so matching cost follows the key, not the binding count."""

    def __init__(self) -> None:
        super().__init__()
        self._root = _TrieNode()

    def _added(self, dest: Dest, key: str, arguments: dict[str, Any]) -> None:
        node = self._root
        for word in topic_words(key):
            node = node.children.setdefault(word, _TrieNode())
        node.dests[dest] = node.dests.get(dest, 0) + 1

    def _removed(self, dest: Dest, key: str, arguments: dict[str, Any]) -> None:
        path = [self._root]
        words = topic_words(key)
        for word in words:
            path.append(path[-1].children[word])
        leaf = path[-1]
        leaf.dests[dest] -= 1
        if not leaf.dests[dest]:
            del leaf.dests[dest]
        # prune empty branches
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.dests or node.children:
                break
            del path[depth - 1].children[words[depth - 1]]

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Iterable[Dest]:
        found: set[Dest] = set()
        words = topic_words(routing_key)
        n = len(words)
        # Iterative walk; (node, index) pairs already visited are skipped so that
        # patterns with several '#' cannot explode.
        stack = [(self._root, 0)]
        seen: set[tuple[int, int]] = set()
        while stack:
            node, i = stack.pop()
            marker = (id(node), i)
            if marker in seen:
                continue
            seen.add(marker)
            if i == n:
                found.update(node.dests)
            children = node.children
            if not children:
                continue
            hash_node = children.get("#")
            if hash_node is not None:
                # '#' consumes zero or more words
                for j in range(i, n + 1):
                    stack.append((hash_node, j))
            if i < n:
                word_node = children.get(words[i])
                if word_node is not None:
                    stack.append((word_node, i + 1))
                star = children.get("*")
                if star is not None and star is not word_node:
                    stack.append((star, i + 1))
        return found


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Whether a topic binding ``pattern`` matches ``routing_key`` (reference implementation)."""
    pwords = topic_words(pattern)
    kwords = topic_words(routing_key)
    memo: dict[tuple[int, int], bool] = {}

    def go(p: int, k: int) -> bool:
        if (p, k) in memo:
            return memo[(p, k)]
        if p == len(pwords):
            result = k == len(kwords)
        elif pwords[p] == "#":
            result = go(p + 1, k) or (k < len(kwords) and go(p, k + 1))
        elif k == len(kwords):
            result = False
        elif pwords[p] == "*" or pwords[p] == kwords[k]:
            result = go(p + 1, k + 1)
        else:
            result = False
        memo[(p, k)] = result
        return result

    return go(0, 0)


X_MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")


#: Tagged header values (docs/amqp.md: the AMQP types JSON has no form for) that are
#: numbers, and those that are bytes (base64).
_NUMBER_TAGS = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "timestamp", "float"})
_BYTES_TAGS = frozenset({"bytes", "longstr"})


def _comparable(value: Any) -> tuple[str, Any]:
    """A header value as RabbitMQ compares it in a headers binding: by value whatever
    its AMQP width (a long 1 equals an int 1), a text equal to the same bytes, a
    boolean never equal to a number."""
    if value is True or value is False:
        return "bool", value
    if isinstance(value, (int, float)):
        return "number", value
    if isinstance(value, str):
        return "bytes", value.encode("utf-8", "surrogatepass")
    if isinstance(value, dict) and len(value) == 2 and "value" in value:
        tag = value.get("$amqp")
        if tag in _NUMBER_TAGS:
            return "number", value["value"]
        if tag in _BYTES_TAGS:
            try:
                return "bytes", base64.b64decode(str(value["value"]), validate=True)
            except ValueError:
                pass
    return "other", value


def _same_header_value(want: Any, got: Any) -> bool:
    if type(want) is str and type(got) is str:  # (the common case)
        return want == got
    return _comparable(want) == _comparable(got)


def headers_match(arguments: dict[str, Any], headers: dict[str, Any] | None) -> bool:
    """Whether message ``headers`` satisfy a headers-exchange binding's ``arguments``."""
    mode = arguments.get("x-match", "all")
    with_x = mode.endswith("-with-x")
    want_all = mode.startswith("all")
    headers = headers or {}
    any_matched = False
    checked = 0
    for name, value in arguments.items():
        if name == "x-match" or (name.startswith("x-") and not with_x):
            continue
        checked += 1
        if name in headers and (value is None or _same_header_value(value, headers[name])):
            any_matched = True
            if not want_all:
                return True
        elif want_all:
            return False
    if want_all:
        return True
    return any_matched


class HeadersTable(RoutingTable):
    def _added(self, dest: Dest, key: str, arguments: dict[str, Any]) -> None:
        mode = arguments.get("x-match", "all")
        if mode not in X_MATCH_MODES:
            raise InvalidArgument(
                f"x-match must be one of {', '.join(X_MATCH_MODES)}, not {mode!r}"
            )

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Iterable[Dest]:
        return {
            bkey[0] for bkey, args in self.bindings.items() if headers_match(args, headers)
        }


def _ring_hash(text: str) -> int:
    """A stable 64-bit hash (Python's ``hash`` differs from process to process)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class ConsistentHashTable(RoutingTable):
    """Consistent hashing (see the module docstring): one destination per message."""

    #: Ring points per unit of weight: enough that equal weights get shares within a
    #: few per cent of each other.
    POINTS_PER_WEIGHT = 256
    MAX_WEIGHT = 100

    def __init__(self) -> None:
        super().__init__()
        self.hash_header: str | None = None
        self._positions: list[int] = []
        self._owners: list[Dest] = []

    def _added(self, dest: Dest, key: str, arguments: dict[str, Any]) -> None:
        if not key.isdigit() or not 1 <= int(key) <= self.MAX_WEIGHT:
            raise InvalidArgument(
                f"a consistent-hash binding's routing key is its weight: an integer 1..{self.MAX_WEIGHT}, not {key!r}"
            )
        self._rebuild(extra=(dest, key))

    def _removed(self, dest: Dest, key: str, arguments: dict[str, Any]) -> None:
        self._rebuild()

    def _rebuild(self, extra: tuple[Dest, str] | None = None) -> None:
        bindings = [(bkey[0], bkey[1]) for bkey in self.bindings]
        if extra is not None:
            bindings.append(extra)
        points = []
        for (kind, name), key in bindings:
            for i in range(int(key) * self.POINTS_PER_WEIGHT):
                points.append((_ring_hash(f"{kind}:{name}:{key}:{i}"), (kind, name)))
        points.sort()
        self._positions = [p for p, _d in points]
        self._owners = [d for _p, d in points]

    def match(self, routing_key: str, headers: dict[str, Any] | None) -> Iterable[Dest]:
        if not self._positions:
            return ()
        key = routing_key
        if self.hash_header is not None:
            value = (headers or {}).get(self.hash_header)
            key = "" if value is None else str(value)
        i = bisect_left(self._positions, _ring_hash(key))
        return (self._owners[i % len(self._owners)],)


def routing_type(exchange_type: str, arguments: dict[str, Any] | None) -> str:
    """The type whose rules route an exchange's messages: its own, or, for an
    ``x-delayed-message`` exchange, the one its ``x-delayed-type`` argument names
    (required: InvalidArgument, with the plugin's words, when it is missing or names
    no routing type)."""
    if exchange_type != DELAYED_MESSAGE:
        return exchange_type
    delayed = (arguments or {}).get("x-delayed-type")
    if not isinstance(delayed, str) or delayed not in DELAYED_ROUTING_TYPES:
        raise InvalidArgument(
            "Invalid argument, 'x-delayed-type' must be an existing exchange type "
            f"(one of {', '.join(DELAYED_ROUTING_TYPES)}), not {delayed!r}"
        )
    return delayed


def make_table(exchange_type: str, arguments: dict[str, Any] | None = None) -> RoutingTable:
    """A routing table for an exchange of ``exchange_type`` (with ``arguments``: an
    ``x-delayed-message`` exchange's table is its ``x-delayed-type``'s)."""
    exchange_type = routing_type(exchange_type, arguments)
    if exchange_type == "direct":
        return DirectTable()
    if exchange_type == "fanout":
        return FanoutTable()
    if exchange_type == "topic":
        return TopicTable()
    if exchange_type == "headers":
        return HeadersTable()
    if exchange_type == "x-consistent-hash":
        return ConsistentHashTable()
    raise InvalidArgument(
        f"exchange type must be one of {', '.join(EXCHANGE_TYPES)}, not {exchange_type!r}"
    )


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value
