"""Sender-selected distribution (RabbitMQ's CC and BCC headers): a publish routed
with its own key and every key of CC and BCC, each queue reached once; BCC taken
out of the message before it is logged, delivered or returned; mandatory; every
exchange type, the default and alternate exchanges; refused and ignored input;
dead-lettering; transactions, schedules and replay. RabbitMQ's side of each rule is
checked by tests/system/test_amqp_differential_ccbcc.py."""

from __future__ import annotations

from typing import Any

import pytest

from broker.core import (
    InvalidArgument,
    RecordType,
    Return,
    check_properties,
    decode_enqueue,
)
from broker.core.senderselected import (
    check_routing_headers,
    header_routes,
    publish_keys,
)

from .durable_view import restart_from_log
from .helpers import Harness, ready_entries

QUEUES = ("qa", "qb", "qc")


def direct(h: Harness, name: str = "x") -> None:
    """Exchange ``name`` (direct) with queue qa bound by key a, qb by b, qc by c."""
    h.b.declare_exchange(name, "direct")
    for queue in QUEUES:
        if queue not in h.b.queues:
            h.queue(queue)
        h.b.bind(name, queue, queue[1])


def headers_in(h: Harness, queue: str) -> list[dict[str, Any]]:
    """The headers of each ready message of ``queue``."""
    return [(e.message.properties or {}).get("headers") or {} for e in ready_entries(h.b, queue)]


def counts(h: Harness, *queues: str) -> list[int]:
    return [h.b.queues[q].ready_count() for q in queues]


# -- the keys ----------------------------------------------------------------------


def test_the_keys_are_the_publishes_then_cc_then_bcc_strings_each_once() -> None:
    headers = {"BCC": ["c", "a"], "CC": ["b", 1, None, {"$amqp": "bytes", "value": "Yg=="}, ["c"], "b"]}
    assert header_routes(headers) == ["b", "b", "c", "a"]  # (x-death lists them so)
    assert publish_keys("a", headers) == ["a", "b", "c"]
    assert publish_keys("a", {"CC": "b"}) == ["a"]  # never validated (an old log): ignored
    assert publish_keys("a", {"cc": ["b"], "bcc": ["c"]}) == ["a"]  # names are case-sensitive


@pytest.mark.parametrize("value", ["b", None, 1, True, {"b": 1}, {"$amqp": "longstr", "value": "Yg=="}])
@pytest.mark.parametrize("name", ["CC", "BCC"])
def test_a_cc_or_bcc_that_is_not_an_array_is_refused_as_the_properties_are_checked(name: str, value: Any) -> None:
    # RabbitMQ closes the channel: 406 "invalid message: {unacceptable_type_in_header,...}"
    with pytest.raises(InvalidArgument, match=f"header {name} must be an array"):
        check_properties({"headers": {name: value}})
    with pytest.raises(InvalidArgument):
        check_routing_headers({"CC": [], name: value})
    assert check_properties({"headers": {name: ["k", 1, None]}}) == {"headers": {name: ["k", 1, None]}}
    assert check_properties({"headers": {name.lower(): value}}) is not None  # another header


# -- routing -----------------------------------------------------------------------


def test_cc_and_bcc_route_to_their_keys_and_bcc_is_not_kept() -> None:
    h = Harness()
    direct(h)
    ch = h.channel()
    props = {"headers": {"CC": ["b"], "BCC": ["c"], "other": 1}, "message_id": "m1"}
    tag, routed = h.b.publish(ch, "x", "a", b"m", props)
    h.sync()
    assert routed == 3 and h.acked(ch, tag)
    assert props == {"headers": {"CC": ["b"], "BCC": ["c"], "other": 1}, "message_id": "m1"}  # the caller's
    for queue in QUEUES:
        (entry,) = ready_entries(h.b, queue)
        assert entry.message.properties == {"headers": {"CC": ["b"], "other": 1}, "message_id": "m1"}
        assert entry.message.routing_key == "a"  # delivered with the publish's own key
    # one message, stored once: one ENQUEUE record naming the three queues, without BCC
    (record,) = [decode_enqueue(p) for _lsn, t, p in h.records if t == RecordType.ENQUEUE]
    assert len(record.qids) == 3 and record.properties == {"headers": {"CC": ["b"], "other": 1}, "message_id": "m1"}
    assert record.routing_key == "a"


