"""A channel's received chunks through its compiled per-chunk path
(``broker/api/channel/chunk.py``: lines split, decoded at once, runs of publishes and
acks applied through ``broker/runtime/channelops.py`` into a real core), printing
what each block did, every error (code, message, the op's echoed id) and every
effect, as one line of text each.

The blocks are a seeded mix of what clients send: publishes to queues, a fan-out, the
``amq.default`` alias, a refused exchange and nowhere; text and base64 bodies (some
invalid, some too long); properties, headers, delays (some out of range),
deadlines, direct reply-to's ``reply_to`` and replies to the channel's own address; acks of delivered tags one by one, ``multiple``, as ``delivery_tags``,
and unknown; other ops, blank and non-ASCII lines (left to the general path, which
this scenario only names; some deliveries are nacked and redelivered as that path
would). Each block's events for the channel are then encoded as its outbox would be
(``broker/api/channel/outbox.py``), with and without ``deliveries`` batches, and the
bytes printed. ``python -m tests.compiled.channel_scenario SEED COUNT``
runs it in whichever build is imported; ``tests/compiled/test_builds_agree.py`` runs
it under both and requires the same output. ``--measure``: nothing printed, the
publishes and acks only (for timing the path).
"""

from __future__ import annotations

import base64
import random
import sys
from typing import Any

import orjson

from broker.api.channel.chunk import apply_typed, split_block
from broker.api.channel.opfields import echo_id
from broker.api.channel.outbox import encode_outbox
from broker.core import AccessRefused, Broker, Confirm, CoreConfig, ErrorReply
from broker.runtime.channelops import ChannelOps
from broker.runtime.confirms import PendingConfirms
from tests.compiled.core_scenario import _Clock, _describe


class _Access:
    username = "app"

    def require(self, operation: str, name: str = "", **_: Any) -> None:
        if name == "forbidden":
            raise AccessRefused(f"{operation} refused on {name!r}")


class _Flow:
    blocked = False


class _Options:
    max_body_bytes = 300


class _Runtime:
    def __init__(self) -> None:
        self.flow, self.options, self.cluster = _Flow(), _Options(), None


class _Session:
    """What the per-chunk path reads of a ServedChannel."""

    def __init__(self, core: Broker, book: PendingConfirms, channel_id: int) -> None:
        self.runtime = _Runtime()
        self.channel_id = channel_id
        self.channel_ops = ChannelOps(core, book, channel_id)
        self.gateway = None  # (a single node: publishes go through channel_ops)
        self.access = _Access()
        self.relayed = None
        self.entry_checked = False
        self.current_op: dict[str, Any] | None = None


def _publish(rng: random.Random, n: int, address: str) -> dict[str, Any]:
    op: dict[str, Any] = {"op": "publish"}
    exchange, key = rng.choice([("", "q1"), ("", "q2"), ("fan", ""), ("amq.default", "q1"), ("", "nowhere"),
                                ("", address)]
                               if rng.random() < 0.97 else [("forbidden", "q1")])
    if exchange or rng.random() < 0.3:
        op["exchange"] = exchange
    op["routing_key"] = key
    body = "b" * (rng.choice([0, 1, 10, 100, 300]) if rng.random() < 0.98 else 301)
    if rng.random() < 0.2:
        raw = body.encode() if rng.random() < 0.7 else b"\xff\xfe" + body.encode()  # (not UTF-8)
        op["body_b64"] = base64.b64encode(raw).decode() if rng.random() < 0.9 else "!!"  # (1 in 50)
    else:
        op["body"] = body
    if rng.random() < 0.5:
        props: dict[str, Any] = {"delivery_mode": rng.choice([1, 2]), "message_id": f"m-{rng.randrange(n + 1)}"}
        if rng.random() < 0.1:
            props["headers"] = {"h": 1}
        if rng.random() < 0.1:
            props["priority"] = rng.randrange(10)
        if rng.random() < 0.05:  # (the channel's user, or another: an error)
            props["user_id"] = rng.choice(["app", "app", "app", "mallory"])
        if rng.random() < 0.1:  # (direct reply-to's leaves the typed path; the others stay)
            props["reply_to"] = rng.choice(["amq.rabbitmq.reply-to", "replies", address])
        op["properties"] = props
    if rng.random() < 0.1:
        op["mandatory"] = True
    if rng.random() < 0.05:
        op["delay_s"] = rng.choice([0, 1.5, 1.5, 1.5, -1])
    if rng.random() < 0.03:
        op["deadline_ms"] = 1000
    if rng.random() < 0.3:
        op["id"] = rng.choice([n, f"p-{n}", None])
    return op


