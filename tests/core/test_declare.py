"""Declaring and deleting exchanges and queues: equality, passive, names, ownership, limits."""

from __future__ import annotations

from typing import Any

import pytest

from broker.core import (
    AccessRefused,
    ChannelError,
    ConsumerCancelled,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
    Unavailable,
    check_name,
    check_routing_key,
)

from .helpers import Harness

BAD_NAMES: list[Any] = ["", "x" * 256, "é" * 128, "a\x00b", "tab\there", "nl\n", "del\x7f", "lone\ud800", 5, None, b"bytes"]


# ------------------------------------------------------------------ names


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_rejected_everywhere(name: Any) -> None:
    h = Harness()
    before = (set(h.b.exchanges), set(h.b.queues))
    with pytest.raises(InvalidArgument):
        check_name("queue", name)
    if name != "":  # "" is the default exchange and asks for a server-named queue
        with pytest.raises(InvalidArgument):
            h.b.declare_exchange(name, "direct")
        with pytest.raises(InvalidArgument):
            h.b.declare_queue(name)
    assert (set(h.b.exchanges), set(h.b.queues)) == before
    assert h.step() == []


def test_longest_names_accepted() -> None:
    h = Harness()
    assert h.queue("x" * 255) == "x" * 255
    assert h.b.declare_exchange("é" * 127, "topic")[1]  # 254 bytes
    assert check_name("queue", "€" * 85) == "€" * 85  # 255 bytes


@pytest.mark.parametrize("name", ["amq.mine", "amq.gen-foo", "amq.gen-b0-1", "amq."])
def test_reserved_prefix_refused(name: str) -> None:
    h = Harness()
    with pytest.raises(AccessRefused):
        h.b.declare_exchange(name, "direct")
    with pytest.raises(AccessRefused):
        h.b.declare_queue(name)
    assert name not in h.b.queues and name not in h.b.exchanges


def test_routing_key_length_counts_bytes() -> None:
    assert check_routing_key("k" * 255) == "k" * 255
    assert check_routing_key("") == ""
    with pytest.raises(InvalidArgument):
        check_routing_key("k" * 256)
    with pytest.raises(InvalidArgument):
        check_routing_key("€" * 100)  # 100 characters, 300 bytes
    with pytest.raises(InvalidArgument):
        check_routing_key(None)


# -------------------------------------------------------------- exchanges


def test_exchange_redeclare_equal_is_noop() -> None:
    h = Harness()
    ex, created = h.b.declare_exchange("x", "topic", arguments={"alternate": "y"})
    assert created
    h.step()
    n_records = len(h.records)
    ex2, created2 = h.b.declare_exchange("x", "topic", arguments={"alternate": "y"})
    assert ex2 is ex and not created2
    h.step()
    assert len(h.records) == n_records  # nothing logged again


@pytest.mark.parametrize(
    "change",
    [
        {"type": "fanout"},
        {"durable": False},
        {"auto_delete": True},
        {"internal": True},
        {"arguments": {"a": 1}},
    ],
)
def test_exchange_redeclare_different_fails(change: dict[str, Any]) -> None:
    h = Harness()
    h.b.declare_exchange("x", "direct")
    kwargs: dict[str, Any] = {"type": "direct", **change}
    with pytest.raises(PreconditionFailed):
        h.b.declare_exchange("x", **kwargs)
    assert h.b.exchanges["x"].settings() == ("direct", True, False, False, {})


def test_exchange_passive() -> None:
    h = Harness()
    with pytest.raises(NotFound):
        h.b.declare_exchange("nope", passive=True)
    assert "nope" not in h.b.exchanges
    h.b.declare_exchange("x", "fanout")
    # passive ignores the other settings
    ex, created = h.b.declare_exchange("x", "topic", passive=True)
    assert ex.type == "fanout" and not created


def test_exchange_bad_type_and_arguments() -> None:
    h = Harness()
    with pytest.raises(InvalidArgument):
        h.b.declare_exchange("x", "nonsense")
    with pytest.raises(InvalidArgument):
        h.b.declare_exchange("x", "direct", arguments=[1, 2])  # type: ignore[arg-type]
    assert "x" not in h.b.exchanges


