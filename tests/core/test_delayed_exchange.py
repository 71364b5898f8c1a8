"""The delayed-message exchange (``x-delayed-message``, RabbitMQ's plugin): declared
with the type it routes as (``x-delayed-type``), it routes like that type, and a
publish's ``x-delay`` header (milliseconds) holds the message back in its queues
through the core's own delayed publish."""

from __future__ import annotations

from typing import Any

import pytest

from broker.core import InvalidArgument, PreconditionFailed, RecordType, Return

from .durable_view import (
    durable_view,
    fresh_broker,
    live_entries,
    replay_into,
    restart_from_log,
)
from .helpers import Harness, ready_entries

ROUTING_TYPES = ["direct", "fanout", "topic", "headers", "x-consistent-hash"]


def delayed_exchange(h: Harness, routing: str = "direct", name: str = "dx", **arguments: Any) -> None:
    h.b.declare_exchange(name, "x-delayed-message", arguments={"x-delayed-type": routing, **arguments})


def headers(delay: Any, **more: Any) -> dict[str, Any]:
    return {"headers": {"x-delay": delay, **more}}


def delayed_count(h: Harness, queue: str) -> int:
    return int(h.info(queue)["messages_delayed"])


# -- declare -----------------------------------------------------------------------------


@pytest.mark.parametrize("routing", ROUTING_TYPES)
def test_declare_takes_every_routing_type_and_keeps_its_arguments(routing: str) -> None:
    h = Harness()
    delayed_exchange(h, routing)
    exchange = h.b.exchanges["dx"]
    assert exchange.type == "x-delayed-message"
    assert exchange.arguments == {"x-delayed-type": routing}
    # the same declare again is a no-op; passive finds it
    assert h.b.declare_exchange("dx", "x-delayed-message", arguments={"x-delayed-type": routing})[1] is False
    assert h.b.declare_exchange("dx", passive=True)[0] is exchange


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"x-delayed-type": "nonesuch"},
        {"x-delayed-type": "x-delayed-message"},  # not itself (the plugin recurses for ever)
        {"x-delayed-type": 1},
        {"x-delayed-type": ["direct"]},
        {"x-delayed-type": None},
    ],
)
def test_declare_without_a_routing_type_is_refused_and_leaves_nothing(arguments: dict[str, Any]) -> None:
    h = Harness()
    with pytest.raises(InvalidArgument, match="'x-delayed-type' must be an existing exchange type"):
        h.b.declare_exchange("dx", "x-delayed-message", arguments=arguments)
    assert "dx" not in h.b.exchanges
    h.step()
    assert h.records == []


def test_redeclare_with_another_routing_type_is_refused() -> None:
    h = Harness()
    delayed_exchange(h, "direct")
    with pytest.raises(PreconditionFailed):
        h.b.declare_exchange("dx", "x-delayed-message", arguments={"x-delayed-type": "topic"})
    with pytest.raises(PreconditionFailed):
        h.b.declare_exchange("dx", "direct")


def test_x_delayed_type_on_another_exchange_is_checked_and_means_nothing() -> None:
    h = Harness()
    h.b.declare_exchange("plain", "fanout", arguments={"x-delayed-type": "direct"})
    with pytest.raises(InvalidArgument, match="x-delayed-type"):
        h.b.declare_exchange("plain2", "fanout", arguments={"x-delayed-type": "nonesuch"})
    h.queue("q")
    h.b.bind("plain", "q")
    h.publish(0, "plain", "any", b"m", headers(5000))
    assert [e.message.body for e in ready_entries(h.b, "q")] == [b"m"]  # no delay
    assert delayed_count(h, "q") == 0


# -- routing -----------------------------------------------------------------------------


def test_direct_routes_by_key() -> None:
    h = Harness()
    delayed_exchange(h, "direct")
    for name in ("a", "b"):
        h.queue(name)
        h.b.bind("dx", name, name)
    assert [q.name for q in h.b.route(h.b.exchanges["dx"], "a", None)] == ["a"]
    assert h.b.route(h.b.exchanges["dx"], "c", None) == []


