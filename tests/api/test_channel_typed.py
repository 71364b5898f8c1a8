"""The channel's typed fast path (``broker/api/channel/typed.py``, applied per chunk by
``broker/api/channel/chunk.py``) against the general path: for any op line, and any
block of lines, applying it as the reader does (runs of typed ops in one call, the
other lines through the general path) does exactly what the general path alone does,
line by line: the same publishes and acks handed to the core, or the same error
(code, message) naming the same op."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from broker.api.channel import chunk, reader
from broker.api.channel.opfields import echo_id
from broker.api.channel.typed import AckOp, PublishOp, decode_hot
from broker.api.codec import parse_op_line
from broker.core import AccessRefused, ErrorReply


class _Access:
    username = "app"  # (a publish's user_id must be it)

    def require(self, operation: str, name: str = "", **_: Any) -> None:
        if name == "forbidden":
            raise AccessRefused(f"{operation} on {name!r} refused")


class _Core:
    def __init__(self, calls: list[Any]) -> None:
        self.calls = calls

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


@dataclass
class _Session:
    """What the reader's publish and ack touch of a ServedChannel, recorded."""

    calls: list[Any] = field(default_factory=list)
    channel_id: int = 7
    current_op: Any = None
    relayed: Any = None
    forwarded: bool = False  # (a client's channel, not a peer's forwarding one)
    entry_checked: bool = False
    access: _Access = field(default_factory=_Access)

    def __post_init__(self) -> None:
        session = self

        class Options:
            max_body_bytes = 300

        class Flow:
            blocked = False

        class Runtime:
            options = Options()
            flow = Flow()
            cluster = None

        class Batch:
            def run(self, command: Any) -> Any:
                return command(_Core(session.calls))

            def flush(self) -> None:
                pass

        class Gateway:
            def publish(self, *args: Any, **kwargs: Any) -> None:
                session.calls.append(("publish", args, kwargs))

        class ChannelOps:  # records as the gateway's publish and the core's ack do
            def publish(self, exchange: str, routing_key: str, body: bytes, properties: Any, mandatory: bool,
                        delay_s: Any, charge: int, dedup: bool = True) -> None:
                session.calls.append(("publish", (session.channel_id, exchange, routing_key, body, properties),
                                      {"mandatory": mandatory, "delay_s": delay_s, "charge": charge, "dedup": dedup}))

            def ack(self, tag: Any, multiple: bool) -> None:
                session.calls.append(("ack", (session.channel_id, tag, multiple), {}))

            def ack_each(self, tags: list[int]) -> None:
                for tag in tags:
                    self.ack(tag, False)

        class Views:  # direct reply-to: the channel's reply address (a reply consumer)
            def reply_address(self, channel_id: int) -> str:
                return f"amq.rabbitmq.reply-to.s3cret.{channel_id}"

        self.runtime, self.batch, self.gateway = Runtime(), Batch(), Gateway()
        self.channel_ops = ChannelOps()
        self.views = Views()


def _drive(coro: Any) -> None:
    try:
        coro.send(None)
    except StopIteration:
        return
    raise AssertionError("the op waited")  # publish and ack never wait


def _general(s: Any, line: bytes) -> None:
    op = parse_op_line(line)
    if op.get("op") == "publish":
        s.current_op = op
        reader.publish(s, op)
        s.current_op = None
    else:
        _drive(reader.apply(s, op))


def _fast(s: Any, block: bytes) -> None:
    """As the reader applies a block: runs of typed ops in one call, the rest general."""
    lines, ops = chunk.split_block(block)
    i = chunk.apply_typed(s, lines, ops, 0)
    while i < len(lines):
        _general(s, lines[i])
        i = chunk.apply_typed(s, lines, ops, i + 1)


def _general_lines(s: Any, block: bytes) -> None:
    for line in block.split(b"\n"):
        if line and not line.isspace():
            _general(s, line)


def _outcome(path: Any, line: bytes) -> tuple[Any, ...]:
    s = _Session()
    s.current_op = {"op": "consume", "id": "previous"}
    try:
        path(s, line)
    except ErrorReply as exc:
        return ("error", exc.code, str(exc), _echoed(s), s.calls)
    # what a later error outside any op (a line too long) would echo
    return ("ok", s.calls, _echoed(s))


def _echoed(s: _Session) -> tuple[bool, Any]:
    return echo_id(s.current_op) if s.current_op is not None else (False, None)


def _same(line: bytes) -> None:
    assert _outcome(_fast, line) == _outcome(_general, line), line


def _same_block(block: bytes) -> None:
    assert _outcome(_fast, block) == _outcome(_general_lines, block), block