def test_a_queue_reached_by_several_keys_gets_the_message_once() -> None:
    h = Harness()
    direct(h)
    h.b.bind("x", "qa", "b")  # qa by a and by b
    ch = h.channel()
    assert h.b.publish(ch, "x", "a", b"m", {"headers": {"CC": ["a", "b", "b"], "BCC": ["a", "b"]}})[1] == 2
    h.sync()
    assert counts(h, *QUEUES) == [1, 1, 0]


def test_only_bcc_or_an_empty_cc_and_lowercase_names() -> None:
    h = Harness()
    direct(h)
    ch = h.channel()
    h.b.publish(ch, "x", "zz", b"bcc only", {"headers": {"BCC": ["c"]}})
    h.b.publish(ch, "x", "a", b"empty", {"headers": {"CC": [], "BCC": []}})
    h.b.publish(ch, "x", "a", b"lower", {"headers": {"cc": ["b"], "bcc": ["c"]}})
    h.sync()
    assert h.ready_bodies("qa") == [b"empty", b"lower"]
    assert h.ready_bodies("qb") == []
    assert h.ready_bodies("qc") == [b"bcc only"]
    assert headers_in(h, "qc") == [{}]  # BCC was its only header
    assert headers_in(h, "qa") == [{"CC": []}, {"cc": ["b"], "bcc": ["c"]}]


def test_entries_that_are_not_strings_are_ignored() -> None:
    h = Harness()
    direct(h)
    ch = h.channel()
    cc = [1, "b", {"$amqp": "bytes", "value": "Yw=="}, None, ["c"], {"c": 1}]
    assert h.b.publish(ch, "x", "a", b"m", {"headers": {"CC": cc}})[1] == 2
    h.sync()
    assert counts(h, *QUEUES) == [1, 1, 0]
    assert headers_in(h, "qb") == [{"CC": cc}]


def test_mandatory_returns_only_when_no_key_routes_and_without_bcc() -> None:
    h = Harness()
    direct(h)
    ch = h.channel()
    by_cc = h.publish(ch, "x", "none", b"cc", {"headers": {"CC": ["b"]}}, mandatory=True)
    by_bcc = h.publish(ch, "x", "none", b"bcc", {"headers": {"BCC": ["c"]}}, mandatory=True)
    lost = h.publish(ch, "x", "none", b"lost", {"headers": {"CC": ["n2"], "BCC": ["n3"]}}, mandatory=True)
    effects = h.sync()
    (returned,) = h.of_type(Return, effects)
    assert returned.delivery_tag == lost
    assert returned.message.properties == {"headers": {"CC": ["n2"]}}
    assert returned.message.routing_key == "none"
    assert not {by_cc, by_bcc} & h.returned[ch]
    assert all(h.acked(ch, tag) for tag in (by_cc, by_bcc, lost))
    assert counts(h, *QUEUES) == [0, 1, 1]


def test_the_default_exchange_takes_each_key_as_a_queue_name() -> None:
    h = Harness()
    for queue in QUEUES:
        h.queue(queue)
    ch = h.channel()
    assert h.b.publish(ch, "", "qa", b"1", {"headers": {"CC": ["qb", "nosuch"], "BCC": ["qc"]}})[1] == 3
    assert h.b.publish(ch, "", "nosuch", b"2", {"headers": {"CC": ["qb"]}})[1] == 1
    assert h.b.publish(ch, "", "qa", b"3", {"headers": {"BCC": ["qa"]}})[1] == 1
    h.sync()
    assert [h.ready_bodies(q) for q in QUEUES] == [[b"1", b"3"], [b"1", b"2"], [b"1"]]


def test_topic_fanout_and_exchange_to_exchange() -> None:
    h = Harness()
    for queue in QUEUES:
        h.queue(queue)
    h.b.declare_exchange("t", "topic")
    h.b.bind("t", "qa", "x.*")
    h.b.bind("t", "qb", "y.#")
    ch = h.channel()
    assert h.b.publish(ch, "t", "x.1", b"t", {"headers": {"CC": ["y.1.2", "x.2"]}})[1] == 2
    h.b.declare_exchange("f", "fanout")
    h.b.bind("f", "qc", "")
    assert h.b.publish(ch, "f", "k", b"f", {"headers": {"CC": ["r", "s"]}})[1] == 1
    # every key travels along an exchange-to-exchange binding
    direct(h, "d")
    h.b.declare_exchange("src", "topic")
    h.b.bind("src", "d", "#", to_exchange=True)
    assert h.b.publish(ch, "src", "a", b"e2e", {"headers": {"CC": ["b"], "BCC": ["c"]}})[1] == 3
    h.sync()
    assert [h.ready_bodies(q) for q in QUEUES] == [[b"t", b"e2e"], [b"t", b"e2e"], [b"f", b"e2e"]]


