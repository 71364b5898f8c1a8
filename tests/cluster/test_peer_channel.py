"""The forwarding channel's confirms, without sockets: a copy the owner routes to none
of its queues (a quorum queue's leadership moved, or the queue was deleted, since this
node routed the publish) must not be confirmed to the publisher as taken."""

from __future__ import annotations

import h11
import orjson
import trio
import trio.testing

from broker.cluster.peers import PeerChannel, _publish_line


def _chunked_answer(*events: dict[str, object]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/x-ndjson\r\n\r\n"
    body = b"".join(orjson.dumps(ev) + b"\n" for ev in events)
    return head + b"%x\r\n" % len(body) + body + b"\r\n"


async def _settled_after(*events: dict[str, object]) -> list[tuple[bool, str | None]]:
    channel = PeerChannel("a", "http://127.0.0.1:1", origin="b", secret=None)
    results: list[tuple[bool, str | None]] = []
    for _ in range(3):
        channel._waiting.append(lambda ok, reason: results.append((ok, reason)))
        channel._waiting_since.append(0.0)
    client, server = trio.testing.memory_stream_pair()
    conn = h11.Connection(h11.CLIENT)
    await client.send_all(conn.send(h11.Request(method="POST", target="/channel", headers=[("Host", "a"), ("Transfer-Encoding", "chunked")])) or b"")
    await server.send_all(_chunked_answer(*events))
    with trio.move_on_after(1):
        await channel._read(conn, client)
    return results


def test_forwarded_publishes_are_mandatory() -> None:
    assert orjson.loads(_publish_line("x", "k", b"b", None, None))["mandatory"] is True


async def test_a_copy_the_owner_routed_nowhere_is_a_nack() -> None:
    results = await _settled_after(
        {"ev": "ack", "delivery_tag": 1, "multiple": False},
        {"ev": "return", "delivery_tag": 2, "reply_code": 312, "reason": "NO_ROUTE"},
        {"ev": "ack", "delivery_tag": 3, "multiple": True},
    )
    assert [ok for ok, _reason in results] == [True, False, True]
    assert "routed it to none of its queues" in (results[1][1] or "")


async def test_without_returns_every_ack_confirms() -> None:
    results = await _settled_after({"ev": "ack", "delivery_tag": 3, "multiple": True})
    assert results == [(True, None)] * 3