def test_fanout_routes_to_every_queue() -> None:
    h = Harness()
    delayed_exchange(h, "fanout")
    for name in ("a", "b"):
        h.queue(name)
        h.b.bind("dx", name, name)
    assert sorted(q.name for q in h.b.route(h.b.exchanges["dx"], "whatever", None)) == ["a", "b"]


def test_topic_routes_by_pattern() -> None:
    h = Harness()
    delayed_exchange(h, "topic")
    h.queue("eu")
    h.queue("all")
    h.b.bind("dx", "eu", "orders.eu.*")
    h.b.bind("dx", "all", "orders.#")
    assert sorted(q.name for q in h.b.route(h.b.exchanges["dx"], "orders.eu.paris", None)) == ["all", "eu"]
    assert [q.name for q in h.b.route(h.b.exchanges["dx"], "orders.us", None)] == ["all"]


def test_headers_routes_by_headers_and_checks_x_match() -> None:
    h = Harness()
    delayed_exchange(h, "headers")
    h.queue("red")
    h.b.bind("dx", "red", "", {"x-match": "all", "colour": "red"})
    assert [q.name for q in h.b.route(h.b.exchanges["dx"], "", {"colour": "red", "x-delay": 10})] == ["red"]
    assert h.b.route(h.b.exchanges["dx"], "", {"colour": "blue"}) == []
    with pytest.raises(InvalidArgument, match="x-match"):
        h.b.bind("dx", "red", "", {"x-match": "most"})


def test_consistent_hash_sends_each_message_to_one_queue_even_with_cc() -> None:
    h = Harness()
    delayed_exchange(h, "x-consistent-hash", **{"hash-header": "customer"})
    for name in ("p0", "p1", "p2"):
        h.queue(name)
        h.b.bind("dx", name, "1")
    exchange = h.b.exchanges["dx"]
    first = [q.name for q in h.b.route(exchange, "k", {"customer": "c-7"})]
    assert len(first) == 1
    assert all([q.name for q in h.b.route(exchange, f"k{i}", {"customer": "c-7"})] == first for i in range(20))
    # CC keys do not fan a consistent-hash message out (as on the plain type)
    cc = {"customer": "c-7", "CC": [f"key-{i}" for i in range(30)]}
    assert [q.name for q in h.b.route_publish(exchange, "k", cc)] == first
    with pytest.raises(InvalidArgument, match="weight"):
        h.b.bind("dx", "p0", "heavy")


def test_exchange_to_exchange_bindings_and_the_alternate_exchange_route_as_usual() -> None:
    h = Harness()
    h.b.declare_exchange("spill", "fanout")
    h.queue("spilled")
    h.b.bind("spill", "spilled")
    delayed_exchange(h, "direct", **{"alternate-exchange": "spill"})
    h.b.declare_exchange("next", "fanout")
    h.queue("far")
    h.b.bind("next", "far")
    h.b.bind("dx", "next", "k", to_exchange=True)
    exchange = h.b.exchanges["dx"]
    assert [q.name for q in h.b.route(exchange, "k", None)] == ["far"]
    assert [q.name for q in h.b.route(exchange, "other", None)] == ["spilled"]
    # and a delayed publish is held in the queue it reaches, wherever that is
    h.publish(0, "dx", "k", b"late", headers(1000))
    h.publish(0, "dx", "other", b"late-spilled", headers(1000))
    assert (delayed_count(h, "far"), delayed_count(h, "spilled")) == (1, 1)
    h.sleep(1.001)
    assert [e.message.body for e in ready_entries(h.b, "far")] == [b"late"]
    assert [e.message.body for e in ready_entries(h.b, "spilled")] == [b"late-spilled"]


# -- the x-delay header --------------------------------------------------------------------


