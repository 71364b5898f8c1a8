"""What a replicated queue's log says, in words no node's numbering leaks into (pure).

The leader's core logs its queue as it logs any queue: ENQUEUE, SETTLE, DELIVERED,
DELIVERY_COUNTS and MOVE records naming the queue by its local id and its messages by
local seqs. :class:`RecordTranslator` reads those records (the runtime's tap hands it
every batch before the WAL writes it) and turns the ones of the quorum queues this
node leads into ops of the queue's replicated log, naming a message by the offset of
its ``pub`` entry, which every replica shares:

- ``{"t": "pub", "x": exchange, "k": routing key, "p": properties, "b": body (base64),
  "w": publish time, "d": due time, "nd": 1}``: a message entered the queue (a publish,
  or a dead letter moved into it); ``d`` (wall-clock seconds) only for one held back
  until then (a publish's ``delay``); ``p`` as the message has them (its
  ``message_id`` included); ``nd`` only for one whose ``message_id`` is not its
  deduplication id (its core record carries none: a publish made without
  deduplication, AMQP's by default, or one the core does not remember, such as a
  nacked publish or a dead letter; or another: the copy of a dead letter a node
  keeps for its own queues while it holds the dead letter for other nodes', whose
  record carries the copy's key), which a new leader must not remember either;
- ``{"t": "due", "n": [[id, due in ms], ...]}``: messages held back again until a
  time (a nack or reject with a delay);
- ``{"t": "dlv", "ids": [...]}``: messages handed to a consumer (each once more);
- ``{"t": "cnt", "n": [[id, count], ...]}``: delivery counts as the core counts them;
- ``{"t": "set", "ids": [...]}``: messages gone for good (acked, rejected, expired,
  dead-lettered, purged);
- ``{"t": "lead", "node": name}``: the first entry of a new leader's epoch;
- ``{"t": "snap", "live": [...], "settled": [...], "epochs": [...]}``: the first entry of
  a compacted log, standing for every entry up to its offset (:func:`snapshot_op`).

:func:`fold` replays a log into what a new leader must hold: the messages not settled,
in log order, with how many times each was delivered (a message delivered before comes
back marked redelivered) and when each is due if it is held back, and the message ids
of settled publishes (the deduplication window: a publish resent to the new leader
lands once), leaving out those marked ``nd``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.core import (
    AppendRecords,
    RecordType,
    decode_counts,
    decode_enqueue,
    decode_move,
    decode_seqs,
    peek_enqueue,
)

__all__ = ["LedQueue", "LiveMessage", "RecordTranslator", "fold", "snapshot_op"]

_ENQUEUE = int(RecordType.ENQUEUE)
_MOVE = int(RecordType.MOVE)
_SETTLE = int(RecordType.SETTLE)
_DELIVERED = int(RecordType.DELIVERED)
_COUNTS = int(RecordType.DELIVERY_COUNTS)
_DELAY = int(RecordType.DELAY)
_WATCHED = frozenset((_ENQUEUE, _MOVE, _SETTLE, _DELIVERED, _COUNTS, _DELAY))


class LedQueue:
    """A quorum queue this node leads, as the translator knows it: its core id, and
    the shared message id (pub offset) of each local seq still in the queue."""

    __slots__ = ("name", "qid", "ids", "restoring")

    def __init__(self, name: str, qid: int) -> None:
        self.name = name
        self.qid = qid
        self.ids: dict[int, int] = {}
        #: while the leader restores its queue from the log: records seen are its own
        self.restoring = False


#: append(queue, op, lsn, seq) -> offset: an op for the queue's log; ``lsn``: the core
#: record whose confirm must wait for the op's majority, ``seq``: the local seq of the
#: message a ``pub`` brings (0: none), held back from consumers until then too
Append = Callable[[LedQueue, dict[str, Any], int, int], int]


class RecordTranslator:
    """Core records of led quorum queues -> replicated-log ops (see the module
    docstring)."""

    def __init__(self, append: Append, batch_done: Callable[[], None] | None = None) -> None:
        self.append = append
        #: called once after each batch of records (the appends of one batch wake the
        #: log's readers and writer once, not once per op)
        self.batch_done = batch_done
        #: qid -> the led queue
        self.led: dict[int, LedQueue] = {}

    def tap(self, effect: AppendRecords) -> None:
        """The runtime's record tap: see every batch before the WAL."""
        led = self.led
        if not led:
            return
        lsn = effect.first_lsn - 1
        for rtype, payload in effect.records:
            lsn += 1
            if rtype in _WATCHED:
                self._record(rtype, payload, lsn, led)
        if self.batch_done is not None:
            self.batch_done()

    def _record(self, rtype: int, payload: bytes, lsn: int, led: dict[int, LedQueue]) -> None:
        if rtype == _ENQUEUE:
            self._enqueue(payload, lsn, led)
        elif rtype == _MOVE:
            origin_qid, origin_seq, due, inner = decode_move(payload)
            origin = led.get(origin_qid)
            if origin is not None and not origin.restoring:
                gone = origin.ids.pop(origin_seq, None)
                if gone is not None:
                    self.append(origin, {"t": "set", "ids": [gone]}, 0, 0)
            self._enqueue(inner, lsn, led, due)
        elif rtype in (_SETTLE, _DELIVERED):
            qid, seqs = decode_seqs(payload)
            queue = led.get(qid)
            if queue is None or queue.restoring:
                return
            if rtype == _SETTLE:
                ids = [i for i in (queue.ids.pop(s, None) for s in seqs) if i is not None]
                kind = "set"
            else:
                ids = [i for i in (queue.ids.get(s) for s in seqs) if i is not None]
                kind = "dlv"
            if ids:
                self.append(queue, {"t": kind, "ids": ids}, 0, 0)
        else:  # delivery counts, or due times (the same encoding)
            qid, pairs = decode_counts(payload)
            queue = led.get(qid)
            if queue is None or queue.restoring:
                return
            values = [[queue.ids[s], n] for s, n in pairs if s in queue.ids]
            if values:
                self.append(queue, {"t": "due" if rtype == _DELAY else "cnt", "n": values}, 0, 0)

    def _enqueue(self, payload: bytes, lsn: int, led: dict[int, LedQueue], due: float | None = None) -> None:
        record = None
        for qid in peek_enqueue(payload)[3]:
            queue = led.get(qid)
            if queue is None or queue.restoring:
                continue
            if record is None:
                record = decode_enqueue(payload)
            properties = record.properties
            op = {
                "t": "pub",
                "x": record.exchange,
                "k": record.routing_key,
                "p": properties,
                "b": base64.b64encode(record.body).decode(),
                "w": record.wall_s,
            }
            if due is not None:
                op["d"] = due
            own_id = properties.get("message_id") if properties else None
            if own_id is not None and record.message_id != own_id:
                op["nd"] = 1  # its id is not its deduplication id (see the module docstring)
            queue.ids[record.seq] = self.append(queue, op, lsn, record.seq)