def test_the_alternate_exchange_takes_every_key_when_none_routes() -> None:
    h = Harness()
    h.queue("qa")
    h.queue("qae")
    h.b.declare_exchange("ae", "direct")
    h.b.bind("ae", "qae", "ae-key")
    h.b.declare_exchange("x", "direct", arguments={"alternate-exchange": "ae"})
    h.b.bind("x", "qa", "a")
    ch = h.channel()
    assert h.b.publish(ch, "x", "nope", b"via ae", {"headers": {"CC": ["ae-key"]}})[1] == 1
    assert h.b.publish(ch, "x", "ae-key", b"no ae", {"headers": {"CC": ["a"]}})[1] == 1  # x routes it
    h.b.declare_exchange("x2", "direct", arguments={"alternate-exchange": ""})
    assert h.b.publish(ch, "x2", "qa", b"default ae", {"headers": {"BCC": ["qae"]}})[1] == 2
    h.sync()
    assert h.ready_bodies("qa") == [b"no ae", b"default ae"]
    assert h.ready_bodies("qae") == [b"via ae", b"default ae"]


def test_a_headers_exchange_matches_cc_but_not_bcc() -> None:
    # RabbitMQ takes BCC out before routing: a binding on it never matches
    h = Harness()
    for queue in QUEUES:
        h.queue(queue)
    h.b.declare_exchange("h", "headers")
    h.b.bind("h", "qa", "", {"x-match": "any", "CC": ["k"]})
    h.b.bind("h", "qb", "", {"x-match": "any", "BCC": ["k"]})
    h.b.bind("h", "qc", "", {"x-match": "any", "BCC": None})
    ch = h.channel()
    assert h.b.publish(ch, "h", "", b"m", {"headers": {"CC": ["k"], "BCC": ["k"]}})[1] == 1
    h.sync()
    assert counts(h, *QUEUES) == [1, 0, 0]


def test_a_consistent_hash_exchange_still_picks_one_queue_by_the_publishes_key() -> None:
    h = Harness()
    h.b.declare_exchange("ch", "x-consistent-hash")
    for i in range(4):
        h.queue(f"p{i}")
        h.b.bind("ch", f"p{i}", "1")
    ch = h.channel()
    for i in range(20):
        plain = {q.name for q in h.b.route(h.b.exchanges["ch"], f"k{i}", None)}
        cc = {q.name for q in h.b.route_publish(h.b.exchanges["ch"], f"k{i}", {"CC": ["a", "b", "c", "d"]})}
        assert cc == plain and len(cc) == 1
    assert h.b.publish(ch, "ch", "k", b"m", {"headers": {"CC": ["a", "b", "c"]}})[1] == 1


def test_a_cc_key_longer_than_a_routing_key_may_be_routes_nowhere_without_failing() -> None:
    h = Harness()
    direct(h)
    h.b.declare_exchange("t", "topic")
    h.b.bind("t", "qc", "#")
    ch = h.channel()
    assert h.b.publish(ch, "x", "a", b"m", {"headers": {"CC": ["k" * 300]}})[1] == 1
    assert h.b.publish(ch, "t", "", b"m", {"headers": {"CC": ["k" * 300]}})[1] == 1  # "#" matches it
    h.sync()
    assert counts(h, *QUEUES) == [1, 0, 1]


# -- what the message becomes ------------------------------------------------------


def test_a_restart_from_the_log_gives_back_the_message_without_bcc_in_every_queue() -> None:
    h = Harness()
    direct(h)
    ch = h.channel()
    h.b.publish(ch, "x", "a", b"m", {"headers": {"CC": ["b"], "BCC": ["c"]}})
    h.sync()
    nb = restart_from_log(h)
    for queue in QUEUES:
        (entry,) = ready_entries(nb, queue)
        assert entry.message.properties == {"headers": {"CC": ["b"]}}