_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 255, 256, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64, -1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8), st.sampled_from([254, 255, 256]).map(lambda n: "a" * n),
    st.sampled_from(["é", "\u2028", "a\\b", "\"", "", "forbidden", "app", "amq.default", "aGVsbG8=", "!!",
                     "amq.rabbitmq.reply-to"]),
)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
_property_names = st.sampled_from([
    "content_type", "message_id", "user_id", "cluster_id", "headers", "delivery_mode", "priority",
    "expiration", "timestamp", "bogus", "reply_to",
])
_properties = st.one_of(_json, st.dictionaries(_property_names, _json, max_size=4))
_publish_fields = {
    "exchange": _json, "routing_key": _json, "body": _json, "body_b64": _json, "properties": _properties,
    "mandatory": _json, "delay_s": _json, "id": _json, "multiple": _json, "routng_key": _json, "deadline_ms": _json,
    "dedup": _json,
}
_tag_lists = st.lists(st.one_of(st.integers(min_value=-5, max_value=2**64 + 1), _scalars), max_size=4)
_ack_fields = {
    "delivery_tag": _json, "multiple": _json, "id": _json, "requeue": _json,
    "delivery_tags": st.one_of(_tag_lists, _json),
}


@st.composite
def _ops(draw: Any) -> bytes:
    name = draw(st.sampled_from(["publish", "publish", "ack", "ack", "nack", 5, None]))
    fields = _publish_fields if name != "ack" else _ack_fields
    op: dict[str, Any] = {} if name is None else {"op": name}
    for key in draw(st.lists(st.sampled_from(sorted(fields)), max_size=5, unique=True)):
        op[key] = draw(fields[key])
    if draw(st.booleans()):
        return json.dumps(op, ensure_ascii=draw(st.booleans())).encode()
    try:
        return orjson.dumps(op)
    except TypeError:  # an integer over 64 bits
        return json.dumps(op).encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops())
@example(b'{"op":"publish","routing_key":"q","body":"x","properties":{"delivery_mode":2,"message_id":"m-1"},"id":"m-1"}')
@example(b'{"op":"publish","routing_key":"q","body":"x","properties":{"user_id":"app"}}')
@example(b'{"op":"publish","routing_key":"q","body":"x","properties":{"user_id":"mallory"},"id":1}')
@example(b'{"op":"ack","delivery_tag":3}')
@example(b'{"op":"ack","delivery_tag":3,"multiple":true}')
@example(b'{"op":"ack","delivery_tag":18446744073709551616}')
@example(b'{"op":"ack","delivery_tags":[1,2,5]}')
@example(b'{"op":"ack","delivery_tags":[]}')
@example(b'{"op":"ack","delivery_tags":null}')
@example(b'{"op":"ack","delivery_tags":[1,true]}')
@example(b'{"op":"ack","delivery_tags":[1],"delivery_tag":null}')
@example(b'{"op":"ack","delivery_tags":[1],"multiple":false}')
@example(b'{"op":"ack","delivery_tags":[9223372036854775808]}')
@example(b'{"op":"ack","delivery_tag":1,"op":"publish"}')
@example(b'{"op":"publish","properties":{"message_id":"\\u00e9' + b"a" * 254 + b'"}}')
@example(b'{"op":"publish","properties":{"message_id":"' + b"a" * 255 + b'"}}')
@example(b'{"op":"publish","properties":{"message_id":"' + b"a" * 256 + b'"}}')
@example(b'{"op":"publish","properties":{"priority":true}}')
@example(b'{"op":"publish","properties":{"delivery_mode":2.0}}')
@example(b'{"op":"publish","delay_s":-1}')
@example(b'{"op":"publish","delay_s":1e400}')
@example(b'{"op":"publish","body":"' + b"x" * 301 + b'"}')
@example(b'{"op":"publish","body_b64":"!!"}')
@example(b'{"op":"publish","exchange":"forbidden","body_b64":"!!"}')
@example(b'{"op":"publish","id":' + b"[" * 1100 + b"]" * 1100 + b"}")
@example(b'{"op":"publish","properties":{"headers":{"a":' + b"[" * 40 + b"]" * 40 + b"}}}")
@example(b'{"op":"publish","body":"\\ud800"}')
@example(b'{"op":"publish"} x')
@example(b'{"op":"publish","routing_key":"q","properties":{"message_id":"m"},"dedup":false}')
@example(b'{"op":"publish","dedup":true}')
@example(b'{"op":"publish","dedup":"no"}')
@example(b'{"op":"publish","dedup":0}')
@example(b'{"op":"publish","dedup":null}')
@example(b'{"op":"publish","routing_key":"q","properties":{"reply_to":"amq.rabbitmq.reply-to"}}')
@example(b'{"op":"publish","routing_key":"q","properties":{"reply_to":"amq.rabbitmq.reply-to.x"}}')
def test_fast_path_does_what_the_general_path_does(line: bytes) -> None:
    _same(line)