def test_exchange_limit() -> None:
    h = Harness(max_exchanges=2)
    h.b.declare_exchange("a")
    h.b.declare_exchange("b")
    with pytest.raises(Unavailable) as ei:
        h.b.declare_exchange("c")
    assert ei.value.code == "limit_reached"
    h.b.declare_exchange("a")  # redeclare is still fine
    h.b.delete_exchange("a")
    h.b.declare_exchange("c")


def test_delete_exchange_if_unused() -> None:
    h = Harness()
    h.queue("q")
    h.b.declare_exchange("x", "direct")
    h.b.bind("x", "q", "k")
    with pytest.raises(PreconditionFailed):
        h.b.delete_exchange("x", if_unused=True)
    assert "x" in h.b.exchanges
    h.b.unbind("x", "q", "k")
    h.b.delete_exchange("x", if_unused=True)
    assert "x" not in h.b.exchanges
    with pytest.raises(NotFound):
        h.b.delete_exchange("x")


def test_auto_delete_exchange_goes_with_last_binding() -> None:
    h = Harness()
    h.queue("q1")
    h.queue("q2")
    h.b.declare_exchange("ad", "fanout", auto_delete=True)
    assert "ad" in h.b.exchanges  # never bound: stays
    h.b.bind("ad", "q1")
    h.b.bind("ad", "q2")
    h.b.unbind("ad", "q1")
    assert "ad" in h.b.exchanges
    h.b.delete_queue("q2")  # the last binding goes with its queue
    assert "ad" not in h.b.exchanges


def test_auto_delete_exchange_after_unbind_and_after_dest_exchange_deleted() -> None:
    h = Harness()
    h.queue("q")
    h.b.declare_exchange("ad", "fanout", auto_delete=True)
    h.b.bind("ad", "q")
    h.b.unbind("ad", "q")
    assert "ad" not in h.b.exchanges
    h.b.declare_exchange("ad", "fanout", auto_delete=True)
    h.b.declare_exchange("dest", "fanout")
    h.b.bind("ad", "dest", to_exchange=True)
    h.b.delete_exchange("dest")
    assert "ad" not in h.b.exchanges


def test_auto_delete_of_exchanges_can_be_left_to_a_cluster() -> None:
    """In a cluster etcd's bindings decide (a core holds only those to its own
    queues): with ``auto_delete_exchanges_here(False)`` the last local binding going
    leaves the exchange in place."""
    h = Harness()
    h.b.auto_delete_exchanges_here(False)
    h.queue("q")
    h.b.declare_exchange("ad", "fanout", auto_delete=True)
    h.b.bind("ad", "q")
    h.b.unbind("ad", "q")
    h.b.bind("ad", "q")
    h.b.delete_queue("q")
    assert "ad" in h.b.exchanges
    h.b.delete_exchange("ad")  # (deleted as any exchange, when etcd says so)
    assert "ad" not in h.b.exchanges


# ------------------------------------------------------------------ queues


def test_queue_redeclare_equal_and_different() -> None:
    h = Harness()
    q, created = h.b.declare_queue("q", arguments={"x-max-length": 5})
    assert created
    q2, created2 = h.b.declare_queue("q", arguments={"x-max-length": 5})
    assert q2 is q and not created2
    for change in ({"durable": False}, {"auto_delete": True}, {"arguments": {}}, {"arguments": {"x-max-length": 6}}):
        with pytest.raises(PreconditionFailed):
            h.b.declare_queue("q", **{"arguments": {"x-max-length": 5}, **change})
    ch = h.channel()
    # other exclusivity is RESOURCE_LOCKED, as RabbitMQ answers it (405), both ways
    with pytest.raises(ResourceLocked):
        h.b.declare_queue("q", exclusive=True, arguments={"x-max-length": 5}, channel_id=ch)
    assert h.b.queues["q"] is q and q.exclusive_owner is None
    h.b.declare_queue("mine", exclusive=True, channel_id=ch)
    with pytest.raises(ResourceLocked):
        h.b.declare_queue("mine", channel_id=ch)
    assert h.b.queues["mine"].exclusive_owner is not None