def test_a_transaction_routes_its_publishes_with_cc_and_bcc_at_the_commit() -> None:
    h = Harness()
    direct(h)
    ch = h.channel()
    h.b.tx_select(ch)
    h.b.publish(ch, "x", "a", b"m", {"headers": {"BCC": ["b", "c"]}})
    assert counts(h, *QUEUES) == [0, 0, 0]
    h.b.tx_commit(ch)
    h.sync()
    assert counts(h, *QUEUES) == [1, 1, 1]
    assert headers_in(h, "qc") == [{}]


def test_a_schedules_tick_is_published_with_cc_and_bcc() -> None:
    h = Harness()
    for queue in QUEUES:
        h.queue(queue)
    h.b.put_schedule(
        "s", exchange="", routing_key="qa", body=b"tick", timing={"interval_s": 10},
        properties={"headers": {"CC": ["qb"], "BCC": ["qc"]}},
    )
    h.sync()
    h.sleep(10)
    h.sync()
    assert counts(h, *QUEUES) == [1, 1, 1]
    for queue in QUEUES:
        (headers,) = headers_in(h, queue)
        assert headers["CC"] == ["qb"] and "BCC" not in headers and headers["x-schedule"] == "s"


# -- dead-lettering ----------------------------------------------------------------


def dead_letter_one(h: Harness, **arguments: Any) -> None:
    """Queue ``work`` (bound to ``x`` by ``w``) dead-letters to ``x``; a publish with
    CC b and BCC c reaches it (and qb, qc); the copy in ``work`` is rejected."""
    direct(h)
    h.queue("work", arguments={"x-dead-letter-exchange": "x", **arguments})
    h.b.bind("x", "work", "w")
    ch = h.channel()
    assert h.b.publish(ch, "x", "w", b"m", {"headers": {"CC": ["b"], "BCC": ["c"]}})[1] == 3
    h.sync()
    consumer = h.channel()
    h.b.consume(consumer, "work")
    (d,) = h.delivers(h.step(), consumer)
    h.b.reject(consumer, d.delivery_tag, requeue=False)
    h.sync()


def test_a_dead_letter_is_routed_with_its_key_and_cc_and_lists_them_in_x_death() -> None:
    h = Harness()
    dead_letter_one(h)
    # qb: the publish and the dead letter (by its CC key); qc: the publish only
    # (RabbitMQ also routes the dead letter by the BCC keys: ackbus does not keep them)
    assert counts(h, *QUEUES) == [0, 2, 1]
    dead = headers_in(h, "qb")[1]
    assert dead["CC"] == ["b"] and "BCC" not in dead
    assert dead["x-death"][0]["routing-keys"] == ["w", "b"]
    assert ready_entries(h.b, "qb")[1].message.routing_key == "w"


def test_a_dead_letter_routing_key_replaces_every_key_and_drops_cc() -> None:
    h = Harness()
    dead_letter_one(h, **{"x-dead-letter-routing-key": "a"})
    assert counts(h, *QUEUES) == [1, 1, 1]
    (dead,) = headers_in(h, "qa")
    assert "CC" not in dead and "BCC" not in dead
    assert dead["x-death"][0]["routing-keys"] == ["w", "b"]  # as RabbitMQ: the keys it was published with
    assert ready_entries(h.b, "qa")[0].message.routing_key == "a"


def test_routing_by_one_key_is_routing_without_cc() -> None:
    # route_keys walks the exchanges as route does: with one key, the same queues
    h = Harness()
    for queue in (*QUEUES, "qae"):
        h.queue(queue)
    h.b.declare_exchange("ae", "fanout")
    h.b.bind("ae", "qae")
    h.b.declare_exchange("t", "topic", arguments={"alternate-exchange": "ae"})
    h.b.bind("t", "qa", "a.*")
    h.b.bind("t", "qb", "#.b")
    h.b.declare_exchange("d", "direct", arguments={"alternate-exchange": ""})
    h.b.bind("t", "d", "x.#", to_exchange=True)
    h.b.bind("d", "qc", "x.c")
    h.b.bind("d", "t", "x.c", to_exchange=True)  # a cycle
    for name in ("t", "d", "ae", ""):
        ex = h.b.exchanges[name]
        for key in ("a.1", "a.b", "x.c", "x.qa", "qb", "qae", "", "none"):
            expected = {q.name for q in h.b.route(ex, key, None)}
            assert {q.name for q in h.b.topology.route_keys(ex, [key], None)} == expected, (name, key)
            assert {q.name for q in h.b.route_publish(ex, key, {"CC": [key], "BCC": []})} == expected, (name, key)
    assert h.b.topology.route_keys(h.b.exchanges["t"], [], None) == []
