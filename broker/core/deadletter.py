"""Dead letters: messages that fail, expire or overflow go to a dead-letter exchange.

A queue with ``x-dead-letter-exchange`` republishes each message that leaves it for
one of four reasons (``rejected``: a nack or reject without requeue; ``expired``: its
TTL passed; ``maxlen``: dropped from the head by ``x-max-length``; ``delivery_limit``:
returned more often than ``x-delivery-limit`` allows) to that exchange, with
``x-dead-letter-routing-key`` or its own routing key. The copy keeps body and
properties and gains RabbitMQ's ``x-death`` history. Leaving the queue and entering
the new ones is one MOVE record in the log: after a crash the message is in one place
or the other. ``redrive`` moves messages out of a dead-letter queue the same way.

:class:`DeadLetters` routes through the topology into the queue store; the store calls
it back when a message leaves a queue for one of the reasons above.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import records as rec
from .constants import DEFAULT_EXCHANGE
from .effects import DeadLetterDropped, DeadLetterHeld
from .entities import Queue
from .errors import InvalidArgument, NotFound
from .log import MessageLog
from .message import Entry, StoredMessage
from .queues import QueueStore
from .senderselected import header_routes
from .shared import Outbox, Wakeups
from .topology import Topology

__all__ = ["DeadLetters", "DEAD_LETTER_REASONS", "MAX_REDRIVE"]

DEAD_LETTER_REASONS = ("rejected", "expired", "maxlen", "delivery_limit")
#: The deduplication key of a dead letter's local copy, before its source queue and
#: message: a NUL no client's message id starts with (see ``_copy_here_once``).
_COPY_KEY = "\x00dead-letter\x00"
#: Most messages one redrive call moves.
MAX_REDRIVE = 100_000


class DeadLetters:
    """Dead letters and redrive (see the module docstring). Owns the counts of dead
    letters dropped, by reason (``drops``)."""

    def __init__(
        self,
        queues: QueueStore,
        topology: Topology,
        log: MessageLog,
        outbox: Outbox,
        wakeups: Wakeups,
        *,
        wall_clock: Callable[[], float],
    ) -> None:
        self._store = queues
        self._topology = topology
        self._exchanges = topology.exchanges
        self._log = log
        self._outbox = outbox
        self._getters = wakeups.getters
        self._wall_clock = wall_clock
        #: dead letters dropped (no exchange, no route, storage failing), by reason
        self.drops: dict[str, int] = {}
        self._hold: Callable[[Queue, Entry], tuple[int, int] | None] | None = None
        self._elsewhere: Callable[[str, str, dict[str, Any]], bool] | None = None
        self._majority: Callable[[str], bool] | None = None
        self._hold_confirm: Callable[[int, int], bool] | None = None

    def connect(
        self,
        *,
        hold: Callable[[Queue, Entry], tuple[int, int] | None],
        elsewhere: Callable[[str, str, dict[str, Any]], bool] | None = None,
        majority: Callable[[str], bool] | None = None,
        hold_confirm: Callable[[int, int], bool] | None = None,
    ) -> None:
        """Name ``HeldDeadLetters.hold`` (heldletters.py, built after this component):
        a dead letter routing to no queue here is held, and announced
        (``DeadLetterHeld``), when it answers (holding channel, tag); dropped when it
        answers None. ``elsewhere`` (``HeldDeadLetters.reaches_other_nodes``): whether
        one that reaches queues here reaches other nodes' too (then it is enqueued
        here and held for them). ``majority`` (``HeldDeadLetters.needs_majority``):
        whether a queue here keeps a copy only once a majority of its replicas has it
        (then the dead letter is held, that queue's copy left to ``copy_held``).
        ``hold_confirm`` (``HeldDeadLetters.hold_confirm``): holds the confirm of a
        publish refused by a full ``reject-publish-dlx`` queue instead (the message
        was never in that queue: nothing to hold there)."""
        self._hold = hold
        self._elsewhere = elsewhere
        self._majority = majority
        self._hold_confirm = hold_confirm

    def _holder(self, queue: Queue, entry: Entry, refused: tuple[int, int] | None) -> tuple[int, int] | None:
        """Hold a dead letter for the cluster: (channel, tag) that stand for it, or None
        when nothing can hold it. One that left ``queue`` is held there, as a delivery
        of the holding channel; one ``refused`` by ``queue`` (its publisher's channel
        and tag), never stored there, is held by its publish's confirm (a nack) instead."""
        if refused is None:
            return self._hold(queue, entry) if self._hold is not None else None
        hold_confirm = self._hold_confirm
        return refused if hold_confirm is not None and hold_confirm(*refused) else None

    def dead_letter(self, queue: Queue, entry: Entry, reason: str, *, refused: tuple[int, int] | None = None) -> None:
        """``entry`` has left ``queue`` for ``reason``: settle it there and, when the
        queue has a dead-letter exchange, publish its copy there in the same step.
        ``refused``: the publisher's (channel, tag) of a message ``queue`` refused
        (``x-overflow: reject-publish-dlx``), never stored there."""
        queue.dead_lettered[reason] = queue.dead_lettered.get(reason, 0) + 1
        dlx_name = queue.dead_letter_exchange
        if dlx_name is None or queue.deleted:
            self._log.settle_entry(queue, entry)
            return
        message = entry.message
        exchange = self._exchanges.get(dlx_name)
        if exchange is None:
            self._drop_dead_letter(queue, entry, reason, f"dead-letter exchange {dlx_name!r} does not exist")
            return
        exchange.messages_in += 1
        wall = self._wall_clock()
        routing_key = queue.dead_letter_routing_key or message.routing_key
        properties = _with_death(message, queue.name, reason, wall, bool(queue.dead_letter_routing_key))
        headers = properties["headers"]
        # with its own key, the CC keys too (senderselected.py; RabbitMQ also its BCC
        # keys, which ackbus does not keep); with x-dead-letter-routing-key, that alone
        targets = self._topology.route_publish(exchange, routing_key, headers)
        if not any(d.get("reason") == "rejected" for d in headers["x-death"]):
            # A cycle without any rejection would go round for ever (RabbitMQ drops it).
            dead_from = {d.get("queue") for d in headers["x-death"]}
            targets = [q for q in targets if q.name not in dead_from]
        if not targets:
            held = self._holder(queue, entry, refused)
            if held is not None:  # a cluster: other nodes may own the queues it reaches
                self._outbox.emit(
                    DeadLetterHeld(
                        *held, queue.name, exchange.name, routing_key, message.body, properties,
                        refused=refused is not None,
                    )
                )
                return
            forward = (exchange.name, routing_key, message.body, properties)
            self._drop_dead_letter(queue, entry, reason, f"routes to no queue from {dlx_name!r}", forward)
            return
        persistent = message.persistent or any(q.persist_all for q in targets)  # (made persistent by ``move``)
        if persistent and not self._log.storage_ok and any(q.persistent_log for q in targets):
            self._drop_dead_letter(queue, entry, reason, f"storage is failing: {self._log.storage_reason}")
            return
        exchange.messages_out += 1
        if self._elsewhere is not None and self._hold is not None:
            majority = self._majority
            awaiting = [q for q in targets if majority(q.name)] if majority is not None else []
            if awaiting or self._elsewhere(exchange.name, routing_key, properties):
                held = self._holder(queue, entry, refused)
                if held is not None:  # a cluster: here at once, held for the rest
                    now = [q for q in targets if q not in awaiting] if awaiting else targets
                    if now:
                        self._copy_here_once(queue, message, exchange.name, routing_key, properties, now, wall)
                    self._outbox.emit(
                        DeadLetterHeld(
                            *held, queue.name, exchange.name, routing_key, message.body, properties,
                            local=bool(now), awaiting=tuple(q.name for q in awaiting), refused=refused is not None,
                        )
                    )
                    return
        self.move(queue, entry, exchange.name, routing_key, properties, message.body, targets, wall)

    def copy_held(
        self, queue_names: list[str], exchange_name: str, routing_key: str, body: bytes, properties: dict[str, Any]
    ) -> list[tuple[str, int]]:
        """A held dead letter's copy (``DeadLetterHeld.awaiting``) for ``queue_names``,
        queues of this core that keep it only once a majority of their replicas has it:
        one ENQUEUE record each (the source stays held), whose LSN the cluster watches.
        No deduplication key: a copy lost with its leader is made again, and one the
        majority kept may be made twice (after a crash before the source was settled):
        at least once. Returns (queue, LSN) of each copy made; a queue gone, or one
        not logged now (storage failing), is left out, to be tried again."""
        wall = self._wall_clock()
        made: list[tuple[str, int]] = []
        if not self._log.storage_ok:
            return made
        for name in queue_names:
            queue = self._store.queues.get(name)
            if queue is None or queue.deleted:
                continue
            lsn = self.move(None, None, exchange_name, routing_key, properties, body, [queue], wall)
            made.append((name, lsn))
        return made

    def _copy_here_once(
        self,
        queue: Queue,
        message: StoredMessage,
        exchange_name: str,
        routing_key: str,
        properties: dict[str, Any],
        targets: list[Queue],
        wall: float,
    ) -> None:
        """The local share of a dead letter held for other nodes: enqueued in
        ``targets`` (an ENQUEUE record; the source stays), unless this source message
        already gave them their copy. That happens when the node restarted while the
        dead letter was held (the source is back in its queue, the copy is in the log)
        and the source dies again: the copy's deduplication key, one per source
        message and queue, is in the window (the log's and the checkpoints', for
        ``dedup_window_s``), so the queues here are not given a second copy."""
        key = f"{_COPY_KEY}{queue.name}\x00{message.seq}"
        dedup = self._log.dedup
        if dedup.lookup(exchange_name, key, wall) is not None:
            return
        lsn = self.move(None, None, exchange_name, routing_key, properties, message.body, targets, wall, dedup_id=key)
        dedup.remember(exchange_name, key, wall, lsn)

    def _drop_dead_letter(
        self, queue: Queue, entry: Entry, reason: str, why: str, forward: tuple[str, str, bytes, dict[str, Any]] | None = None
    ) -> None:
        self._log.settle_entry(queue, entry)
        self.drops[reason] = self.drops.get(reason, 0) + 1
        self._outbox.emit(DeadLetterDropped(queue.name, entry.message.seq, reason, why, forward))

    def move(
        self,
        origin: Queue | None,
        entry: Entry | None,
        exchange_name: str,
        routing_key: str,
        properties: dict[str, Any] | None,
        body: bytes,
        targets: list[Queue],
        wall: float,
        *,
        due: float | None = None,
        dedup_id: str | None = None,
    ) -> int:
        """A new message into ``targets`` (held back until ``due`` if given) and, with
        ``origin``, ``entry`` settled in its origin queue: one MOVE record when both
        sides are logged. Returns the LSN of the record that carries it (0: none)."""
        seq = self._store.take_seq()
        start = due if due is not None else wall
        if properties is not None and properties.get("delivery_mode", 2) != 2 and any(q.persist_all for q in targets):
            properties = dict(properties, delivery_mode=2)  # (``Broker.persist_messages``)
        expires = None
        if properties is not None and "expiration" in properties:
            expires = start + properties["expiration"] / 1000.0
        message = StoredMessage(seq, exchange_name, routing_key, body, properties, expires, enqueued_at=start)
        origin_logged = (
            origin is not None
            and entry is not None
            and origin.persistent_log
            and entry.message.persistent
            and not origin.deleted
        )
        durable_qids = [q.qid for q in targets if q.persistent_log] if message.persistent else []
        lsn = 0
        if durable_qids:
            payload = rec.encode_enqueue(
                seq, wall, expires, durable_qids, exchange_name, routing_key, dedup_id, properties, body
            )
            if origin_logged or due is not None:
                assert origin is None or entry is not None
                lsn = self._log.append_message(
                    rec.RecordType.MOVE,
                    rec.encode_move(
                        origin.qid if origin_logged and origin is not None else 0,
                        entry.message.seq if origin_logged and entry is not None else 0,
                        due,
                        payload,
                    ),
                    message,
                    list(targets),
                )
            else:
                lsn = self._log.append_message(rec.RecordType.ENQUEUE, payload, message, list(targets))
        elif origin_logged:
            assert origin is not None and entry is not None
            self._log.settle_entry(origin, entry)
        enqueue = self._store.enqueue
        for target in targets:
            enqueue(target, message, start, due=due)
        return lsn

    def redrive(
        self,
        queue_name: str,
        count: int,
        *,
        exchange: str | None = None,
        routing_key: str | None = None,
    ) -> tuple[int, str | None]:
        """Move up to ``count`` ready messages out of ``queue_name`` (a dead-letter
        queue): to ``exchange`` with ``routing_key`` (default: the message's own), or,
        without ``exchange``, back to the queue each was last dead-lettered from.
        Each move is one MOVE record: exactly once across a crash.

        Returns (messages moved, why it stopped early or None). Stops at a message it
        cannot place (no origin, or routed nowhere), which stays where it was. Moves
        only the messages ready when it began: one routed back into ``queue_name``
        (an exchange bound to it) is not moved again (RabbitMQ's shovel moves the
        queue's length at its start likewise).
        Raises NotFound, ResourceLocked, InvalidArgument, Unavailable (storage failing).
        """
        queue = self._store.queue(queue_name)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_REDRIVE:
            raise InvalidArgument(f"count must be an integer 1..{MAX_REDRIVE}")
        target_exchange = None
        if exchange is not None:
            target_exchange = self._exchanges.get(exchange)
            if target_exchange is None:
                raise NotFound(f"no exchange {exchange!r}")
        self._log.check_settles_writable(queue, "redrive")
        count = min(count, queue.ready_count())
        moved = 0
        stopped: str | None = None
        wall = self._wall_clock()
        while moved < count:
            entry = self._store.pop_live(queue)
            if entry is None:
                break
            message = entry.message
            headers = (message.properties or {}).get("headers") or {}
            if target_exchange is not None:
                ex = target_exchange
                key = routing_key if routing_key is not None else message.routing_key
            else:
                origin = headers.get("x-last-death-queue") or headers.get("x-first-death-queue")
                if not isinstance(origin, str) or origin not in self._store.queues:
                    queue.requeue(entry)
                    stopped = f"message {message.seq} has no origin queue to return to: name an exchange"
                    break
                ex = self._exchanges[DEFAULT_EXCHANGE]
                key = origin
            targets = self._topology.route(ex, key, headers)
            if not targets:
                queue.requeue(entry)
                stopped = f"message {message.seq} routes to no queue from {ex.name or '(default)'!r} with key {key!r}"
                break
            self.move(queue, entry, ex.name, key, message.properties, message.body, targets, wall)
            moved += 1
        if moved and queue.getters:
            self._getters[queue.name] = queue
        return moved, stopped


def _death_count(value: Any) -> int:
    """An ``x-death`` entry's count as a client may have sent it back: a number, or a
    tagged AMQP int64 (``{"$amqp": "int64", "value": n}``: Java clients and RabbitMQ
    send counts as AMQP longs); anything else counts as 1 rather than failing the
    dead-lettering."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return 1


def _with_death(message: StoredMessage, queue: str, reason: str, wall: float, new_key: bool) -> dict[str, Any]:
    """The dead-lettered copy's properties: the original's, without ``expiration``
    (kept in the history instead, so the copy does not expire again for it), and
    headers with RabbitMQ's ``x-death`` history updated (newest first, one entry per
    queue and reason, with a count; its ``routing-keys`` the publish's key and those
    of ``CC``) and ``x-first-death-*`` / ``x-last-death-*``. ``new_key``: the queue
    dead-letters with its own routing key, so the copy loses ``CC`` (RabbitMQ)."""
    properties = dict(message.properties or {})
    headers = dict(properties.get("headers") or {})
    original_expiration = properties.pop("expiration", None)
    now = int(wall)
    deaths = [dict(d) for d in headers.get("x-death") or () if isinstance(d, dict)]
    for i, death in enumerate(deaths):
        if death.get("queue") == queue and death.get("reason") == reason:
            death["count"] = _death_count(death.get("count")) + 1
            death["time"] = now
            deaths.insert(0, deaths.pop(i))
            break
    else:
        death = {
            "queue": queue,
            "reason": reason,
            "count": 1,
            "time": now,
            "exchange": message.exchange,
            "routing-keys": [message.routing_key, *header_routes(headers)],
        }
        if original_expiration is not None:
            death["original-expiration"] = str(original_expiration)
        deaths.insert(0, death)
    headers["x-death"] = deaths
    if "x-first-death-queue" not in headers:
        headers["x-first-death-queue"] = queue
        headers["x-first-death-reason"] = reason
        headers["x-first-death-exchange"] = message.exchange
    headers["x-last-death-queue"] = queue
    headers["x-last-death-reason"] = reason
    headers["x-last-death-exchange"] = message.exchange
    if new_key:
        headers.pop("CC", None)
    properties["headers"] = headers
    return properties