def published_ids(entries: list[tuple[int, int, dict[str, Any]]]) -> list[tuple[str, str]]:
    """The (exchange, message id) of every ``pub`` entry among ``entries`` that has a
    deduplication id (an id, and no ``nd`` mark).

    A leader that stops leading forgets these for its uncommitted tail: those messages
    leave with the queue and may be truncated by the next leader, so a resend of one
    must be taken again, not answered as a duplicate of a message no node keeps."""
    found = []
    for _epoch, _offset, op in entries:
        if op.get("t") == "pub" and "nd" not in op:
            message_id = (op.get("p") or {}).get("message_id")
            if isinstance(message_id, str):
                found.append((op["x"], message_id))
    return found


@dataclass
class LiveMessage:
    """A message a new leader must hold: its shared id and what the core needs."""

    id: int
    exchange: str
    routing_key: str
    #: the body in base64, as the log carries it: decoded only when a new leader
    #: restores the message (:attr:`body`), not each time a prefix is folded
    b64: str
    properties: dict[str, Any] | None
    wall: float
    deliveries: int = 0
    #: held back until this wall-clock time (None: ready)
    due: float | None = None
    #: whether its ``message_id`` is a deduplication id (a ``pub`` without ``nd``)
    dedup: bool = True

    @property
    def body(self) -> bytes:
        return base64.b64decode(self.b64)