def _line(rng: random.Random, n: int, delivered: list[int], address: str) -> bytes:
    kind = rng.random()
    if kind < 0.6 or (kind < 0.85 and not delivered and rng.random() < 0.9):
        return orjson.dumps(_publish(rng, n, address))
    if kind < 0.85:
        choice = rng.random()
        if delivered and choice < 0.6:
            return orjson.dumps({"op": "ack", "delivery_tag": delivered.pop(rng.randrange(len(delivered)))})
        if delivered and choice < 0.7:
            tag = delivered[rng.randrange(len(delivered))]
            delivered[:] = [t for t in delivered if t > tag]
            return orjson.dumps({"op": "ack", "delivery_tag": tag, "multiple": True})
        if delivered and choice < 0.97:
            tags = delivered[: rng.randrange(1, 4)]
            del delivered[: len(tags)]
            return orjson.dumps({"op": "ack", "delivery_tags": tags})
        return orjson.dumps({"op": "ack", "delivery_tag": 10_000 + n})  # unknown: a channel error
    return rng.choice([b"", b"  ", b'{"op":"qos","prefetch_count":50}', b'{"op":"publish","body":"\xc3\xa9"}',
                       b'{"op":"ack","delivery_tag":1,"requeue":true}'])


def run(seed: int, count: int, out: Any) -> None:
    """``count`` blocks on one channel that publishes and consumes (``out`` None:
    nothing described)."""
    rng = random.Random(seed)

    def say(value: Any) -> None:
        if out is not None:
            out(value if isinstance(value, str) else _describe(value))

    mono, wall = _Clock(1000.0), _Clock(1_700_000_000.0)
    core = Broker(clock=mono, wall_clock=wall, boot_id="b0", config=CoreConfig(queue_memory_messages=64))
    book = PendingConfirms()
    cid = core.open_channel()
    core.declare_queue("q1")
    core.declare_queue("q2", durable=False)
    core.declare_exchange("fan", "fanout")
    core.bind("fan", "q1")
    core.consume(cid, "q1", consumer_tag="c1", prefetch=50)
    # direct reply-to: the channel's reply consumer, an HTTP channel's (replies take tags)
    address = core.reply_consume(cid, "r1", no_ack=True, secret="s3cret", own_tags=True)
    s = _Session(core, book, cid)
    delivered: list[int] = []
    for n in range(count):
        block = b"\n".join(_line(rng, n, delivered, address) for _ in range(rng.randrange(1, 9)))
        s.runtime.flow.blocked = rng.random() < 0.02
        lines, ops = split_block(block)
        say(f"block {n}: {len(lines)} lines, decoded {'at once' if ops is not None else 'line by line'}")
        try:
            i = apply_typed(s, lines, ops, 0)
            while i < len(lines):
                say(f"general path: {lines[i]!r}")
                i = apply_typed(s, lines, ops, i + 1)
        except ErrorReply as exc:
            say(f"error {exc.code}: {exc}; echoes {echo_id(s.current_op) if s.current_op else None}")
            s.current_op = None
        if delivered and rng.random() < 0.1:  # as the general path's nack would (redelivered)
            core.nack(cid, delivered.pop(rng.randrange(len(delivered))), False, True)
        if rng.random() < 0.5:
            core.durable(core.last_lsn)
        outbox: list[Any] = [{"ev": "ok", "id": n}] if rng.random() < 0.2 else []
        for effect in core.take_effects():
            if type(effect).__name__ == "Deliver" and effect.consumer_tag != "r1":  # (a reply: no ack)
                delivered.append(effect.delivery_tag)
            elif isinstance(effect, Confirm):
                book.confirmed(effect)
                say(f"unconfirmed bytes {book.unconfirmed_bytes(cid)}")
            if getattr(effect, "channel_id", None) == cid:
                outbox.append(effect)
            say(effect)
        if outbox:
            data, credit = encode_outbox(outbox, n % 2 == 0)
            say(f"outbox: {credit} credit, {data!r}")
    say(core.views.queue_info("q1"))


def main() -> None:
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    run(seed, count, None if "--measure" in sys.argv else print)


if __name__ == "__main__":
    main()
