"""Fuzzing the broker's edges: no single request may crash it, hang it, answer 5xx, or
change anything when it is refused; and what it accepted survives a kill -9.

One real broker (a subprocess) takes every case of a test, so state carries from case
to case as it would in production. After each case: the broker answers ``/healthz``,
no answer is a 5xx (503 aside: "not now", e.g. a limit), and a refused request (4xx)
left exchanges, queues, bindings and queue depths exactly as they were. At the end the
broker is killed with SIGKILL and restarted, and must come back with what it had.

Hypothesis drives the cases; they are seeded (``derandomize``) so a run is
reproducible, and ``ACKBUS_FUZZ_EXAMPLES`` sets how many (``scripts/test`` runs a
few hundred; ``scripts/fuzz`` runs as many as asked).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.broker import BrokerProcess

EXAMPLES = int(os.environ.get("ACKBUS_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

NAMES = st.sampled_from(["q", "x", "amq.direct", "amq.default", "", "a%2Fb", "%", "%zz", "é", "q" * 300, "a.b.c"])
METHODS = st.sampled_from(["GET", "PUT", "POST", "DELETE", "HEAD", "OPTIONS", "PATCH"])
PATHS = st.sampled_from(
    [
        "/healthz",
        "/overview",
        "/exchanges",
        "/exchanges/{n}",
        "/exchanges/{n}/publish",
        "/queues",
        "/queues/{n}",
        "/queues/{n}/purge",
        "/queues/{n}/get",
        "/queues/{n}/ack",
        "/queues/{n}/nack",
        "/queues/{n}/extend",
        "/queues/{n}/stream",
        "/queues/{n}/messages",
        "/queues/{n}/redrive",
        "/bindings",
        "/metrics",
        "/locks",
        "/locks/{n}",
        "/locks/{n}/acquire",
        "/locks/{n}/refresh",
        "/locks/{n}/release",
        "/schedules",
        "/schedules/{n}",
        "/schedules/{n}/pause",
        "/schedules/{n}/resume",
        "/users",
        "/users/{n}",
        "/users/{n}/permissions",
        "/users/{n}/tokens",
        "/tokens/{n}",
        "/whoami",
        "/channels",
        "/channels/{n}",
        "/ui/",
        "/ui/{n}",
        "/nowhere",
    ]
)
QUERY_KEYS = st.sampled_from(
    ["routing_key", "mandatory", "max", "wait", "lease", "prefetch", "ack", "if_unused", "x", "delay", "limit", "after"]
)
QUERY_VALUES = st.one_of(
    st.sampled_from(["0", "1", "-1", "true", "nan", "inf", "1e400", "9" * 30, "", "%", "%zz", "a.b"]),
    st.text(max_size=20),
)


def _deep(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    ["type", "durable", "auto_delete", "exclusive", "arguments", "exchange", "queue", "routing_key",
     "to_exchange", "lease_ids", "requeue", "lease", "passive", "internal", "x-unknown", "delay_s", "count",
     # locks, schedules, users. Never "password" (a user would switch authentication
     # on for every later case), "wait_s" (an acquire could wait as long as asked) or a
     # schedule's timing (its ticks would change queue depths between two cases).
     "owner", "ttl_s", "token", "timezone", "missed", "max_missed", "body", "tags", "permissions"]
)
BODIES = st.one_of(
    st.none(),
    st.dictionaries(FIELDS, JSON_VALUES, max_size=5),
    st.builds(lambda d: {"arguments": {"d": _deep(d)}}, st.integers(min_value=1, max_value=400)),
    st.builds(
        lambda k, v: {"arguments": {k: v}},
        st.sampled_from(["x-dead-letter-exchange", "x-dead-letter-routing-key", "x-delivery-limit", "x-expires",
                         "x-max-length-bytes", "x-overflow", "alternate-exchange", "x-max-lenght", "x-delayed-type",
                         "x-queue-mode", "x-queue-version", "x-queue-master-locator", "x-dead-letter-strategy"]),
        JSON_VALUES,
    ),
    st.binary(max_size=64),
)
HEADERS = st.dictionaries(
    st.sampled_from(["X-Timestamp", "X-Expiration", "X-Priority", "X-Delivery-Mode", "X-Message-Id",
                     "Content-Type", "X-Header-a", "Expect", "X-Header-X-Delay", "X-Header-CC"]),
    QUERY_VALUES,
    max_size=3,
)


def _target(path: str, name: str, query: list[tuple[str, str]]) -> str:
    from urllib.parse import quote

    target = path.replace("{n}", name if "%" in name else quote(name, safe=""))
    if query:
        target += "?" + "&".join(f"{quote(k)}={quote(v, safe='%')}" for k, v in query)
    return target


def _state(broker: BrokerProcess) -> Any:
    """What a refused request must not change."""
    out = {}
    for what in ("exchanges", "queues", "bindings"):
        status, body = broker.request("GET", f"/{what}")
        assert status == 200, (what, status, body)
        items = body[what]
        if what == "queues":
            items = [{k: q.get(k) for k in ("name", "messages_ready", "messages_unacked", "arguments", "durable")} for q in items]
        elif what == "exchanges":
            # message counters count since start: not part of what a restart keeps
            items = [{k: v for k, v in x.items() if k != "message_stats"} for x in items]
        out[what] = sorted(json.dumps(i, sort_keys=True) for i in items)
    return out


def _send(broker: BrokerProcess, method: str, target: str, body: Any, headers: dict[str, str]) -> int:
    raw: bytes | None
    if body is None or isinstance(body, bytes):
        raw = body
    else:
        raw = json.dumps(body).encode()
    status, _ = broker.request(method, target, raw, headers=headers, timeout_s=30)
    return status


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(Path(tmp_path_factory.mktemp("fuzz")) / "data", args=("--max-wait-s", "0.2"))
    with proc:
        yield proc


@FUZZ
@given(method=METHODS, path=PATHS, name=NAMES, query=st.lists(st.tuples(QUERY_KEYS, QUERY_VALUES), max_size=3),
       body=BODIES, headers=HEADERS)
def test_a_single_request_never_hurts_the_broker(
    broker: BrokerProcess, method: str, path: str, name: str, query: list[tuple[str, str]],
    body: Any, headers: dict[str, str],
) -> None:
    if path.endswith("/stream") and method == "GET":
        return  # a stream does not end by itself: test_stream_query_strings_never_hurt_the_broker
    headers = {k: v for k, v in headers.items() if v.isascii() and "\n" not in v and "\r" not in v}
    before = _state(broker)
    status = _send(broker, method, _target(path, name, query), body, headers)
    assert status < 500 or status == 503, (method, path, name, query, body, headers, status)
    assert broker.request("GET", "/healthz")[0] == 200
    if 400 <= status < 500:
        assert _state(broker) == before, (method, path, name, query, body, status)


def _dechunk(response: bytes) -> bytes:
    """The body of an HTTP response, chunked or not (as far as it came)."""
    head, _sep, rest = response.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        return rest
    body = b""
    while rest:
        size_line, _sep, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body += rest[:size]
        rest = rest[size + 2 :]
    return body


def _open_stream(broker: BrokerProcess, target: str) -> int:
    """Send a streaming GET, read its status, and hang up (a stream does not end by itself)."""
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = b""
        while b"\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                break
            head += chunk
    return int(head.split(b" ", 2)[1])


@FUZZ
@given(name=NAMES, query=st.lists(st.tuples(QUERY_KEYS, QUERY_VALUES), max_size=4))
def test_stream_query_strings_never_hurt_the_broker(
    broker: BrokerProcess, name: str, query: list[tuple[str, str]]
) -> None:
    before = _state(broker)
    status = _open_stream(broker, _target("/queues/{n}/stream", name, query))
    assert status < 500 or status == 503, (name, query, status)
    assert broker.request("GET", "/healthz")[0] == 200
    if 400 <= status < 500:
        assert _state(broker) == before, (name, query, status)


@FUZZ
@given(ops=st.lists(st.dictionaries(
    st.sampled_from(["op", "id", "queue", "exchange", "routing_key", "body", "body_b64", "properties",
                     "mandatory", "prefetch", "consumer_tag", "delivery_tag", "multiple", "requeue",
                     "ack_timeout_ms", "no_ack", "arguments", "delay_s"]),
    st.one_of(st.sampled_from(["publish", "consume", "ack", "nack", "reject", "declare_queue", "bind", "qos",
                               "cancel", "close", "purge_queue", "nope"]), JSON_VALUES),
    max_size=6), min_size=1, max_size=4))
def test_channel_ops_never_hurt_the_broker(broker: BrokerProcess, ops: list[dict[str, Any]]) -> None:
    if any(op.get("op") == "consume" for op in ops):
        # A channel with consumers stays open when the request body ends (by design,
        # docs/protocol.md): close it, or it would deliver until the client leaves.
        ops = [*ops, {"op": "close"}]
    lines = b"".join(json.dumps(op).encode() + b"\n" for op in ops)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
        sock.sendall(
            b"POST /channel HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/x-ndjson\r\n"
            b"Content-Length: %d\r\n\r\n" % len(lines) + lines
        )
        data = b""
        while True:  # the channel ends: the body ended, a close, or an error event
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if data.endswith(b"0\r\n\r\n"):
                break
    assert data.startswith(b"HTTP/1.1 200") or data.startswith(b"HTTP/1.1 503"), data[:200]
    # (an op's id is echoed as given, so look at the events' error codes, not at bytes)
    events = [json.loads(line) for line in _dechunk(data).split(b"\n") if line]
    assert not [e for e in events if e.get("error") == "internal_error"], data[-500:]
    assert broker.request("GET", "/healthz")[0] == 200


@FUZZ
@given(raw=st.one_of(
    st.binary(max_size=200),
    st.builds(lambda m, t, h: f"{m} {t} HTTP/1.1\r\n{h}\r\n".encode("utf-8", "surrogatepass"),
              METHODS, st.text(max_size=40), st.text(max_size=60)),
))
def test_malformed_http_never_hurts_the_broker(broker: BrokerProcess, raw: bytes) -> None:
    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
        try:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
            response = sock.recv(65536)
        except OSError:
            response = b""
    if response:
        status = int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0
        assert status < 500 or status in (501, 503), response[:200]
    assert broker.request("GET", "/healthz")[0] == 200


def test_after_the_fuzzing_a_kill_9_loses_nothing(broker: BrokerProcess) -> None:
    """Runs after the tests above (same module-scoped broker): whatever state they
    left, a crash and a restart bring it back."""
    assert broker.request("PUT", "/queues/fuzz-survivor", {})[0] in (200, 201)
    for i in range(5):
        status, _ = broker.request(
            "POST", "/exchanges/amq.default/publish?routing_key=fuzz-survivor", f"m{i}".encode()
        )
        assert status == 200
    before = _state(broker)
    broker.kill()
    broker.start()
    after = _state(broker)
    # every durable entity is back (transient messages may not be: they are not kept)
    assert _durable_queues(before) == _durable_queues(after)
    assert [e for e in before["exchanges"] if '"durable": true' in e] == [
        e for e in after["exchanges"] if '"durable": true' in e
    ]
    status, info = broker.request("GET", "/queues/fuzz-survivor")
    assert status == 200 and info["messages_ready"] == 5


def _durable_queues(state: Any) -> set[str]:
    return {json.loads(item)["name"] for item in state["queues"] if json.loads(item)["durable"]}