_BOUNDARIES = [
    ("expiration", 2**32 - 1), ("expiration", 2**32), ("timestamp", 2**63 - 1), ("timestamp", 2**63),
    ("priority", 255), ("priority", 256), ("priority", -1), ("delivery_mode", 1), ("delivery_mode", 3),
    ("delivery_mode", True), ("expiration", "1000"), ("content_type", None),
]


@pytest.mark.parametrize("name, value", _BOUNDARIES)
def test_property_boundaries(name: str, value: Any) -> None:
    _same(json.dumps({"op": "publish", "routing_key": "q", "properties": {name: value}}).encode())


@pytest.mark.parametrize("tag", [0, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, None, "1", 1.0])
def test_delivery_tag_boundaries(tag: Any) -> None:
    _same(json.dumps({"op": "ack", "delivery_tag": tag}).encode())
    _same(json.dumps({"op": "publish", "delay_s": tag}).encode())


@pytest.mark.parametrize("line, kind", [
    (b'{"op":"publish","routing_key":"q","body":"x","properties":{"delivery_mode":2,"message_id":"m"},"id":"m"}', PublishOp),
    (b'{"op":"publish","routing_key":"q","body":"x","properties":{"message_id":"m"},"dedup":false}', PublishOp),
    (b'{"op":"ack","delivery_tag":3,"multiple":true}', AckOp),
    (b'{"op":"ack","delivery_tags":[3,5,9]}', AckOp),
])
def test_the_hot_ops_take_the_fast_path(line: bytes, kind: type) -> None:
    """The lines the client sends most are decoded typed (else the fast path would be
    dead code that the differential test above could not tell from none)."""
    assert type(decode_hot(line)) is kind
    s = _Session()
    lines, ops = chunk.split_block(line + b"\n" + line)
    assert ops is not None and [type(op) for op in ops] == [kind, kind]  # one decode for the block
    assert chunk.apply_typed(s, lines, ops, 0) == 2
    assert s.calls


def test_only_direct_reply_tos_reply_to_leaves_the_fast_path() -> None:
    """A publish's ``reply_to`` costs the typed path one comparison: any other value
    (none, a queue's name, a reply address) stays on it; exactly
    ``amq.rabbitmq.reply-to`` goes to the general path, which writes the channel's
    reply address in its place (replyto.py)."""
    stays = [
        b'{"op":"publish","routing_key":"q","properties":{"message_id":"m"}}',
        b'{"op":"publish","routing_key":"q","properties":{"reply_to":"replies"}}',
        b'{"op":"publish","routing_key":"q","properties":{"reply_to":"amq.rabbitmq.reply-to.s.1"}}',
    ]
    leaves = b'{"op":"publish","routing_key":"q","properties":{"reply_to":"amq.rabbitmq.reply-to"}}'
    s = _Session()
    lines, ops = chunk.split_block(b"\n".join([*stays, leaves]))
    assert ops is not None
    assert chunk.apply_typed(s, lines, ops, 0) == len(stays)
    assert [call[1][4] for call in s.calls] == [
        {"message_id": "m"}, {"reply_to": "replies"}, {"reply_to": "amq.rabbitmq.reply-to.s.1"}]
    _general(s, lines[-1])
    assert s.calls[-1][1][4] == {"reply_to": "amq.rabbitmq.reply-to.s3cret.7"}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_ops(), st.sampled_from([
    b'{"op":"publish","routing_key":"q","body":"x"}', b'{"op":"ack","delivery_tag":3}',
    b'{"op":"ack","delivery_tags":[1,2]}', b"", b"  ", b"\x0b", b'{"op":"qos","prefetch_count":1}',
])), min_size=1, max_size=6))
@example([b'{"op":"publish","body":"a"}', b"", b'{"op":"ack","delivery_tag":1}', b'{"op":"publish","body":"b"}'])
@example([b'{"op":"publish","body":"a"}', b'{"op":"publish","exchange":"forbidden"}', b'{"op":"publish"}'])
@example([b'{"op":"publish","body":"a"}', b'{"op":"publish","properties":{"headers":{}}}', b'{"op":"publish"}'])
@example([b'{"op":"publish","body":"a"}', b"\x0b", b'{"op":"publish","body":"\\u00e9"}'])
@example([b'{"op":"ack","delivery_tag":1}', b'{"op":"qos","prefetch_count":1}', b'{"op":"ack","delivery_tag":2}'])
def test_a_block_does_what_its_lines_do_one_by_one(lines: list[bytes]) -> None:
    """A chunk's block decoded at once (or, when any line is not a typed op, line by
    line) and applied in runs does what applying its lines one by one does."""
    _same_block(b"\n".join(lines))
