"""Publishing: taking a message into its queues, and its confirm.

``publish`` routes (topology; with the keys of the ``CC`` and ``BCC`` headers too,
taking ``BCC`` out of the message: senderselected.py), deduplicates (the log's window)
and enqueues (queue store) a message and logs its ENQUEUE record; the confirm waits
for that record's LSN (``MessageLog.release_confirms``). A publish made with
``dedup=False`` (AMQP's, unless its connection asks for deduplication) skips the
window: it is neither looked up nor remembered, and its record carries no
deduplication id (the record's ``message_id`` field is that id, which replay
remembers; the message's properties keep its ``message_id`` for delivery). A
transactional channel's publishes are held until its commit (transactions.py). A
publish to the default exchange that routes nowhere and whose key is a direct
reply-to address is a reply, handed to its requester (directreply.py): the one test
it costs is on that unroutable path, never on a routed publish.

This is the per-message path: collaborators' methods are bound once, in the
constructor, not looked up through other objects per message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import records as rec
from .constants import NO_ROUTE, PublishResult
from .deadletter import DeadLetters
from .delayheader import header_delay
from .delivery import Deliveries
from .directreply import DirectReplies, is_reply
from .effects import Return
from .entities import MAX_TX_BYTES, MAX_TX_OPS, ChannelState, Queue
from .errors import InvalidArgument
from .log import MessageLog
from .message import Entry, StoredMessage
from .names import check_routing_key
from .queues import QueueStore
from .routing import DELAYED_MESSAGE
from .senderselected import without_bcc
from .shared import Outbox
from .topology import Topology

__all__ = ["Publishing"]


class Publishing:
    """Publishes (see the module docstring)."""

    def __init__(
        self,
        deliveries: Deliveries,
        topology: Topology,
        queues: QueueStore,
        dead_letters: DeadLetters,
        log: MessageLog,
        outbox: Outbox,
        stats: dict[str, int],
        *,
        wall_clock: Callable[[], float],
        replies: DirectReplies,
    ) -> None:
        self._channel = deliveries.channel
        self._channels = deliveries.channels
        self._exchanges = topology.exchanges
        self._route_publish = topology.route_publish
        self._take_seq = queues.take_seq
        self._enqueue = queues.enqueue
        self._dead_letter = dead_letters.dead_letter
        self._log = log
        self._append_message = log.append_message
        self._confirms_due = log.confirms_due
        self._dedup = log.dedup
        self._emit = outbox.emit
        self._stats = stats
        self._wall_clock = wall_clock
        self._deliver_reply = replies.deliver_reply

    def publish(
        self,
        channel_id: int,
        exchange_name: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None = None,
        *,
        mandatory: bool = False,
        delay_s: float | None = None,
        dedup: bool = True,
    ) -> PublishResult:
        """Publish a message; return (publish tag, queues routed to).

        The publish is always answered later by exactly one ``Confirm`` effect for
        its tag (and preceded by a ``Return`` if mandatory and unroutable). Errors of
        the message itself (unknown exchange, storage failing, queue full) become a
        nack, not an exception. ``properties`` must already be validated
        (``check_properties``). ``delay_s`` (validated: ``check_delay``) holds the
        message back in its queues until then; its TTL counts from that time. A
        publish to an ``x-delayed-message`` exchange without ``delay_s`` takes its
        delay from its ``x-delay`` header (delayheader.py).
        ``dedup`` False: the publish is taken even if its ``message_id`` was seen
        within the window, and is not remembered there (RabbitMQ's way).

        Raises: ``InvalidArgument`` for a routing key over 255 bytes (every entry
        point, REST and channels alike, is refused the same way), ``ChannelError``
        for an unknown channel.
        """
        check_routing_key(routing_key)
        ch = self._channel(channel_id)
        if ch.tx is not None:
            return self._hold_publish(ch, exchange_name, routing_key, body, properties, mandatory, delay_s, dedup), 0
        ch.publish_seq += 1
        tag = ch.publish_seq
        self._stats["published"] += 1
        return tag, self.publish_tagged(ch, tag, exchange_name, routing_key, body, properties, mandatory, delay_s, dedup)

    def refuse_publish(self, channel_id: int, reason: str) -> int | None:
        """A publish the runtime refused before routing it (publishing blocked by a
        memory or disk alarm, or its deadline passed while it waited): numbered like
        any publish and nacked with ``reason``, so its confirm keeps its place among
        the channel's. Returns its tag; None on a transactional channel, whose
        publishes are only applied at the commit (the caller publishes it then)."""
        ch = self._channel(channel_id)
        if ch.tx is not None:
            return None
        ch.publish_seq += 1
        tag = ch.publish_seq
        self._stats["published"] += 1
        self._confirms_due(ch)
        ch.confirms.add(tag, 0, False, reason)
        return tag

    def publish_tagged(
        self,
        ch: ChannelState,
        tag: int,
        exchange_name: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        mandatory: bool,
        delay_s: float | None,
        dedup: bool = True,
    ) -> int:
        """Route and enqueue a publish already numbered ``tag``; return the number of
        queues it reached (see :meth:`publish`)."""
        channel_id = ch.id
        self._confirms_due(ch)
        exchange = self._exchanges.get(exchange_name)
        if exchange is None:
            ch.confirms.add(tag, 0, False, f"not_found: no exchange {exchange_name!r}")
            return 0
        if exchange.internal:
            ch.confirms.add(tag, 0, False, f"access_refused: exchange {exchange_name!r} is internal")
            return 0
        exchange.messages_in += 1

        wall = self._wall_clock()
        # the deduplication id (None: not deduplicated, see the module docstring)
        message_id = properties.get("message_id") if properties and dedup else None
        if message_id is not None:
            seen_lsn = self._dedup.lookup(exchange_name, message_id, wall)
            if seen_lsn is not None:
                self._stats["deduplicated"] += 1
                ch.confirms.add(tag, seen_lsn)
                return 0

        headers = properties.get("headers") if properties else None
        # (with the keys of CC and BCC too: senderselected.py)
        queues = self._route_publish(exchange, routing_key, headers)
        if headers and "BCC" in headers:  # routed with, not kept (logged, delivered or returned)
            properties = dict(properties or {}, headers=without_bcc(headers))  # (a copy: the caller's stays)
        if not queues:
            if is_reply(exchange_name, routing_key):
                # a direct reply: to its requester, if there (and still unroutable)
                self._deliver_reply(exchange_name, routing_key, body, properties)
            if mandatory:
                # handed back, not taken: a resend (once a queue is bound) must land
                self._stats["returned"] += 1
                message = StoredMessage(0, exchange_name, routing_key, body, properties)
                returned = Return(channel_id, tag, NO_ROUTE, "NO_ROUTE", message)
                if not ch.confirms.hold_return(tag, returned):
                    self._emit(returned)
            elif message_id is not None:
                self._dedup.remember(exchange_name, message_id, wall, 0)
            ch.confirms.add(tag, 0)
            return 0
        exchange.messages_out += 1
        if exchange.type == DELAYED_MESSAGE and delay_s is None:
            # RabbitMQ's delayed-message exchange: the x-delay header is the delay (a
            # return above hands the message back as it was published)
            delay_s, properties = header_delay(properties)

        persistent = properties is None or properties.get("delivery_mode", 2) == 2
        if not persistent and _persists_all(queues):
            properties = dict(properties or {}, delivery_mode=2)  # (a copy: the caller's stays)
            persistent = True
        durable_qids: list[int] = []
        if persistent:
            durable_qids = [q.qid for q in queues if q.persistent_log]
            if durable_qids:
                log = self._log
                if not log.storage_ok:
                    ch.confirms.add(tag, 0, False, f"storage failure: {log.storage_reason}")
                    return 0
                if log.publish_refusal is not None:
                    ch.confirms.add(tag, 0, False, log.publish_refusal)
                    return 0
        nack_reason = None
        full: list[Queue] = []
        refused: list[Queue] | None = None
        for queue in queues:
            if queue.refusal is not None:
                nack_reason = queue.refusal
                refused = [queue] if refused is None else [*refused, queue]
            elif queue.overflow != "drop-head" and queue.is_full(len(body)):
                nack_reason = f"queue {queue.name!r} is full (x-overflow {queue.overflow})"
                full.append(queue)
        if full or refused:
            # RabbitMQ semantics: the publish is nacked; queues with room keep it.
            queues = [q for q in queues if q not in full and (refused is None or q not in refused)]
            durable_qids = [q.qid for q in queues if persistent and q.persistent_log]

        seq = self._take_seq()
        due = wall + delay_s if delay_s else None
        msg_expires = None
        if properties is not None and "expiration" in properties:
            msg_expires = (due or wall) + properties["expiration"] / 1000.0
        message = StoredMessage(seq, exchange_name, routing_key, body, properties, msg_expires, enqueued_at=due or wall)
        # A nacked publish is not remembered for deduplication (neither live nor in
        # its ENQUEUE record): the nack asks the client to resend, and the resend
        # must be taken, not acked as a duplicate of a message that was refused.
        dedup_id = message_id if nack_reason is None else None
        lsn = 0
        if durable_qids:
            payload = rec.encode_enqueue(
                seq, wall, msg_expires, durable_qids, exchange_name, routing_key,
                dedup_id, properties, body,
            )
            # (``queues`` is a list of its own: route's)
            if due is None:
                lsn = self._append_message(rec.RecordType.ENQUEUE, payload, message, queues)
            else:  # the due time goes in the same record: a confirm covers both
                lsn = self._append_message(rec.RecordType.MOVE, rec.encode_move(0, 0, due, payload), message, queues)
        enqueue = self._enqueue
        for queue in queues:
            enqueue(queue, message, due or wall, due=due)
        if dedup_id is not None:
            self._dedup.remember(exchange_name, dedup_id, wall, lsn)
        if nack_reason is not None:
            ch.confirms.add(tag, 0, False, nack_reason)
        else:
            ch.confirms.add(tag, lsn)
        for queue in full:
            if queue.overflow == "reject-publish-dlx":
                # refused by this queue, dead-lettered from it (RabbitMQ's reject-publish-dlx);
                # a cluster may hold this publish's confirm (its nack) for the dead letter
                self._dead_letter(queue, Entry(message, 0, msg_expires), "maxlen", refused=(channel_id, tag))
        return len(queues)

    def hold_confirm(self, channel_id: int, tag: int | None, answers: int) -> int | None:
        """The confirm of publish ``tag`` (the channel's last; None: a new tag for a
        publish that reaches no queue here) also waits for ``answers`` answers from
        elsewhere (a cluster forwards it to the queues' owners), given with
        :meth:`settle_held_confirm`. Returns the tag, or None when it cannot be held
        (a transaction holds the publish itself until its commit)."""
        ch = self._channel(channel_id)
        if ch.tx is not None:
            return None
        if tag is None:
            ch.publish_seq += 1
            tag = ch.publish_seq
            self._stats["published"] += 1
            self._confirms_due(ch)
            ch.confirms.add(tag, 0)
        return tag if ch.confirms.hold(tag, answers) else None

    def settle_held_confirm(self, channel_id: int, tag: int, ack: bool, reason: str | None) -> None:
        """One answer the confirm of ``tag`` waits for (see :meth:`hold_confirm`);
        ignored when the channel has ended meanwhile."""
        ch = self._channels.get(channel_id)
        if ch is not None and ch.confirms.settle_hold(tag, ack, reason):
            self._confirms_due(ch)

    def restore(
        self,
        queue: Queue,
        exchange_name: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        wall: float,
        deliveries: int,
        due: float | None = None,
        dedup: bool = True,
    ) -> int:
        """Put one message into ``queue`` as another copy of the queue held it (a
        replica taking a replicated queue over): logged like a publish (with its due
        time when it is held back until ``due``), remembered by the deduplication
        window under its exchange unless it was published with ``dedup`` False, and
        counted as delivered ``deliveries`` times (redelivered when more than 0). No
        confirm: nobody published it here. Returns its seq."""
        seq = self._take_seq()
        start = due if due is not None else wall
        msg_expires = None
        if properties is not None and "expiration" in properties:
            msg_expires = start + properties["expiration"] / 1000.0
        message = StoredMessage(seq, exchange_name, routing_key, body, properties, msg_expires, enqueued_at=start)
        message_id = message.message_id if dedup else None
        lsn = 0
        if queue.persistent_log and message.persistent:
            payload = rec.encode_enqueue(
                seq, wall, msg_expires, [queue.qid], exchange_name, routing_key, message_id, properties, body
            )
            if due is None:
                lsn = self._append_message(rec.RecordType.ENQUEUE, payload, message, [queue])
            else:
                lsn = self._append_message(rec.RecordType.MOVE, rec.encode_move(0, 0, due, payload), message, [queue])
        self._enqueue(queue, message, start, due=due, deliveries=deliveries)
        if deliveries and lsn:
            self._log.mark_delivered(queue.qid, seq)
            if deliveries > 1:
                self._log.mark_count(queue.qid, seq, deliveries)
        if message_id is not None:
            self._dedup.remember(exchange_name, message_id, wall, lsn)
        return seq

    def remember_message_id(self, exchange_name: str, message_id: str, wall: float) -> None:
        """A publish another copy took (and settled) must not land here again: its
        message id joins the deduplication window."""
        self._dedup.remember(exchange_name, message_id, wall, 0)

    def _hold_publish(
        self,
        ch: ChannelState,
        exchange_name: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        mandatory: bool,
        delay_s: float | None,
        dedup: bool,
    ) -> int:
        """Hold a publish for the commit (with its ``dedup`` flag); return its tag."""
        tx = ch.tx
        assert tx is not None
        if tx.bytes + len(body) > MAX_TX_BYTES or len(tx.publishes) + len(tx.settles) >= MAX_TX_OPS:
            raise InvalidArgument(
                f"transaction too large (at most {MAX_TX_OPS} operations and {MAX_TX_BYTES} bytes of messages)",
                code="payload_too_large",
            )
        ch.publish_seq += 1
        self._stats["published"] += 1
        tx.bytes += len(body)
        tx.publishes.append((ch.publish_seq, (exchange_name, routing_key, body, properties, mandatory, delay_s, dedup)))
        return ch.publish_seq


def _persists_all(queues: list[Queue]) -> bool:
    """Whether one of ``queues`` makes every message persistent (``Queue.persist_all``)."""
    for queue in queues:
        if queue.persist_all:
            return True
    return False
