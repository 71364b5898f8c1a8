"""The forwarding channel: its confirms, without sockets (a copy the owner routes to
none of its queues, a quorum queue's leadership moved or the queue deleted since this
node routed the publish, must not be confirmed to the publisher as taken); and its
end when the owner's connection is reset (a loopback socket): only the channel ends."""

from __future__ import annotations

import socket
import struct

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


def test_a_publish_without_dedup_says_so_and_only_then() -> None:
    """The owner reads the channel op's ``dedup`` flag (absent: true, old nodes' lines)."""
    assert "dedup" not in orjson.loads(_publish_line("x", "k", b"b", {"message_id": "m"}, None))
    assert orjson.loads(_publish_line("x", "k", b"b", {"message_id": "m"}, None, False))["dedup"] is False


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


async def _owner_that_resets(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A node killed (-9) with bytes unread: the kernel ends its connections with a
    reset (RST), so the forwarding node's read fails with ECONNRESET, not an end."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    async with listener:
        task_status.started(listener.socket.getsockname()[1])
        stream = await listener.accept()
        await stream.receive_some(65536)  # the request head: the channel is open
        await trio.sleep(0.2)  # publishes arrive, unread
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stream.socket.close()  # RST


async def test_a_reset_from_a_killed_owner_nacks_what_waits_and_ends_only_the_channel() -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_owner_that_resets)
        channel = PeerChannel("a", f"http://127.0.0.1:{port}", origin="b", secret=None)
        results: list[tuple[bool, str | None]] = []
        channel.queue_publish("", "q", b"m", None, None, lambda ok, reason: results.append((ok, reason)))
        with trio.fail_after(10):
            await channel.serve()  # returns: a broken peer must not take this node down with it
    assert channel.closed
    assert results and results[0][0] is False, results
    assert (results[0][1] or "").startswith("queue_unavailable: the channel to node 'a' failed: socket connection broken")
