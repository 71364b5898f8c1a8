"""A deliberately small, blocking channel client for crash tests.

Independent of the product client (``client/``) so that a bug there cannot hide a
durability bug in the broker: raw socket, hand-written chunked HTTP/1.1, NDJSON.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import orjson

__all__ = ["RawChannel", "ChannelGone", "PublishLedger", "publish_confirmed"]


class ChannelGone(Exception):
    """The connection ended (broker killed or closed the channel)."""


class RawChannel:
    def __init__(self, port: int, timeout_s: float = 30.0, headers: dict[str, str] | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self._file = self.sock.makefile("rb")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
        try:
            self.sock.sendall(
                b"POST /channel HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n"
                b"Content-Type: application/x-ndjson\r\n" + extra + b"\r\n"
            )
        except OSError as exc:
            self.close()
            raise ChannelGone(str(exc)) from exc
        self._pending: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        try:
            status = self._file.readline()
            if not status.startswith(b"HTTP/1.1 200"):
                raise ChannelGone(f"unexpected status {status!r}")
            while self._file.readline() not in (b"\r\n", b""):
                pass
            opened = self.next_event()
            assert opened["ev"] == "open", opened
        except BaseException:
            self.close()
            raise

    def send(self, *ops: dict[str, Any]) -> None:
        data = b"".join(orjson.dumps(op) + b"\n" for op in ops)
        try:
            with self._lock:
                self.sock.sendall(b"%x\r\n" % len(data) + data + b"\r\n")
        except OSError as exc:
            raise ChannelGone(str(exc)) from exc

    def next_event(self) -> dict[str, Any]:
        while not self._pending:
            try:
                size_line = self._file.readline()
                if not size_line:
                    raise ChannelGone("connection closed")
                size = int(size_line.strip(), 16)
                if size == 0:
                    raise ChannelGone("response ended")
                data = self._file.read(size)
                self._file.read(2)
            except (OSError, ValueError) as exc:
                raise ChannelGone(str(exc)) from exc
            if len(data) < size:
                raise ChannelGone("connection closed mid-chunk")
            self._pending.extend(orjson.loads(line) for line in data.split(b"\n") if line)
        return self._pending.pop(0)

    def next_of(self, kind: str) -> dict[str, Any]:
        """The next event of kind ``kind`` (``ok``, ``deliver``...), skipping others;
        an ``error`` event on the way fails."""
        ev = self.next_event()
        while ev["ev"] != kind:
            assert ev["ev"] != "error", ev
            ev = self.next_event()
        return ev

    def call(self, op: dict[str, Any]) -> dict[str, Any]:
        """Send ``op`` with an ``id``; the event that answers it (an ``error`` too),
        skipping the others on the way."""
        self.send({**op, "id": "call"})
        while True:
            event = self.next_event()
            if event.get("id") == "call":
                return event

    def close(self) -> None:
        for thing in (self._file, self.sock):
            try:
                thing.close()
            except OSError:
                pass


class PublishLedger:
    """The bookkeeping of a stress-test publisher: numbers its publishes with message
    ids unique to ``pid``, and settles the confirms of one channel, coalesced ranges
    included, noting any confirm out of order or outside what was sent in ``errors``.
    It never resends, so a duplicate in a queue can only come from the broker."""

    def __init__(self, pid: int, queue: str) -> None:
        self.pid = pid
        self.queue = queue
        self.attempted: set[str] = set()
        self.acked: set[str] = set()
        self.nacked: set[str] = set()
        self.errors: list[str] = []
        self._n = 0
        self.new_channel()

    def new_channel(self) -> None:
        """A fresh channel: delivery tags start at 1 again (unsettled ids stay unknown)."""
        self._tags: dict[int, str] = {}
        self.tag = 0
        self.confirmed = 0

    def batch(self, size: int) -> list[dict[str, Any]]:
        """``size`` publish ops with new message ids, for :meth:`RawChannel.send`."""
        ops = []
        for _ in range(size):
            self._n += 1
            self.tag += 1
            mid = f"p{self.pid}-{self._n}"
            self._tags[self.tag] = mid
            self.attempted.add(mid)
            ops.append({"op": "publish", "routing_key": self.queue, "body": mid, "properties": {"message_id": mid}})
        return ops

    def settle(self, ev: dict[str, Any]) -> None:
        """Apply an ``ack`` or ``nack`` event."""
        upto = ev["delivery_tag"]
        if not ev["multiple"] and upto != self.confirmed + 1:
            self.errors.append(f"confirm out of order: {ev} after {self.confirmed}")
        if upto <= self.confirmed or upto > self.tag:
            self.errors.append(f"confirm {ev} outside ({self.confirmed}, {self.tag}]")
        target = self.acked if ev["ev"] == "ack" else self.nacked
        for t in range(self.confirmed + 1, upto + 1):
            target.add(self._tags.pop(t))
        self.confirmed = upto


def publish_confirmed(port: int, routing_key: str, bodies: list[str], *, batch: int = 500) -> None:
    """Publish ``bodies`` to the default exchange on one channel, ``batch`` at a time,
    waiting for each batch's confirms; every one must be an ``ack``."""
    ch = RawChannel(port)
    try:
        sent = 0
        while sent < len(bodies):
            chunk = bodies[sent : sent + batch]
            ch.send(*[{"op": "publish", "routing_key": routing_key, "body": b} for b in chunk])
            sent += len(chunk)
            while True:
                ev = ch.next_event()
                assert ev["ev"] == "ack", ev
                if ev["delivery_tag"] >= sent:
                    break
    finally:
        ch.close()