def test_queue_passive() -> None:
    h = Harness()
    with pytest.raises(NotFound):
        h.b.declare_queue("nope", passive=True)
    with pytest.raises(NotFound):
        h.b.declare_queue("", passive=True)
    assert h.b.queues == {}
    h.queue("q", durable=False)
    q, created = h.b.declare_queue("q", durable=True, arguments={"x": 1}, passive=True)
    assert not created and q.durable is False


def test_server_named_queues() -> None:
    h = Harness()
    a, created_a = h.b.declare_queue("")
    b, created_b = h.b.declare_queue("")
    assert created_a and created_b
    assert a.name != b.name
    assert a.name.startswith("amq.gen-") and "b0" in a.name
    # the generated name can be used afterwards
    assert h.b.declare_queue(a.name)[0] is a
    h.b.delete_queue(a.name)
    c, _ = h.b.declare_queue("")
    assert c.name not in (a.name, b.name)


def test_server_named_queue_skips_names_in_use() -> None:
    # After a restart with the same boot id, recovered server-named queues exist.
    h = Harness()
    first, _ = h.b.declare_queue("")
    h.b.store._next_name = 1  # as after a restart that reuses the boot id
    second, created = h.b.declare_queue("", durable=False)
    assert created and second is not first and second.name != first.name


@pytest.mark.parametrize(
    ("args"),
    [
        {"x-max-length": -1},
        {"x-max-length": "10"},
        {"x-max-length": True},
        {"x-max-length": 1.5},
        {"x-overflow": "reject"},
        {"x-message-ttl": -5},
        {"x-message-ttl": None},
        {"x-consumer-timeout": 0},
        {"x-consumer-timeout": "60000"},
    ],
)
def test_invalid_queue_arguments(args: dict[str, Any]) -> None:
    h = Harness()
    with pytest.raises(InvalidArgument):
        h.b.declare_queue("q", arguments=args)
    assert "q" not in h.b.queues
    assert h.step() == []


@pytest.mark.parametrize(
    ("args"),
    [
        {"x-queue-mode": "bogus"},
        {"x-queue-mode": 1},
        {"x-queue-version": 3},
        {"x-queue-version": "2"},
        {"x-queue-version": True},
        {"x-queue-leader-locator": "bogus"},
        {"x-queue-master-locator": "balanced"},
        {"x-max-in-memory-length": -1},
        {"x-max-in-memory-bytes": "3"},
        {"x-dead-letter-strategy": 1},
        {"x-dead-letter-strategy": "exactly-once"},
    ],
)
def test_rabbitmq_storage_and_placement_arguments_are_checked(args: dict[str, Any]) -> None:
    h = Harness()
    with pytest.raises(InvalidArgument, match=next(iter(args))):
        h.b.declare_queue("q", arguments=args)
    assert "q" not in h.b.queues


def test_rabbitmq_storage_and_placement_arguments_are_kept_and_compared() -> None:
    # RabbitMQ's own settings (lazy mode, queue version, in-memory limits, placement,
    # dead-letter strategy, RabbitMQ 2's mirroring) are accepted as RabbitMQ accepts
    # them, kept with the queue and compared on a redeclare, as RabbitMQ compares them.
    h = Harness()
    kept = {
        "x-queue-mode": "lazy",
        "x-queue-version": 2,
        "x-queue-leader-locator": "least-leaders",
        "x-queue-master-locator": "min-masters",
        "x-max-in-memory-length": 0,
        "x-max-in-memory-bytes": 1 << 20,
        "x-dead-letter-strategy": "at-least-once",
        "x-ha-policy": "all",
        "x-ha-nodes": ["rabbit@a", "rabbit@b"],
        "x-ha-params": 2,
    }
    for key, value in kept.items():
        q, created = h.b.declare_queue(f"q{key}", arguments={key: value})
        assert created and q.arguments == {key: value}
        assert h.b.declare_queue(f"q{key}", arguments={key: value})[1] is False
        with pytest.raises(PreconditionFailed):
            h.b.declare_queue(f"q{key}", arguments={})
    h.b.declare_queue("all", arguments=kept)
    assert h.b.queues["all"].arguments == kept


def test_queue_arguments_not_a_dict() -> None:
    h = Harness()
    with pytest.raises(InvalidArgument):
        h.b.declare_queue("q", arguments="x-max-length=1")  # type: ignore[arg-type]


