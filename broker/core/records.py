"""What the broker writes to its log: record types and their payload codecs (pure).

The storage layer frames and checksums records and knows nothing of their meaning;
this module is the meaning. Every record is ``(rtype, payload)``. Replay is
idempotent (re-applying a record whose effect is already present changes nothing),
which lets a checkpoint be taken while the broker keeps running: the checkpoint may
already contain some effects of records logged after its LSN, and replaying those
records on top of it yields the same state.

Message records are binary (they are the hot path); entity records are JSON.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import orjson

__all__ = [
    "RecordType",
    "EnqueueRecord",
    "encode_json",
    "decode_json",
    "encode_enqueue",
    "decode_enqueue",
    "peek_enqueue",
    "encode_refs",
    "decode_refs",
    "ref_lsns",
    "encode_seqs",
    "decode_seqs",
    "encode_dedup",
    "decode_dedup",
    "encode_counts",
    "decode_counts",
    "encode_move",
    "decode_move",
    "MOVE_PREFIX_BYTES",
    "peek_priority",
    "encode_priority_refs",
    "decode_priority_refs",
    "encode_tick",
    "decode_tick",
]


class RecordType:
    """Record type numbers. Never renumber: they are on disk. (``Final``: constants
    that the compiled build folds into its code.)"""

    DECLARE_EXCHANGE: Final = 1
    DELETE_EXCHANGE: Final = 2
    DECLARE_QUEUE: Final = 3
    DELETE_QUEUE: Final = 4
    BIND: Final = 5
    UNBIND: Final = 6
    ENQUEUE: Final = 7  # a persistent message entering one or more durable queues
    SETTLE: Final = 8  # messages leaving a queue for good (ack, reject, drop, expiry, purge)
    DELIVERED: Final = 9  # messages handed to a consumer (sets their redelivered flag on recovery)
    DEDUP: Final = 10  # a deduplication window entry (checkpoints only)
    META: Final = 11  # counters that must not go backwards (checkpoints only)
    DEDUP_BATCH: Final = 12  # many deduplication window entries of one exchange (checkpoints only)
    DEDUP_DIGESTS: Final = 13  # many deduplication window entries as digests (checkpoints only)
    QUEUE_REFS: Final = 14  # messages of one queue by the LSN of their ENQUEUE record (checkpoints only)
    DELIVERY_COUNTS: Final = 15  # how many times messages were delivered, when more than once
    MOVE: Final = 16  # a message leaving one queue and entering others in one step (dead letter, redrive)
    DELAY: Final = 17  # messages of a queue held back until a wall-clock time (nack or publish delay)
    LOCK_HELD: Final = 18  # a lock acquired or refreshed: owner, fencing token, expiry (JSON)
    LOCK_RELEASED: Final = 19  # a lock released by its holder (JSON: name, token)
    SCHEDULE_PUT: Final = 20  # a schedule created, replaced, paused or resumed: its whole state (JSON)
    SCHEDULE_DELETE: Final = 21  # a schedule deleted (JSON: name)
    SCHEDULE_TICK: Final = 22  # a schedule's tick and its message, one record (see encode_tick)
    COORD_META: Final = 23  # coordination counters that must not go backwards: next token (checkpoints only)
    USER: Final = 24  # a whole user: name, password hash, tags, permissions (core/userstore.py)
    USER_DELETE: Final = 25  # a user and its tokens deleted
    TOKEN: Final = 26  # a whole API token: id, owner, digest of its secret, expiry
    TOKEN_DELETE: Final = 27  # an API token revoked
    PRIORITY_REFS: Final = 30  # QUEUE_REFS of the messages of one priority of a priority queue (checkpoints only)
    EXPIRES: Final = 31  # when queued messages that carry their own expiration expire (checkpoints only)


def encode_json(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj)


def decode_json(payload: bytes) -> dict[str, Any]:
    value = orjson.loads(payload)
    if not isinstance(value, dict):
        raise ValueError("record payload is not a JSON object")
    return value


# ENQUEUE: seq u64 | wall f64 | expires f64 (0 = none) | nq u16 | lens: exchange u16,
# routing_key u16, message_id u16, properties u32 | qids u32*nq | strings | body
_ENQ_HEAD = struct.Struct("<QddHHHHI")
# the head and the one queue id of a message routed to one queue (most are): one pack
_ENQ_HEAD_1 = struct.Struct("<QddHHHHII")
_U32 = struct.Struct("<I")


@dataclass(slots=True)
class EnqueueRecord:
    seq: int
    wall_s: float
    expires_at: float | None
    qids: list[int]
    exchange: str
    routing_key: str
    message_id: str | None
    properties: dict[str, Any] | None
    body: bytes


def encode_enqueue(
    seq: int,
    wall_s: float,
    expires_at: float | None,
    qids: list[int],
    exchange: str,
    routing_key: str,
    message_id: str | None,
    properties: dict[str, Any] | None,
    body: bytes,
) -> bytes:
    ex = exchange.encode()
    rk = routing_key.encode()
    mid = message_id.encode() if message_id else b""
    props = orjson.dumps(properties) if properties else b""
    nq = len(qids)
    if nq == 1:
        head = _ENQ_HEAD_1.pack(
            seq, wall_s, expires_at or 0.0, 1, len(ex), len(rk), len(mid), len(props), qids[0]
        )
        return b"".join((head, ex, rk, mid, props, body))
    head = _ENQ_HEAD.pack(
        seq, wall_s, expires_at or 0.0, nq, len(ex), len(rk), len(mid), len(props)
    )
    return b"".join((head, struct.pack(f"<{nq}I", *qids), ex, rk, mid, props, body))


def _enqueue_prefix(payload: bytes) -> tuple[int, float, float, list[int], bytes, int, int, int, int]:
    """What ENQUEUE decoding and peeking share: ``(seq, wall, expires, qids, exchange
    (UTF-8), offset after the exchange, routing key length, message id length,
    properties length)``."""
    seq, wall, expires, nq, lex, lrk, lmid, lprops = _ENQ_HEAD.unpack_from(payload, 0)
    pos = _ENQ_HEAD.size
    if nq == 1:
        qids = [_U32.unpack_from(payload, pos)[0]]
    else:
        qids = list(struct.unpack_from(f"<{nq}I", payload, pos))
    pos += 4 * nq
    return seq, wall, expires, qids, payload[pos : pos + lex], pos + lex, lrk, lmid, lprops


def decode_enqueue(payload: bytes) -> EnqueueRecord:
    seq, wall, expires, qids, exchange_utf8, pos, lrk, lmid, lprops = _enqueue_prefix(payload)
    exchange = exchange_utf8.decode()
    end = pos + lrk
    routing_key = payload[pos:end].decode()
    pos, end = end, end + lmid
    message_id = payload[pos:end].decode() if lmid else None
    pos, end = end, end + lprops
    properties = orjson.loads(payload[pos:end]) if lprops else None
    body = payload[end:]
    return EnqueueRecord(
        seq, wall, expires or None, qids, exchange, routing_key, message_id, properties, body
    )


def peek_enqueue(payload: bytes) -> tuple[int, float, float, list[int], bytes, bytes | None]:
    """``(seq, wall_s, expires_at, qids, exchange, message_id)`` of an ENQUEUE record
    (``expires_at`` 0.0: none), without decoding its properties and body (recovery
    indexes messages, it does not load them). Exchange and message id are their UTF-8
    bytes, undecoded: recovery only hashes them (``dedup.digest_utf8``)."""
    seq, wall, expires, qids, exchange, pos, lrk, lmid, _lprops = _enqueue_prefix(payload)
    pos += lrk
    return seq, wall, expires, qids, exchange, payload[pos : pos + lmid] if lmid else None


def peek_priority(payload: bytes) -> int:
    """The ``priority`` property of an ENQUEUE record's message (0 without one),
    decoding its properties but not its body (recovery of a priority queue)."""
    _seq, _wall, _expires, _qids, _ex, pos, lrk, lmid, lprops = _enqueue_prefix(payload)
    if not lprops:
        return 0
    pos += lrk + lmid
    properties = orjson.loads(payload[pos : pos + lprops])
    value = properties.get("priority") if isinstance(properties, dict) else None
    return value if type(value) is int and 0 <= value <= 255 else 0


# QUEUE_REFS: qid u32 | n u32 | n x (seq i64, locator i64), locator = lsn << 1 | delivered
# (see core/paging.py)
_SWAP = sys.byteorder != "little"  # records are little-endian


def encode_refs(qid: int, pairs: array[int]) -> bytes:
    """A QUEUE_REFS record: ``qid u32 | n u32 | n x (seq i64, locator i64)``."""
    if _SWAP:
        pairs = array("q", pairs)
        pairs.byteswap()
    return qid.to_bytes(4, "little") + (len(pairs) // 2).to_bytes(4, "little") + pairs.tobytes()


def decode_refs(payload: bytes) -> tuple[int, array[int]]:
    """``(qid, flat array of seq, locator pairs)``; ValueError if malformed."""
    if len(payload) < 8:
        raise ValueError("QUEUE_REFS record too short")
    qid = int.from_bytes(payload[0:4], "little")
    n = int.from_bytes(payload[4:8], "little")
    if len(payload) != 8 + 16 * n:
        raise ValueError("QUEUE_REFS record length does not match its count")
    pairs = array("q")
    pairs.frombytes(payload[8:])
    if _SWAP:
        pairs.byteswap()
    return qid, pairs


# PRIORITY_REFS: priority u8 | a QUEUE_REFS payload (the messages of that priority)


def encode_priority_refs(qid: int, priority: int, pairs: array[int]) -> bytes:
    return bytes((priority,)) + encode_refs(qid, pairs)


def decode_priority_refs(payload: bytes) -> tuple[int, int, array[int]]:
    """``(qid, priority, flat array of seq, locator pairs)``; ValueError if malformed."""
    if not payload:
        raise ValueError("PRIORITY_REFS record too short")
    qid, pairs = decode_refs(payload[1:])
    return qid, payload[0], pairs


def ref_lsns(rtype: int, payload: bytes) -> Iterator[int]:
    """The LSNs a QUEUE_REFS or PRIORITY_REFS record refers to (the log must keep
    their segments)."""
    if rtype == RecordType.PRIORITY_REFS:
        _qid, _p, pairs = decode_priority_refs(payload)
    else:
        _qid, pairs = decode_refs(payload)
    return (loc >> 1 for loc in pairs[1::2])


# SETTLE / DELIVERED: qid u32 | n u32 | seq u64 * n
_SEQS_HEAD = struct.Struct("<II")


def encode_seqs(qid: int, seqs: list[int]) -> bytes:
    return _SEQS_HEAD.pack(qid, len(seqs)) + struct.pack(f"<{len(seqs)}Q", *seqs)


def decode_seqs(payload: bytes) -> tuple[int, tuple[int, ...]]:
    qid, n = _SEQS_HEAD.unpack_from(payload, 0)
    if _SEQS_HEAD.size + 8 * n != len(payload):
        raise ValueError("settle record length does not match its count")
    return qid, struct.unpack_from(f"<{n}Q", payload, _SEQS_HEAD.size)


def encode_dedup(exchange: str, message_id: str, wall_s: float) -> bytes:
    return orjson.dumps([exchange, message_id, wall_s])


def decode_dedup(payload: bytes) -> tuple[str, str, float]:
    exchange, message_id, wall = orjson.loads(payload)
    return str(exchange), str(message_id), float(wall)


def encode_dedup_batch(exchange: str, entries: list[tuple[str, float]]) -> bytes:
    """Window entries ``(message_id, wall_s)`` of one exchange in one record: a
    checkpoint holds one entry per publish of the last minutes (hundreds of thousands),
    and one record each cost more to encode, frame and replay than the entry itself."""
    return orjson.dumps([exchange, entries])


def decode_dedup_batch(payload: bytes) -> tuple[str, list[tuple[str, float]]]:
    exchange, entries = orjson.loads(payload)
    if not isinstance(exchange, str) or not isinstance(entries, list):
        raise ValueError("malformed DEDUP_BATCH record")
    return exchange, [(str(mid), float(wall)) for mid, wall in entries]


# DELIVERY_COUNTS / DELAY: qid u32 | n u32 | n x (seq u64, value u64). The value is a
# delivery count, or a due time in milliseconds since the epoch. Replay keeps the
# larger of what it has and what it reads: both only grow, so replay stays idempotent.
_PAIRS_HEAD = struct.Struct("<II")


def encode_counts(qid: int, pairs: list[tuple[int, int]]) -> bytes:
    flat = [v for pair in pairs for v in pair]
    return _PAIRS_HEAD.pack(qid, len(pairs)) + struct.pack(f"<{len(flat)}Q", *flat)


def decode_counts(payload: bytes) -> tuple[int, list[tuple[int, int]]]:
    qid, n = _PAIRS_HEAD.unpack_from(payload, 0)
    if _PAIRS_HEAD.size + 16 * n != len(payload):
        raise ValueError("record length does not match its count")
    flat = struct.unpack_from(f"<{2 * n}Q", payload, _PAIRS_HEAD.size)
    it = iter(flat)
    return qid, list(zip(it, it))


# MOVE: origin qid u32 (0 = none) | origin seq u64 | due f64 (0 = none) | an ENQUEUE
# payload. One record, so the message leaves its origin and enters its new queues
# atomically: after a crash it is in one place or the other, never both or neither.
_MOVE_HEAD = struct.Struct("<IQd")
MOVE_PREFIX_BYTES = _MOVE_HEAD.size


def encode_move(origin_qid: int, origin_seq: int, due_wall_s: float | None, enqueue_payload: bytes) -> bytes:
    return _MOVE_HEAD.pack(origin_qid, origin_seq, due_wall_s or 0.0) + enqueue_payload


def decode_move(payload: bytes) -> tuple[int, int, float | None, bytes]:
    """``(origin qid, origin seq, due time or None, the ENQUEUE payload)``."""
    qid, seq, due = _MOVE_HEAD.unpack_from(payload, 0)
    return qid, seq, due or None, payload[_MOVE_HEAD.size :]


# SCHEDULE_TICK: name length u16 | nominal tick time f64 | name | an ENQUEUE payload
# (with no queues when the message reached no durable queue). One record, so the
# tick's "fired up to" and its message are written together: after a crash the tick
# has fired (and its message is queued) or it has not, never one without the other.
_TICK_HEAD = struct.Struct("<Hd")


def encode_tick(name: str, tick_s: float, enqueue_payload: bytes) -> bytes:
    raw = name.encode()
    return _TICK_HEAD.pack(len(raw), tick_s) + raw + enqueue_payload


def decode_tick(payload: bytes) -> tuple[str, float, bytes]:
    """``(schedule name, nominal tick time, the ENQUEUE payload)``."""
    n, tick = _TICK_HEAD.unpack_from(payload, 0)
    pos = _TICK_HEAD.size
    return payload[pos : pos + n].decode(), tick, payload[pos + n :]
