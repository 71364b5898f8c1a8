"""The Redis side of the workloads (``--peer redis``), with redis-py and hiredis.

A queue is a stream key. Declaring it creates the consumer group ``bench`` with
``XGROUP CREATE <key> bench $ MKSTREAM`` (an existing group is fine), so every entry
published afterwards is for that group, as messages published to a durable queue are
for its consumers. A message is ``XADD <key> * body <bytes>``; the server runs with
``appendfsync always``, so an ``XADD`` is answered once it is in the fsynced AOF: the
reply is the publish confirm.

Client: redis-py's synchronous client with the hiredis reply parser (required: the
worker refuses to run without it). Measured on the benchmark machine, it publishes
faster than ``redis.asyncio`` (about 75k against 50–60k msgs/s with pipelines of
1,000, before the batching below), so the timed paths use the synchronous client's
``Connection`` directly: commands packed once and written in batches
(``send_packed_command``), replies read in order (``read_response``), without
redis-py's per-command reply callbacks. That is the most a Redis user can get out of
Python, and what the issue asks for: each side with its best client.

- ``publish_seq``: one ``XADD`` at a time, each answered before the next.
- ``publish_pipelined``: a window of W ``XADD`` in flight as two batches of W/2 that
  overlap: both are sent, and each time the older batch's replies are all read, a new
  batch goes out (between W/2 and W unanswered at any time; a window of 1 is one at a
  time). Measured against one batch of W at a time (send, read all, repeat): about
  130k against 75k msgs/s at W = 1,000 on an idle machine, so two halves it is
  (quarters were no better).
- ``consume``: ``XREADGROUP GROUP bench c1 COUNT <prefetch> BLOCK 1000 STREAMS <key> >``;
  the ``XACK`` of the entries read goes out in the same write as the next read (one
  round trip per batch); the last batch's ``XACK`` is sent before the clock stops
  and its reply checked after. Acked entries stay in the stream (``XACK`` only clears
  the group's pending list), as Redis Streams work.
- ``e2e_consume`` / ``e2e_publish``: the stamped bodies of the other workers; the
  consumer blocks in ``XREADGROUP … BLOCK`` (acks sent with the next read), the
  publisher sends each due ``XADD`` at once and reads replies while it waits for the
  next one to be due.

Priorities, delays, queue arguments, exchanges, fan-out and nacks have no Redis
Streams equivalent: a spec asking for one is refused with :class:`Unsupported`.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any

import redis
import redis.exceptions
import redis.utils

from bench.workercommon import (
    body_of,
    emit_result,
    latency_summary,
    read_spec,
    signal_ready,
    stamp_of,
    stamped_body,
    wait_go,
)

GROUP = b"bench"
CONSUMER = b"c1"
FIELD = b"body"
# batches that share a publisher's window (see the module docstring)
WINDOW_PARTS = 2
BLOCK_MS = 1000
# a consumer that reads nothing for this long stops (and then falls short of its count)
IDLE_GIVE_UP_S = 10.0

_UNSUPPORTED = {
    "priorities": "message priorities",
    "delay_s": "delayed messages",
    "queue_arguments": "queue arguments",
    "fanout": "fan-out exchanges",
    "exchange": "exchanges (a queue is a stream key; publish with routing_key = the key)",
    "nack_every": "nack with requeue",
    "reject_all": "reject (dead letters)",
}


class Unsupported(Exception):
    """The workload asks for something Redis Streams do not have."""


def _check_spec(spec: dict[str, Any]) -> None:
    for key, what in _UNSUPPORTED.items():
        if spec.get(key):
            raise Unsupported(f"the Redis side has no {what}: spec field {key!r} = {spec[key]!r}")


def _client(spec: dict[str, Any]) -> redis.Redis:
    if not redis.utils.HIREDIS_AVAILABLE:
        raise RuntimeError("hiredis is not installed: the Redis side runs redis-py with the hiredis parser")
    return redis.Redis(host="127.0.0.1", port=spec["port"])


def _declare(r: redis.Redis, spec: dict[str, Any]) -> None:
    """Create the consumer group of every queue (and the stream), idempotently."""
    for queue in spec.get("queues", ()):
        try:
            r.execute_command("XGROUP", "CREATE", queue, GROUP, "$", "MKSTREAM")
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


def _connection(r: redis.Redis) -> Any:
    return r.connection_pool.get_connection()


def publish_seq(r: redis.Redis, spec: dict[str, Any]) -> dict[str, Any]:
    """One ``XADD`` at a time, each answered (fsynced) before the next."""
    body, key = body_of(spec["size"]), spec["routing_key"]
    conn = _connection(r)
    command = conn.pack_command("XADD", key, "*", FIELD, body)
    send, read = conn.send_packed_command, conn.read_response
    signal_ready()
    wait_go()
    warm_until = time.perf_counter() + spec["warmup_s"]
    while time.perf_counter() < warm_until:
        send(command)
        read()
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + spec["duration_s"]
    end = start
    while end < deadline:
        t = time.perf_counter()
        send(command)
        read()
        end = time.perf_counter()
        latencies.append(end - t)
    return {"count": len(latencies), "elapsed_s": end - start, **latency_summary(latencies)}


def publish_pipelined(r: redis.Redis, spec: dict[str, Any]) -> dict[str, Any]:
    """At most ``window`` ``XADD`` unanswered, in ``WINDOW_PARTS`` overlapping batches;
    stop sending at ``count`` or ``duration_s``, then read every reply."""
    body, key = body_of(spec["size"]), spec["routing_key"]
    window = spec["window"]
    count = spec.get("count") or math.inf
    parts = min(WINDOW_PARTS, window)
    part = window // parts
    conn = _connection(r)
    packed: dict[int, list[bytes]] = {}
    in_flight: collections.deque[int] = collections.deque()
    signal_ready()
    wait_go()
    start, cpu0 = time.perf_counter(), time.process_time()
    deadline = start + spec.get("duration_s", math.inf)
    sent = confirmed = 0

    def send_batch() -> None:
        nonlocal sent
        n = int(min(part, count - sent))
        if n <= 0:
            return
        if n not in packed:
            packed[n] = conn.pack_commands([("XADD", key, "*", FIELD, body)] * n)
        conn.send_packed_command(packed[n], check_health=False)
        in_flight.append(n)
        sent += n

    for _ in range(parts):
        send_batch()
    read = conn.read_response
    stopping = False
    while in_flight:
        n = in_flight.popleft()
        for _ in range(n):
            read()  # an error reply raises
        confirmed += n
        if not stopping and time.perf_counter() >= deadline:
            stopping = True
        if not stopping:
            send_batch()
    elapsed, cpu_s = time.perf_counter() - start, time.process_time() - cpu0
    return {"count": confirmed, "elapsed_s": elapsed, "cpu_s": cpu_s}


def _read_group(key: str, prefetch: int) -> tuple[Any, ...]:
    return ("XREADGROUP", "GROUP", GROUP, CONSUMER, "COUNT", prefetch, "BLOCK", BLOCK_MS, "STREAMS", key, ">")


def _entries(reply: Any) -> list[Any]:
    """The ``[id, [field, value]]`` entries of a raw ``XREADGROUP`` reply on one key:
    a map ``{key: entries}`` in RESP3 (redis-py 8's default), ``[[key, entries]]`` in
    RESP2, nil after a ``BLOCK`` that timed out."""
    if not reply:
        return []
    ((_key, entries),) = reply.items() if isinstance(reply, dict) else reply
    return list(entries)


class _GroupReader:
    """Reads a stream through the group, one round trip per batch: the ``XACK`` of
    the previous batch goes out with the next ``XREADGROUP``."""

    def __init__(self, r: redis.Redis, key: str, prefetch: int) -> None:
        self.conn = _connection(r)
        self.key = key
        self.read_command = _read_group(key, prefetch)
        self.to_ack: list[bytes] = []
        self.acked = 0

    def _xack(self) -> tuple[Any, ...]:
        return ("XACK", self.key, GROUP, *self.to_ack)

    def next_batch(self) -> list[Any]:
        commands = [self._xack(), self.read_command] if self.to_ack else [self.read_command]
        self.conn.send_packed_command(self.conn.pack_commands(commands), check_health=False)
        if self.to_ack:
            self.acked += int(self.conn.read_response())
        entries = _entries(self.conn.read_response())
        self.to_ack = [entry[0] for entry in entries]
        return entries

    def send_last_ack(self) -> bool:
        """Send the ``XACK`` of the last batch (its reply is read by ``finish``)."""
        if not self.to_ack:
            return False
        self.conn.send_packed_command(self.conn.pack_command(*self._xack()), check_health=False)
        return True

    def finish(self, sent_last: bool) -> None:
        if sent_last:
            self.acked += int(self.conn.read_response())
            self.to_ack = []


def consume(r: redis.Redis, spec: dict[str, Any]) -> dict[str, Any]:
    """Read and ack ``count`` entries through the group, ``prefetch`` per read."""
    count, reader = spec["count"], _GroupReader(r, spec["queue"], spec["prefetch"])
    signal_ready()
    wait_go()
    received = 0
    start = idle_since = time.perf_counter()
    while received < count:
        entries = reader.next_batch()
        now = time.perf_counter()
        if entries:
            received += len(entries)
            idle_since = now
        elif now - idle_since > IDLE_GIVE_UP_S:
            break
    sent_last = reader.send_last_ack()
    elapsed = time.perf_counter() - start
    reader.finish(sent_last)
    if reader.acked != received:
        raise RuntimeError(f"received {received} entries but XACK acknowledged {reader.acked}")
    return {"count": received, "elapsed_s": elapsed}


def e2e_consume(r: redis.Redis, spec: dict[str, Any]) -> dict[str, Any]:
    """Receive stamped entries (blocking reads); latency = now - the publisher's stamp."""
    total, warmup = spec["total"], spec["warmup_count"]
    reader = _GroupReader(r, spec["queue"], spec["prefetch"])
    latencies: list[float] = []
    received = 0
    signal_ready()
    wait_go()
    deadline = time.perf_counter() + spec["timeout_s"]
    done = False
    while not done and time.perf_counter() < deadline:
        for _id, fields in reader.next_batch():
            now = time.monotonic_ns()
            sent_ns, seq = stamp_of(dict(zip(fields[::2], fields[1::2]))[FIELD])
            if seq >= warmup:
                latencies.append((now - sent_ns) / 1e9)
            received += 1
            done = done or seq >= total - 1
    reader.finish(reader.send_last_ack())
    return {"received": received, **latency_summary(latencies)}


def e2e_publish(r: redis.Redis, spec: dict[str, Any]) -> dict[str, Any]:
    """Publish ``total`` stamped entries at a fixed rate, replies read as they come.

    Entry i is due at start + i/rate; every due entry is sent at once (the stamp taken
    just before), then replies are read while waiting for the next to be due.
    """
    size, rate, total, key = spec["size"], spec["rate"], spec["total"], spec["routing_key"]
    conn = _connection(r)
    signal_ready()
    wait_go()
    start_ns = time.monotonic_ns()
    interval_ns = 1e9 / rate
    seq = unanswered = 0
    while seq < total:
        now = time.monotonic_ns()
        while seq < total and start_ns + seq * interval_ns <= now:
            conn.send_packed_command(conn.pack_command("XADD", key, "*", FIELD, stamped_body(size, seq)),
                                     check_health=False)
            seq += 1
            unanswered += 1
            now = time.monotonic_ns()
        while seq < total:
            wait_s = (start_ns + seq * interval_ns - time.monotonic_ns()) / 1e9
            if wait_s <= 0:
                break
            if unanswered and conn.can_read(timeout=wait_s):
                conn.read_response()
                unanswered -= 1
            elif not unanswered:
                time.sleep(wait_s)
    elapsed = (time.monotonic_ns() - start_ns) / 1e9
    for _ in range(unanswered):
        conn.read_response()
    return {"count": total, "rate": total / elapsed}


OPS = {
    "publish_seq": publish_seq,
    "publish_pipelined": publish_pipelined,
    "consume": consume,
    "e2e_consume": e2e_consume,
    "e2e_publish": e2e_publish,
}


def main() -> None:
    spec = read_spec()
    _check_spec(spec)
    if spec["op"] not in OPS:
        raise Unsupported(f"the Redis side has no {spec['op']!r} workload")
    r = _client(spec)
    _declare(r, spec)
    emit_result(OPS[spec["op"]](r, spec))


if __name__ == "__main__":
    main()