def test_a_delayed_publish_is_confirmed_at_once_and_ready_only_when_due() -> None:
    h = Harness()
    delayed_exchange(h, "fanout")
    h.queue("q")
    h.b.bind("dx", "q")
    ch = h.channel()
    h.b.consume(ch, "q")
    tag = h.publish(0, "dx", "", b"later", headers(3000, keep="me"))
    now = h.publish(0, "dx", "", b"now")
    h.sync()
    assert h.acked(0, tag) and h.acked(0, now)  # the confirm does not wait for the delay
    assert h.bodies(h.effects, ch) == [b"now"]
    assert delayed_count(h, "q") == 1
    assert h.delivers(h.sleep(2.9), ch) == []
    (d,) = h.delivers(h.sleep(0.2), ch)
    assert d.message.body == b"later"
    # the plugin's mark: the delay comes back negated; the other headers stay
    assert d.message.properties is not None
    assert d.message.properties["headers"] == {"x-delay": -3000, "keep": "me"}


def test_the_delayed_publish_is_one_durable_record_and_keeps_its_delay_across_a_restart() -> None:
    h = Harness()
    delayed_exchange(h, "direct")
    h.queue("q")
    h.b.bind("dx", "q", "k")
    tag = h.publish(0, "dx", "k", b"later", headers(10_000))
    h.sync()
    assert h.acked(0, tag)
    assert [r[1] for r in h.records].count(RecordType.MOVE) == 1  # message and due time together
    h.sleep(4)
    for nb in (
        restart_from_log(h),
        replay_into(fresh_broker(h), [(0, t, p) for c in h.b.snapshot()[1] for t, p in c], h.b.last_lsn),
    ):
        assert durable_view(nb) == durable_view(h.b)
        assert nb.exchanges["dx"].type == "x-delayed-message"
        assert [q.name for q in nb.route(nb.exchanges["dx"], "k", None)] == ["q"]  # routes as direct
        (entry,) = live_entries(nb, "q")  # (held in memory or paged out)
        assert entry.message.properties is not None
        assert entry.message.properties["headers"]["x-delay"] == -10_000
        assert [(round(due_ms / 1000 - h.wall.now)) for _s, due_ms in nb.queues["q"].delayed.due_times()] == [6]
        assert nb.queues["q"].ready_count() == 0


@pytest.mark.parametrize(
    ("value", "delay_ms"),
    [
        (1500, 1500),
        ("2500", 2500),  # a string of digits: the plugin's binary_to_integer
        ("+2500", 2500),
        (1500.9, 1500),  # a double: truncated
        ({"$amqp": "int8", "value": 100}, 100),
        ({"$amqp": "uint32", "value": 4000}, 4000),
        ({"$amqp": "int64", "value": 7000}, 7000),
        ({"$amqp": "float", "value": 2.5}, 2),
        ({"$amqp": "decimal", "value": "1234.56"}, 1234),
        ((1 << 32) - 1, (1 << 32) - 1),  # the longest delay
    ],
)
def test_x_delay_values_that_delay(value: Any, delay_ms: int) -> None:
    h = Harness()
    delayed_exchange(h)
    h.queue("q")
    h.b.bind("dx", "q", "k")
    h.publish(0, "dx", "k", b"m", headers(value))
    (entry,) = h.b.queues["q"].delayed.whole()
    assert entry.message.properties is not None
    assert entry.message.properties["headers"]["x-delay"] == -delay_ms
    ((_seq, due_ms),) = h.b.queues["q"].delayed.due_times()
    assert abs(due_ms - (h.wall.now * 1000 + delay_ms)) <= 1


@pytest.mark.parametrize(
    "value",
    [
        0,
        -5000,  # already delayed once (the plugin's mark): never again
        "-5000",
        1 << 32,  # past the longest delay: routed at once, as the plugin does
        "99999999999999999999999",
        0.4,  # truncated to 0
        -1.5,
        "abc",
        "12.5",
        " 100",
        "",
        True,
        None,
        [100],
        {"ms": 100},
        {"$amqp": "timestamp", "value": 100},
        {"$amqp": "bytes", "value": "MTAw"},
        {"$amqp": "decimal", "value": "NaN"},
        {"$amqp": "float", "value": "not a number"},
    ],
)
def test_x_delay_values_that_do_not_delay_route_at_once_with_headers_untouched(value: Any) -> None:
    h = Harness()
    delayed_exchange(h)
    h.queue("q")
    h.b.bind("dx", "q", "k")
    tag = h.publish(0, "dx", "k", b"m", headers(value))
    h.sync()
    assert h.acked(0, tag)
    assert delayed_count(h, "q") == 0
    (entry,) = ready_entries(h.b, "q")
    assert entry.message.properties is not None
    assert entry.message.properties["headers"] == {"x-delay": value}