def test_queue_limit() -> None:
    h = Harness(max_queues=2)
    h.queue("a")
    h.queue("b")
    with pytest.raises(Unavailable) as ei:
        h.queue("c")
    assert ei.value.code == "limit_reached"
    with pytest.raises(Unavailable):
        h.b.declare_queue("")
    assert set(h.b.queues) == {"a", "b"}
    h.queue("a")  # redeclare ok
    h.b.delete_queue("a")
    h.queue("c")


# --------------------------------------------------------------- exclusive


def test_exclusive_queue_locked_to_its_channel() -> None:
    h = Harness()
    owner = h.channel()
    other = h.channel()
    q, _ = h.b.declare_queue("ex", exclusive=True, durable=False, channel_id=owner)
    assert q.exclusive_owner == owner
    assert h.b.declare_queue("ex", exclusive=True, durable=False, channel_id=owner)[1] is False
    with pytest.raises(ResourceLocked):
        h.b.declare_queue("ex", exclusive=True, durable=False, channel_id=other)
    with pytest.raises(ResourceLocked):
        h.b.declare_queue("ex", passive=True, channel_id=other)
    with pytest.raises(ResourceLocked):
        h.b.consume(other, "ex")
    with pytest.raises(ResourceLocked):
        h.b.bind("amq.direct", "ex", "k", channel_id=other)
    with pytest.raises(ResourceLocked):
        h.b.delete_queue("ex", channel_id=other)
    with pytest.raises(ResourceLocked):
        h.b.purge_queue("ex", channel_id=other)
    with pytest.raises(ResourceLocked):
        h.b.get("ex")  # REST is another channel too
    # but anyone may publish to it
    h.b.publish(other, "", "ex", b"m")
    h.sync()
    assert h.info("ex")["messages_ready"] == 1
    h.b.consume(owner, "ex")
    assert len(h.delivers(h.step(), owner)) == 1


def test_exclusive_queue_deleted_on_channel_close() -> None:
    h = Harness()
    owner = h.channel()
    h.b.declare_queue("ex", exclusive=True, channel_id=owner)
    h.b.declare_queue("", exclusive=True, channel_id=owner)
    h.b.bind("amq.fanout", "ex", channel_id=owner)
    assert len(h.b.queues) == 2
    h.b.close_channel(owner)
    assert h.b.queues == {}
    assert h.b.exchanges["amq.fanout"].table.bindings == {}
    other = h.channel()
    h.b.declare_queue("ex", exclusive=True, channel_id=other)  # name is free again


def test_exclusive_queue_needs_an_open_channel() -> None:
    h = Harness()
    with pytest.raises(InvalidArgument):
        h.b.declare_queue("ex", exclusive=True)  # REST channel
    with pytest.raises(ChannelError):
        h.b.declare_queue("ex", exclusive=True, channel_id=42)  # never opened
    ch = h.channel()
    h.b.close_channel(ch)
    with pytest.raises(ChannelError):
        h.b.declare_queue("ex", exclusive=True, channel_id=ch)
    assert h.b.queues == {}
    assert h.step() == []


def test_exclusive_durable_queue_is_not_logged() -> None:
    h = Harness()
    ch = h.channel()
    h.b.declare_queue("ex", exclusive=True, durable=True, channel_id=ch)
    h.b.publish(ch, "", "ex", b"m")
    h.sync()
    assert h.records == []
    assert h.acked(ch, 1)


# ----------------------------------------------------------- auto-delete


def test_auto_delete_queue_after_last_consumer_cancels() -> None:
    h = Harness()
    h.queue("ad", auto_delete=True)
    assert "ad" in h.b.queues  # never consumed: stays
    c1 = h.channel()
    c2 = h.channel()
    t1 = h.b.consume(c1, "ad")
    t2 = h.b.consume(c2, "ad")
    h.b.cancel(c1, t1)
    assert "ad" in h.b.queues
    h.b.cancel(c2, t2)
    assert "ad" not in h.b.queues