def fold(entries: list[tuple[int, int, dict[str, Any]]]) -> tuple[list[LiveMessage], list[tuple[str, str, float]]]:
    """``(live messages in log order, (exchange, message id, time) of settled
    publishes)`` of a log."""
    live: dict[int, LiveMessage] = {}
    settled: list[tuple[str, str, float]] = []
    for _epoch, offset, op in entries:
        kind = op.get("t")
        if kind == "snap":  # (a compacted log's first entry)
            live = {int(row[0]): _live_from_row(row) for row in op["live"]}
            settled = [(str(x), str(mid), float(wall)) for x, mid, wall in op["settled"]]
        elif kind == "pub":
            due = op.get("d")
            live[offset] = LiveMessage(
                offset, op["x"], op["k"], op["b"], op.get("p"), float(op["w"]),
                due=float(due) if due is not None else None, dedup="nd" not in op,
            )
        elif kind == "dlv":
            for i in op["ids"]:
                m = live.get(i)
                if m is not None:
                    m.deliveries += 1
        elif kind == "cnt":
            for i, n in op["n"]:
                m = live.get(i)
                if m is not None:
                    m.deliveries = max(m.deliveries, int(n))
        elif kind == "due":
            for i, due_ms in op["n"]:
                m = live.get(i)
                if m is not None:
                    m.due = max(m.due or 0.0, int(due_ms) / 1000.0)
        elif kind == "set":
            for i in op["ids"]:
                m = live.pop(i, None)
                if m is not None and m.dedup and m.properties and m.properties.get("message_id") is not None:
                    settled.append((m.exchange, str(m.properties["message_id"]), m.wall))
    return list(live.values()), settled


def snapshot_op(entries: list[tuple[int, int, dict[str, Any]]], settled_since: float, *, max_live_share: float = 0.25) -> dict[str, Any] | None:
    """What a compacted prefix ``entries`` folds into, as a ``snap`` op: its live
    messages (with deliveries and due times) and the message ids of settled ones
    published since wall-clock ``settled_since`` (older ones are past any
    deduplication window). None when the live messages are more than
    ``max_live_share`` of the entries: compacting would rewrite nearly as much as it
    drops (a deep queue); a later, longer prefix is compacted instead. (A deep queue
    is told by a count, not a fold: declining costs a fraction of compacting.)"""
    if _live_at_least(entries) > max_live_share * len(entries):
        return None
    live, settled = fold(entries)
    if len(live) > max_live_share * len(entries):
        return None
    return {
        "t": "snap",
        # (a ninth column, 1, only for a message without deduplication: ``nd``)
        "live": [
            [m.id, m.exchange, m.routing_key, m.properties, m.b64, m.wall, m.deliveries, m.due]
            + ([] if m.dedup else [1])
            for m in live
        ],
        "settled": [[x, mid, wall] for x, mid, wall in settled if wall >= settled_since],
    }


def _live_at_least(entries: list[tuple[int, int, dict[str, Any]]]) -> int:
    """How many live messages ``entries`` fold into at least: those published (a
    snapshot's live ones included) less the ids settled."""
    published = 0
    settled: set[int] = set()
    for _epoch, _offset, op in entries:
        kind = op.get("t")
        if kind == "pub":
            published += 1
        elif kind == "set":
            settled.update(op["ids"])
        elif kind == "snap":
            published += len(op["live"])
    return published - len(settled)


def _live_from_row(row: list[Any]) -> LiveMessage:
    mid, exchange, routing_key, properties, body, wall, deliveries, due, *no_dedup = row
    return LiveMessage(
        int(mid), str(exchange), str(routing_key), str(body), properties, float(wall), int(deliveries),
        float(due) if due is not None else None, dedup=not no_dedup,
    )