def test_no_header_no_properties_route_at_once() -> None:
    h = Harness()
    delayed_exchange(h)
    h.queue("q")
    h.b.bind("dx", "q", "k")
    h.publish(0, "dx", "k", b"none")
    h.publish(0, "dx", "k", b"other", {"headers": {"x-other": 5}})
    h.publish(0, "dx", "k", b"props", {"content_type": "text/plain"})
    assert [e.message.body for e in ready_entries(h.b, "q")] == [b"none", b"other", b"props"]
    assert delayed_count(h, "q") == 0


def test_an_explicit_delay_wins_over_the_header() -> None:
    h = Harness()
    delayed_exchange(h)
    h.queue("q")
    h.b.bind("dx", "q", "k")
    h.b.publish(0, "dx", "k", b"m", headers(60_000), delay_s=1)
    ((_seq, due_ms),) = h.b.queues["q"].delayed.due_times()
    assert abs(due_ms - (h.wall.now + 1) * 1000) <= 1
    (entry,) = h.b.queues["q"].delayed.whole()
    assert entry.message.properties is not None
    assert entry.message.properties["headers"] == {"x-delay": 60_000}


def test_the_header_delays_only_on_a_delayed_message_exchange() -> None:
    h = Harness()
    h.queue("q")
    h.publish(0, "", "q", b"m", headers(5000))
    assert delayed_count(h, "q") == 0 and len(ready_entries(h.b, "q")) == 1


def test_the_callers_properties_are_not_changed() -> None:
    h = Harness()
    delayed_exchange(h)
    h.queue("q")
    h.b.bind("dx", "q", "k")
    props = headers(5000)
    h.publish(0, "dx", "k", b"m", props)
    assert props == headers(5000)


def test_mandatory_unroutable_is_returned_as_published_and_a_routed_one_is_not() -> None:
    """ackbus routes at publish time, so ``mandatory`` means what it always means (the
    plugin returns every delayed mandatory publish, routed or not)."""
    h = Harness()
    delayed_exchange(h)
    h.queue("q")
    h.b.bind("dx", "q", "k")
    lost = h.publish(0, "dx", "nowhere", b"lost", headers(5000), mandatory=True)
    kept = h.publish(0, "dx", "k", b"kept", headers(5000), mandatory=True)
    h.sync()
    (ret,) = h.of_type(Return)
    assert ret.delivery_tag == lost and ret.message.body == b"lost"
    assert ret.message.properties == headers(5000)  # as published: it can be sent again
    assert h.acked(0, lost) and h.acked(0, kept)
    assert delayed_count(h, "q") == 1


def test_a_transaction_delays_its_publishes_from_the_commit() -> None:
    h = Harness()
    delayed_exchange(h)
    h.queue("q")
    h.b.bind("dx", "q", "k")
    ch = h.channel()
    h.b.tx_select(ch)
    h.b.publish(ch, "dx", "k", b"m", headers(2000))
    h.sleep(5)
    assert delayed_count(h, "q") == 0
    h.b.tx_commit(ch)
    assert delayed_count(h, "q") == 1
    h.sleep(1.9)
    assert ready_entries(h.b, "q") == []
    h.sleep(0.2)
    assert [e.message.body for e in ready_entries(h.b, "q")] == [b"m"]


def test_bcc_is_stripped_and_the_delay_kept() -> None:
    h = Harness()
    delayed_exchange(h)
    h.queue("q")
    h.queue("copy")
    h.b.bind("dx", "q", "k")
    h.b.bind("dx", "copy", "c")
    h.publish(0, "dx", "k", b"m", headers(1000, BCC=["c"]))
    for name in ("q", "copy"):
        (entry,) = h.b.queues[name].delayed.whole()
        assert entry.message.properties is not None
        assert entry.message.properties["headers"] == {"x-delay": -1000}