def test_auto_delete_queue_after_last_consumer_channel_closes() -> None:
    h = Harness()
    h.queue("ad", auto_delete=True)
    h.b.bind("amq.direct", "ad", "k")
    ch = h.channel()
    h.b.consume(ch, "ad")
    h.b.close_channel(ch)
    assert "ad" not in h.b.queues
    assert h.b.list_bindings() == []


# ------------------------------------------------------------------ delete


def test_delete_queue_if_unused_if_empty() -> None:
    h = Harness()
    h.queue("q")
    ch = h.channel()
    tag = h.b.consume(ch, "q")
    with pytest.raises(PreconditionFailed):
        h.b.delete_queue("q", if_unused=True)
    h.b.cancel(ch, tag)
    h.b.publish(ch, "", "q", b"m")
    h.step()
    with pytest.raises(PreconditionFailed):
        h.b.delete_queue("q", if_empty=True)
    assert h.b.delete_queue("q", if_unused=True) == 1
    with pytest.raises(NotFound):
        h.b.delete_queue("q")


def test_delete_queue_cancels_consumers_and_unbinds() -> None:
    h = Harness()
    h.queue("q")
    h.b.bind("amq.topic", "q", "#")
    ch = h.channel()
    tag = h.b.consume(ch, "q")
    h.b.publish(ch, "", "q", b"1")
    h.b.publish(ch, "", "q", b"2")
    d = h.delivers(h.step())
    assert len(d) == 2
    h.b.publish(ch, "", "q", b"3")
    count = h.b.delete_queue("q")
    effects = h.step()
    cancelled = h.of_type(ConsumerCancelled, effects)
    assert [(c.channel_id, c.consumer_tag) for c in cancelled] == [(ch, tag)]
    assert count in (0, 1)
    assert tag not in h.b.channels[ch].consumers
    assert h.b.list_bindings() == []
    # unacked deliveries of a deleted queue can still be settled; nothing comes back
    h.b.ack(ch, d[0].delivery_tag)
    h.b.nack(ch, d[1].delivery_tag, requeue=True)
    h.step()
    h.queue("q")
    assert h.info("q")["messages"] == 0
    assert h.b.channels[ch].unacked == 0


def test_purge_keeps_unacked() -> None:
    h = Harness()
    h.queue("q")
    ch = h.channel()
    for i in range(4):
        h.b.publish(ch, "", "q", bytes([i]))
    h.b.consume(ch, "q", prefetch=1)
    h.step()
    assert h.b.purge_queue("q") == 3
    assert h.info("q")["messages_ready"] == 0
    assert h.info("q")["messages_unacked"] == 1


def test_storage_failure_blocks_durable_declares_only() -> None:
    h = Harness()
    h.b.storage_failed(1, 1, "disk full")
    with pytest.raises(Unavailable):
        h.b.declare_queue("d")
    with pytest.raises(Unavailable):
        h.b.declare_exchange("dx")
    h.b.declare_queue("t", durable=False)
    h.b.declare_exchange("tx", durable=False)
    ch = h.channel()
    h.b.declare_queue("ex", exclusive=True, channel_id=ch)
    h.b.storage_recovered()
    h.b.declare_queue("d")


def test_views_hand_out_copies_of_arguments() -> None:
    """A view's dicts are the caller's to change (a listing filters or reshapes them):
    a queue's or an exchange's arguments read through the views are copies, so a
    caller writing into them changes neither the entity nor its next redeclare."""
    h = Harness()
    h.b.declare_queue("q", arguments={"x-max-length": 5})
    h.b.declare_exchange("x", "topic", arguments={"alternate-exchange": "y"})
    for info in (h.b.views.queue_info("q"), *h.b.views.queue_infos()):
        assert info is not None
        info["arguments"]["x-max-length"] = {"changed": True}
    for info in (h.b.views.exchange_info("x"), *h.b.views.exchange_infos()):
        assert info is not None
        info["arguments"]["alternate-exchange"] = "changed"
    assert h.b.views.queue_info("q")["arguments"] == {"x-max-length": 5}  # type: ignore[index]
    assert h.b.views.exchange_info("x")["arguments"] == {"alternate-exchange": "y"}  # type: ignore[index]
    h.b.declare_queue("q", arguments={"x-max-length": 5})  # still equal: no refusal
    h.b.declare_exchange("x", "topic", arguments={"alternate-exchange": "y"})
