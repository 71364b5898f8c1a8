"""The consistent-hash exchange (``x-consistent-hash``): each message goes to exactly
one bound queue, chosen by hashing its routing key (or a header), in proportion to the
bindings' weights, stably."""

from __future__ import annotations

import collections
import random

import pytest

from broker.core import InvalidArgument

from .durable_view import restart_from_log
from .helpers import Harness, ready_entries


def partitioned(h: Harness, weights: dict[str, int], **arguments: object) -> None:
    h.b.declare_exchange("parts", "x-consistent-hash", arguments=dict(arguments))
    for name, weight in weights.items():
        h.queue(name)
        h.b.bind("parts", name, str(weight))


def route(h: Harness, key: str, headers: dict[str, str] | None = None) -> str:
    (queue,) = h.b.route(h.b.exchanges["parts"], key, headers)
    return queue.name


def test_equal_weights_share_keys_evenly_and_each_key_stays_put() -> None:
    h = Harness()
    partitioned(h, {f"p{i}": 1 for i in range(4)})
    keys = [f"order-{random.Random(7).random()}-{i}" for i in range(20_000)]
    placed = {key: route(h, key) for key in keys}
    shares = collections.Counter(placed.values())
    assert set(shares) == {"p0", "p1", "p2", "p3"}
    for count in shares.values():  # 25 % each, within 5 points
        assert 0.20 * len(keys) <= count <= 0.30 * len(keys), shares
    assert all(route(h, key) == queue for key, queue in list(placed.items())[:500])  # stable


def test_weights_set_the_shares_and_removing_a_queue_moves_only_its_keys() -> None:
    h = Harness()
    partitioned(h, {"big": 3, "small": 1})
    keys = [f"k{i}" for i in range(20_000)]
    placed = {key: route(h, key) for key in keys}
    big = sum(1 for q in placed.values() if q == "big") / len(keys)
    assert 0.70 <= big <= 0.80, big
    h.queue("third")
    h.b.bind("parts", "third", "1")
    moved = [key for key in keys if route(h, key) != placed[key]]
    assert all(route(h, key) == "third" for key in moved)  # keys only move to the new queue
    assert 0.10 <= len(moved) / len(keys) <= 0.30


def test_a_header_can_be_hashed_instead_and_messages_land_in_one_queue() -> None:
    h = Harness()
    partitioned(h, {"a": 1, "b": 1}, **{"hash-header": "customer"})
    first = route(h, "ignored-1", {"customer": "c-42"})
    assert all(route(h, f"ignored-{i}", {"customer": "c-42"}) == first for i in range(50))
    h.publish(0, "parts", "x", b"m", {"headers": {"customer": "c-42"}})
    h.sync()
    assert [e.message.body for e in ready_entries(h.b, first)] == [b"m"]
    assert ready_entries(h.b, "b" if first == "a" else "a") == []


def test_a_weight_must_be_an_integer_routing_key() -> None:
    h = Harness()
    partitioned(h, {"a": 1})
    h.queue("z")
    for bad in ("", "heavy", "0", "101", "-1"):
        with pytest.raises(InvalidArgument, match="weight"):
            h.b.bind("parts", "z", bad)
    assert route(h, "k") == "a"  # a refused binding left no trace


def test_the_partitioning_is_the_same_after_a_restart() -> None:
    h = Harness()
    partitioned(h, {"a": 2, "b": 1, "c": 1}, **{"hash-header": "customer"})
    before = {f"c{i}": route(h, "", {"customer": f"c{i}"}) for i in range(300)}
    nb = restart_from_log(h)
    after = {key: nb.route(nb.exchanges["parts"], "", {"customer": key})[0].name for key in before}
    assert after == before
