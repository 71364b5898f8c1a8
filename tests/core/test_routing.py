"""Routing: every exchange type, the default exchange, exchange-to-exchange bindings."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core import (
    BUILTIN_EXCHANGES,
    AccessRefused,
    InvalidArgument,
    NotFound,
    headers_match,
    topic_matches,
)
from broker.core.routing import DirectTable, FanoutTable, HeadersTable, TopicTable

from .helpers import Harness


def oracle_topic(pattern: str, key: str) -> bool:
    """Independent (exponential, obviously correct) topic matcher for cross-checks."""

    def go(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        head, rest = p[0], p[1:]
        if head == "#":
            return any(go(rest, k[i:]) for i in range(len(k) + 1))
        if not k:
            return False
        return (head == "*" or head == k[0]) and go(rest, k[1:])

    return go(pattern.split(".") if pattern else [], key.split(".") if key else [])


TOPIC_CASES = [
    # pattern, key, matches
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#", "..", True),
    ("a.#", "a", True),
    ("a.#", "a.b", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "a.x", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y", False),
    ("a.#.b", "b.a.b", False),
    ("#.#", "", True),
    ("#.#", "a", True),
    ("#.#", "a.b.c", True),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a.*.#", "a.b.c.d", True),
    ("a.*.#", "b.b", False),
    ("*", "a", True),
    ("*", "", False),  # "" has no words (RabbitMQ's rule)
    ("*", "a.b", False),
    ("*", ".", False),  # two empty words
    ("*.*", "a.b", True),
    ("*.*", "a", False),
    ("*.*", ".", True),
    ("*.*", "a.b.c", False),
    ("a..b", "a..b", True),
    ("a.*.b", "a..b", True),
    ("a.b", "a..b", False),
    ("a.#", "a.", True),
    ("a.*", "a.", True),
    ("a", "a.", False),
    ("", "", True),
    ("", "a", False),
    ("a", "", False),
    ("#.*", "", False),
    ("#.*", "a.b", True),
    ("*.#", "", False),
    (".", "", False),
    (".", ".", True),
    ("#.", "", False),
    ("#.", "a.", True),
    ("*.#.*", "a", False),
    ("*.#.*", "a.b", True),
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "a.b", False),
    ("a.b", "a.b.c", False),
    ("#.b.#", "a.b.c", True),
    ("#.b.#", "a.c", False),
    ("#.#.#.a", "a", True),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), TOPIC_CASES)
def test_topic_reference_and_table(pattern: str, key: str, expected: bool) -> None:
    assert oracle_topic(pattern, key) is expected  # the case table itself is right
    assert topic_matches(pattern, key) is expected
    table = TopicTable()
    table.add(("q", "dest"), pattern, {})
    table.add(("q", "other"), "zzz.never", {})
    assert (("q", "dest") in set(table.match(key, None))) is expected


WORDS = st.sampled_from(["a", "b", "", "*", "#"])
KEY_WORDS = st.sampled_from(["a", "b", ""])
patterns = st.lists(WORDS, min_size=1, max_size=5).map(".".join)
keys = st.lists(KEY_WORDS, min_size=1, max_size=6).map(".".join)


@settings(max_examples=300, deadline=None)
@given(pattern=patterns, key=keys)
def test_topic_matches_agrees_with_oracle(pattern: str, key: str) -> None:
    assert topic_matches(pattern, key) == oracle_topic(pattern, key)


@settings(max_examples=150, deadline=None)
@given(
    bound=st.lists(patterns, min_size=1, max_size=12, unique=True),
    removed=st.sets(st.integers(0, 11)),
    probe=st.lists(keys, min_size=1, max_size=8),
)
def test_topic_table_matches_reference(bound: list[str], removed: set[int], probe: list[str]) -> None:
    table = TopicTable()
    for i, p in enumerate(bound):
        assert table.add(("q", f"q{i}"), p, {})
        # the same pattern bound to a second destination shares trie nodes
        assert table.add(("q", f"shared{i % 2}"), p, {})
    live = dict(enumerate(bound))
    for i in sorted(removed):
        if i in live:
            assert table.remove(("q", f"q{i}"), live.pop(i), {})
    for key in probe:
        got = set(table.match(key, None))
        want = {("q", f"q{i}") for i, p in live.items() if topic_matches(p, key)}
        want |= {("q", f"shared{i % 2}") for i, p in enumerate(bound) if topic_matches(p, key)}
        assert got == want, (key, got, want)


def test_topic_table_prunes_removed_branches() -> None:
    table = TopicTable()
    table.add(("q", "a"), "x.y.#", {})
    table.add(("q", "b"), "x.y", {})
    assert table.remove(("q", "a"), "x.y.#", {})
    assert "#" not in table._root.children["x"].children["y"].children
    assert table.remove(("q", "b"), "x.y", {})
    assert table._root.children == {}
    assert not table.remove(("q", "b"), "x.y", {})
    assert set(table.match("x.y", None)) == set()


def test_many_hashes_do_not_explode() -> None:
    table = TopicTable()
    table.add(("q", "a"), ".".join(["#"] * 20) + ".z", {})
    key = ".".join(["w"] * 60)
    assert set(table.match(key, None)) == set()
    assert set(table.match(key + ".z", None)) == {("q", "a")}


# ------------------------------------------------------------------ headers


HEADERS_CASES: list[tuple[dict[str, Any], dict[str, Any] | None, bool]] = [
    ({"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, True),
    ({"a": 1, "b": 2}, {"a": 1}, False),
    ({"a": 1, "b": 2}, {"a": 1, "b": 3}, False),
    ({"x-match": "all", "a": 1}, {"a": 1}, True),
    ({"x-match": "any", "a": 1, "b": 2}, {"b": 2}, True),
    ({"x-match": "any", "a": 1, "b": 2}, {"a": 2, "b": 1}, False),
    ({"x-match": "any", "a": 1}, None, False),
    ({"x-match": "all", "a": 1}, None, False),
    ({"x-match": "all"}, None, True),  # no conditions: all of nothing holds
    ({"x-match": "any"}, {"a": 1}, False),  # no conditions: none matched
    # None = presence
    ({"a": None}, {"a": "anything"}, True),
    ({"a": None}, {"a": None}, True),
    ({"a": None}, {"b": 1}, False),
    ({"x-match": "any", "a": None, "b": 5}, {"a": 0}, True),
    # x- arguments are ignored unless -with-x
    ({"x-foo": 1, "a": 1}, {"a": 1}, True),
    ({"x-match": "all", "x-foo": 1}, {}, True),
    ({"x-match": "any", "x-foo": 1}, {"x-foo": 1}, False),
    ({"x-match": "all-with-x", "x-foo": 1, "a": 1}, {"a": 1}, False),
    ({"x-match": "all-with-x", "x-foo": 1, "a": 1}, {"a": 1, "x-foo": 1}, True),
    ({"x-match": "any-with-x", "x-foo": 1}, {"x-foo": 1}, True),
    ({"x-match": "any-with-x", "x-foo": 1}, {"x-foo": 2}, False),
    ({"x-match": "any-with-x", "x-foo": None, "a": 9}, {"x-foo": 2}, True),
    # values compare as values
    ({"a": "1"}, {"a": 1}, False),
    ({"a": [1, 2]}, {"a": [1, 2]}, True),
    # ... as RabbitMQ compares them: whatever the AMQP width of a number, text and bytes
    # alike, a boolean never a number
    ({"a": 1}, {"a": {"$amqp": "int64", "value": 1}}, True),
    ({"a": 1}, {"a": {"$amqp": "uint8", "value": 1}}, True),
    ({"a": 1}, {"a": True}, False),
    ({"a": True}, {"a": 1}, False),
    ({"a": True}, {"a": True}, True),
    ({"a": "1"}, {"a": {"$amqp": "bytes", "value": "MQ=="}}, True),
    ({"a": "1"}, {"a": {"$amqp": "bytes", "value": "Mg=="}}, False),
    ({"a": 1}, {"a": {"$amqp": "decimal", "value": "1"}}, False),
    ({"a": {"b": 1}}, {"a": {"b": 1}}, True),
]


@pytest.mark.parametrize(("args", "headers", "expected"), HEADERS_CASES)
def test_headers_match(args: dict[str, Any], headers: dict[str, Any] | None, expected: bool) -> None:
    assert headers_match(args, headers) is expected
    table = HeadersTable()
    table.add(("q", "d"), "", args)
    assert (("q", "d") in set(table.match("ignored", headers))) is expected


@pytest.mark.parametrize("mode", ["ALL", "some", "", 1, None, "all-with-y"])
def test_headers_invalid_x_match_rejected_and_not_stored(mode: Any) -> None:
    h = Harness()
    h.queue("q")
    with pytest.raises(InvalidArgument):
        h.b.bind("amq.headers", "q", "", {"x-match": mode, "a": 1})
    assert h.b.exchanges["amq.headers"].table.bindings == {}
    assert "amq.headers" not in h.b.queues["q"].bound_from
    # publishing afterwards still works and routes nowhere
    ch = h.channel()
    tag, routed = h.b.publish(ch, "amq.headers", "", b"m", {"headers": {"a": 1}})
    assert routed == 0
    h.sync()
    assert h.acked(ch, tag)


def test_headers_exchange_in_broker() -> None:
    h = Harness()
    for q in ("all", "any", "presence"):
        h.queue(q)
    h.b.bind("amq.match", "all", "", {"x-match": "all", "k": "v", "n": 1})
    h.b.bind("amq.match", "any", "", {"x-match": "any", "k": "v", "n": 1})
    h.b.bind("amq.match", "presence", "", {"p": None})
    ch = h.channel()

    def routed(headers: dict[str, Any] | None) -> set[str]:
        ex = h.b.exchanges["amq.match"]
        return {q.name for q in h.b.route(ex, "rk", headers)}

    assert routed({"k": "v", "n": 1}) == {"all", "any"}
    assert routed({"k": "v"}) == {"any"}
    assert routed({"p": 0}) == {"presence"}
    assert routed(None) == set()
    h.b.publish(ch, "amq.match", "", b"1", {"headers": {"k": "v", "n": 1, "p": 1}})
    h.sync()
    assert [h.info(q)["messages_ready"] for q in ("all", "any", "presence")] == [1, 1, 1]


# ------------------------------------------------------------ direct and fanout


def test_direct_table_counts_and_match() -> None:
    t = DirectTable()
    assert t.add(("q", "a"), "k", {})
    assert not t.add(("q", "a"), "k", {})  # duplicate binding
    assert t.add(("q", "a"), "k", {"arg": 1})  # other arguments: another binding
    assert t.add(("q", "b"), "k", {})
    assert set(t.match("k", None)) == {("q", "a"), ("q", "b")}
    assert set(t.match("K", None)) == set()
    assert t.remove(("q", "a"), "k", {})
    assert set(t.match("k", None)) == {("q", "a"), ("q", "b")}  # still bound with args
    assert t.remove(("q", "a"), "k", {"arg": 1})
    assert set(t.match("k", None)) == {("q", "b")}
    assert t.remove_destination(("q", "b")) == 1
    assert set(t.match("k", None)) == set()
    assert t._by_key == {}


def test_fanout_table_ignores_keys() -> None:
    t = FanoutTable()
    t.add(("q", "a"), "x", {})
    t.add(("q", "a"), "y", {})
    t.add(("q", "b"), "", {})
    assert set(t.match("whatever", None)) == {("q", "a"), ("q", "b")}
    t.remove(("q", "a"), "x", {})
    assert set(t.match("", None)) == {("q", "a"), ("q", "b")}
    t.remove(("q", "a"), "y", {})
    assert set(t.match("", None)) == {("q", "b")}


def test_direct_and_fanout_through_broker() -> None:
    h = Harness()
    for q in ("q1", "q2", "q3"):
        h.queue(q)
    h.b.declare_exchange("d", "direct")
    h.b.declare_exchange("f", "fanout")
    h.b.bind("d", "q1", "red")
    h.b.bind("d", "q2", "red")
    h.b.bind("d", "q3", "blue")
    h.b.bind("f", "q1", "ignored")
    h.b.bind("f", "q3")
    ch = h.channel()
    assert h.b.publish(ch, "d", "red", b"r")[1] == 2
    assert h.b.publish(ch, "d", "blue", b"b")[1] == 1
    assert h.b.publish(ch, "d", "green", b"g")[1] == 0
    assert h.b.publish(ch, "f", "anything", b"f")[1] == 2
    h.sync()
    assert h.ready_bodies("q1") == [b"r", b"f"]
    assert h.ready_bodies("q2") == [b"r"]
    assert h.ready_bodies("q3") == [b"b", b"f"]


def test_topic_exchange_through_broker() -> None:
    h = Harness()
    h.queue("all")
    h.queue("stocks")
    h.b.bind("amq.topic", "all", "#")
    h.b.bind("amq.topic", "stocks", "stock.*.nyse")
    h.b.bind("amq.topic", "stocks", "stock.#")  # two matching bindings: still one copy
    ch = h.channel()
    assert h.b.publish(ch, "amq.topic", "stock.ibm.nyse", b"1")[1] == 2
    assert h.b.publish(ch, "amq.topic", "fx.eur", b"2")[1] == 1
    h.sync()
    assert h.ready_bodies("stocks") == [b"1"]
    assert h.ready_bodies("all") == [b"1", b"2"]


# ------------------------------------------------------------ default exchange


def test_builtin_exchanges_exist() -> None:
    h = Harness()
    assert set(BUILTIN_EXCHANGES) == {"", "amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"}
    for name, etype in BUILTIN_EXCHANGES.items():
        ex, created = h.b.declare_exchange(name, etype, passive=True)
        assert not created and ex.type == etype and ex.durable
    # equal redeclare of a built-in is fine
    assert h.b.declare_exchange("amq.topic", "topic")[1] is False


def test_default_exchange_routes_by_queue_name() -> None:
    h = Harness()
    h.queue("orders")
    h.queue("other")
    ch = h.channel()
    assert h.b.publish(ch, "", "orders", b"o")[1] == 1
    assert h.b.publish(ch, "", "nope", b"n")[1] == 0
    h.sync()
    assert h.ready_bodies("orders") == [b"o"]
    assert h.ready_bodies("other") == []


def test_default_exchange_cannot_be_bound_unbound_deleted() -> None:
    h = Harness()
    h.queue("q")
    with pytest.raises(AccessRefused):
        h.b.bind("", "q", "q")
    with pytest.raises(AccessRefused):
        h.b.unbind("", "q", "q")
    with pytest.raises(AccessRefused):
        h.b.delete_exchange("")
    with pytest.raises(AccessRefused):
        h.b.declare_exchange("", "fanout")
    h.b.declare_exchange("x", "fanout")
    with pytest.raises(AccessRefused):
        h.b.bind("x", "", to_exchange=True)
    for name in ("amq.direct", "amq.fanout", "amq.topic", "amq.headers", "amq.match"):
        with pytest.raises(AccessRefused):
            h.b.delete_exchange(name)
    assert set(BUILTIN_EXCHANGES) <= set(h.b.exchanges)


def test_bind_unknown_entities() -> None:
    h = Harness()
    h.queue("q")
    with pytest.raises(NotFound):
        h.b.bind("nope", "q")
    with pytest.raises(NotFound):
        h.b.bind("amq.direct", "nope")
    with pytest.raises(NotFound):
        h.b.bind("amq.direct", "nope", to_exchange=True)
    with pytest.raises(NotFound):
        h.b.unbind("amq.direct", "q", "never-bound")
    with pytest.raises(InvalidArgument):
        h.b.bind("amq.direct", "q", 5)  # type: ignore[arg-type]
    assert h.b.list_bindings() == []


def test_bind_is_idempotent_and_unbind_forgets() -> None:
    h = Harness()
    h.queue("q")
    assert h.b.bind("amq.direct", "q", "k") is True
    assert h.b.bind("amq.direct", "q", "k") is False
    assert h.b.bind("amq.direct", "q", "k2") is True
    assert len(h.b.list_bindings()) == 2
    h.b.unbind("amq.direct", "q", "k")
    assert "amq.direct" in h.b.queues["q"].bound_from  # k2 still there
    h.b.unbind("amq.direct", "q", "k2")
    assert "amq.direct" not in h.b.queues["q"].bound_from
    assert h.b.list_bindings() == []


# ---------------------------------------------------- exchange-to-exchange


def test_exchange_to_exchange_chain() -> None:
    h = Harness()
    h.queue("q")
    h.b.declare_exchange("x1", "topic")
    h.b.declare_exchange("x2", "direct")
    h.b.bind("x1", "x2", "a.*", to_exchange=True)
    h.b.bind("x2", "q", "a.b")
    ch = h.channel()
    assert h.b.publish(ch, "x1", "a.b", b"1")[1] == 1
    assert h.b.publish(ch, "x1", "a.c", b"2")[1] == 0  # x2 drops it
    assert h.b.publish(ch, "x1", "b.b", b"3")[1] == 0  # x1 drops it
    h.sync()
    assert h.ready_bodies("q") == [b"1"]
    assert {"exchange": "x1", "to_exchange": "x2", "routing_key": "a.*", "arguments": {}} in h.b.list_bindings()


@pytest.mark.parametrize("shape", ["cycle", "self-loop", "diamond"])
def test_exchange_cycles_deliver_one_copy(shape: str) -> None:
    h = Harness()
    for q in ("q1", "q2"):
        h.queue(q)
    for x in ("x1", "x2", "x3"):
        h.b.declare_exchange(x, "fanout")
    if shape == "cycle":
        h.b.bind("x1", "x2", to_exchange=True)
        h.b.bind("x2", "x1", to_exchange=True)
        h.b.bind("x1", "q1")
        h.b.bind("x2", "q1")
        h.b.bind("x2", "q2")
    elif shape == "self-loop":
        h.b.bind("x1", "x1", to_exchange=True)
        h.b.bind("x1", "q1")
        h.b.bind("x1", "q2")
    else:
        h.b.bind("x1", "x2", to_exchange=True)
        h.b.bind("x1", "x3", to_exchange=True)
        h.b.bind("x2", "q1")
        h.b.bind("x3", "q1")
        h.b.bind("x3", "q2")
        h.b.bind("x3", "x1", to_exchange=True)
    ch = h.channel()
    for start in (["x1", "x2"] if shape == "cycle" else ["x1"]):
        tag, routed = h.b.publish(ch, start, "k", start.encode())
        assert routed == 2
    h.sync()
    n = 2 if shape == "cycle" else 1
    assert h.info("q1")["messages_ready"] == n
    assert h.info("q2")["messages_ready"] == n
    # one message object shared by both queues
    q1 = h.b.queues["q1"].lanes[0].ready
    q2 = h.b.queues["q2"].lanes[0].ready
    assert q1[0].message is q2[0].message
    assert q1[0] is not q2[0]  # per-queue entries


def test_message_routed_to_many_queues_is_stored_once() -> None:
    h = Harness()
    names = [f"q{i}" for i in range(5)]
    for q in names:
        h.queue(q)
        h.b.bind("amq.fanout", q)
    ch = h.channel()
    h.b.publish(ch, "amq.fanout", "", b"shared")
    h.sync()
    messages = {id(h.b.queues[q].lanes[0].ready[0].message) for q in names}
    assert len(messages) == 1
    enqueues = [r for r in h.records if r[1] == 7]
    assert len(enqueues) == 1  # one ENQUEUE record naming every queue
    from broker.core.records import decode_enqueue

    assert sorted(decode_enqueue(enqueues[0][2]).qids) == sorted(h.b.queues[q].qid for q in names)


def test_deleting_exchange_removes_e2e_bindings_both_ways() -> None:
    h = Harness()
    h.queue("q")
    h.b.declare_exchange("src", "fanout")
    h.b.declare_exchange("mid", "fanout")
    h.b.bind("src", "mid", to_exchange=True)
    h.b.bind("mid", "q")
    h.b.delete_exchange("mid")
    assert h.b.exchanges["src"].table.bindings == {}
    assert "mid" not in h.b.queues["q"].bound_from
    ch = h.channel()
    assert h.b.publish(ch, "src", "", b"x")[1] == 0
    # a new exchange with the old name starts without bindings
    h.b.declare_exchange("mid", "fanout")
    assert h.b.publish(ch, "src", "", b"x")[1] == 0
    assert h.b.exchanges["mid"].bound_from == set()


def test_internal_exchange_only_reachable_through_bindings() -> None:
    h = Harness()
    h.queue("q")
    h.b.declare_exchange("inner", "fanout", internal=True)
    h.b.declare_exchange("outer", "fanout")
    h.b.bind("outer", "inner", to_exchange=True)
    h.b.bind("inner", "q")
    ch = h.channel()
    t1 = h.publish(ch, "inner", "")
    t2 = h.publish(ch, "outer", "")
    h.sync()
    outcome = h.confirm_of(ch, t1)
    assert outcome is not None and outcome[0] is False
    assert (outcome[1] or "").startswith("access_refused")
    assert h.acked(ch, t2)
    assert h.info("q")["messages_ready"] == 1
