"""Publishing: taking a message into its queues, and paging queued bodies to the log.

``publish`` routes, deduplicates and enqueues a message and logs its ENQUEUE record;
the confirm waits for that record's LSN (timers.py releases it). A durable queue keeps
only ``memory_messages_per_queue`` ready messages in memory (a priority queue shares
them among its lanes): the rest are paged out (their bodies stay only in the log,
indexed by LSN) and read back in batches when their turn comes.

The methods here belong to :class:`~broker.core.broker.Broker`; they share its state
(:class:`~broker.core.state.BrokerState`).
"""

from __future__ import annotations

from struct import error as struct_error
from typing import Any

from . import records as rec
from .effects import (
    LogReadFailed,
    MessageLost,
    Return,
)
from .entities import Channel, Queue
from .lanes import Lane
from .message import Entry, Message
from .names import check_routing_key
from .state import (
    NO_ROUTE,
    PAGE_IN_BATCH,
    BrokerState,
    PublishResult,
)

__all__ = ["PublishingMixin"]


#: Backoff between tries to read a paged-out message back after a failure.
READ_RETRY_MIN_S = 0.05
READ_RETRY_MAX_S = 30.0
#: A transient read failure of a queue's head is retried in place this many times
#: (about 3 s of backoff: a passing EMFILE keeps the queue's order) before the message
#: is set aside so that the ones behind it are served.
READ_SET_ASIDE_ATTEMPTS = 6


class PublishingMixin(BrokerState):
    """Publishing (see the module docstring)."""

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
    ) -> PublishResult:
        """Publish a message; return (publish tag, queues routed to).

        The publish is always answered later by exactly one ``Confirm`` effect for
        its tag (and preceded by a ``Return`` if mandatory and unroutable). Errors of
        the message itself (unknown exchange, storage failing, queue full) become a
        nack, not an exception. ``properties`` must already be validated
        (``check_properties``). ``delay_s`` (validated: ``check_delay``) holds the
        message back in its queues until then; its TTL counts from that time.

        Raises: ``InvalidArgument`` for a routing key over 255 bytes (every entry
        point, REST and channels alike, is refused the same way), ``ChannelError``
        for an unknown channel.
        """
        check_routing_key(routing_key)
        ch = self._channel(channel_id)
        if ch.tx is not None:
            return self._tx_publish(ch, exchange_name, routing_key, body, properties, mandatory, delay_s), 0
        ch.publish_seq += 1
        tag = ch.publish_seq
        self.stats["published"] += 1
        return tag, self._publish_tagged(ch, tag, exchange_name, routing_key, body, properties, mandatory, delay_s)

    def _publish_tagged(
        self,
        ch: Channel,
        tag: int,
        exchange_name: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        mandatory: bool,
        delay_s: float | None,
    ) -> int:
        """Route and enqueue a publish already numbered ``tag``; return the number of
        queues it reached (see :meth:`publish`)."""
        channel_id = ch.id
        self._confirm_dirty[channel_id] = ch
        exchange = self.exchanges.get(exchange_name)
        if exchange is None:
            ch.confirms.add(tag, 0, False, f"not_found: no exchange {exchange_name!r}")
            return 0
        if exchange.internal:
            ch.confirms.add(tag, 0, False, f"access_refused: exchange {exchange_name!r} is internal")
            return 0

        wall = self.wall_clock()
        message_id = properties.get("message_id") if properties else None
        if message_id is not None:
            seen_lsn = self.dedup.lookup(exchange_name, message_id, wall)
            if seen_lsn is not None:
                self.stats["deduplicated"] += 1
                ch.confirms.add(tag, seen_lsn)
                return 0

        headers = properties.get("headers") if properties else None
        queues = self.route(exchange, routing_key, headers)
        if not queues:
            if mandatory:
                self.stats["returned"] += 1
                message = Message(0, exchange_name, routing_key, body, properties)
                returned = Return(channel_id, tag, NO_ROUTE, "NO_ROUTE", message)
                if not ch.confirms.hold_return(tag, returned):
                    self._effects.append(returned)
            if message_id is not None:
                self.dedup.remember(exchange_name, message_id, wall, 0)
            ch.confirms.add(tag, 0)
            return 0

        persistent = properties is None or properties.get("delivery_mode", 2) == 2
        durable_qids: list[int] = []
        if persistent:
            durable_qids = [q.qid for q in queues if q.persistent_log]
            if durable_qids and not self.storage_ok:
                ch.confirms.add(tag, 0, False, f"storage failure: {self.storage_reason}")
                return 0
            if durable_qids and self.publish_refusal is not None:
                ch.confirms.add(tag, 0, False, self.publish_refusal)
                return 0
        nack_reason = None
        full: list[Queue] = []
        for queue in queues:
            if queue.overflow != "drop-head" and queue.is_full(len(body)):
                nack_reason = f"queue {queue.name!r} is full (x-overflow {queue.overflow})"
                full.append(queue)
        if full:
            # RabbitMQ semantics: the publish is nacked; queues with room keep it.
            queues = [q for q in queues if q not in full]
            durable_qids = [q.qid for q in queues if persistent and q.persistent_log]

        seq = self._next_seq
        self._next_seq += 1
        due = wall + delay_s if delay_s else None
        msg_expires = None
        if properties is not None and "expiration" in properties:
            msg_expires = (due or wall) + properties["expiration"] / 1000.0
        message = Message(seq, exchange_name, routing_key, body, properties, msg_expires, enqueued_at=due or wall)
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
            if due is None:
                lsn = self._append(rec.RecordType.ENQUEUE, payload)
            else:  # the due time goes in the same record: a confirm covers both
                lsn = self._append(rec.RecordType.MOVE, rec.encode_move(0, 0, due, payload))
            message.lsn = lsn
            self._unsynced.append((lsn, message, queues))  # a list of its own (route's)
        for queue in queues:
            self._enqueue(queue, message, due or wall, due=due)
        for queue in full:
            if queue.overflow == "reject-publish-dlx":
                # refused by this queue, dead-lettered from it (RabbitMQ's reject-publish-dlx)
                self._dead_letter(queue, Entry(message, 0, msg_expires), "maxlen")
        if dedup_id is not None:
            self.dedup.remember(exchange_name, dedup_id, wall, lsn)
        if nack_reason is not None:
            ch.confirms.add(tag, 0, False, nack_reason)
        else:
            ch.confirms.add(tag, lsn)
        return len(queues)

    def _enqueue(self, queue: Queue, message: Message, wall: float, *, due: float | None = None) -> None:
        """Add ``message`` to ``queue`` at ``wall`` (its TTL counts from then), or hold
        it back until ``due``."""
        expires = message.expires_at
        if queue.message_ttl_s is not None:
            q_exp = wall + queue.message_ttl_s
            expires = q_exp if expires is None else min(expires, q_exp)
        entry = Entry(message, 0, expires)
        if due is not None:
            queue.published += 1
            self._hold_back(queue, entry, due)
            return
        # an expiry must wake the queue in time (scheduled once it is in place)
        schedule = expires is not None and queue.wake_at is None
        lane = queue.lanes[0] if queue.max_priority is None else queue.lane_for(message)
        if lane.tail or lane.paged:
            lane.tail.append(entry)
            self._page_out_due[queue.name] = queue
        elif (
            len(lane.ready) < (self.memory_messages_per_queue if queue.max_priority is None else self._lane_memory(queue))
            or self.read_log is None
            or not queue.persistent_log
            or queue.max_length_bytes is not None  # (bounded by it: see Queue.ready_bytes)
        ):
            lane.ready.append(entry)
        else:
            lane.tail.append(entry)
            self._page_out_due[queue.name] = queue
        queue.published += 1
        if queue.max_length_bytes is not None:
            queue.ready_bytes += len(message.body)
        if schedule:
            self._schedule_queue(queue)
        if (queue.max_length is not None or queue.max_length_bytes is not None) and queue.overflow == "drop-head":
            while queue.over_limit():
                self._drop_head(queue)
        if queue.consumers:
            self._dirty_queues[queue.name] = queue
        if queue.getters:
            self._getter_checks[queue.name] = queue

    def _lane_memory(self, queue: Queue) -> int:
        """How many ready messages each lane of a priority queue keeps in memory: the
        queue's share, divided among its lanes."""
        return max(1, self.memory_messages_per_queue // len(queue.lanes))

    def _settle_entry(self, queue: Queue, entry: Entry) -> None:
        if queue.persistent_log and entry.message.persistent and not queue.deleted:
            self._settles.setdefault(queue.qid, []).append(entry.message.seq)

    def _drop_head(self, queue: Queue) -> None:
        """Drop the oldest ready message (x-overflow drop-head): dead-letter it
        (reason ``maxlen``), reading it back first only when there is somewhere to
        dead-letter it to."""
        entry = queue.pop()
        if entry is None and queue.dead_letter_exchange is not None:
            self._page_in(queue)
            entry = queue.pop()
        if entry is not None:
            self._dead_letter(queue, entry, "maxlen")
            return
        lane = queue.next_lane()
        for seq, _loc in lane.paged.take(1) if lane is not None else ():
            queue.dead_lettered["maxlen"] = queue.dead_lettered.get("maxlen", 0) + 1
            queue.paged_counts.pop(seq, None)
            self._settles.setdefault(queue.qid, []).append(seq)

    def _page_out(self) -> None:
        """Move the messages at the front of each due queue's tails whose records are
        written into its paged-out index, dropping their bodies from memory."""
        durable = self.durable_lsn
        for name, queue in list(self._page_out_due.items()):
            if queue.deleted:
                del self._page_out_due[name]
                continue
            waiting = False
            for lane in queue.lanes:
                if lane.tail and self._page_out_lane(queue, lane, durable):
                    waiting = True
            if not waiting:
                del self._page_out_due[name]

    @staticmethod
    def _page_out_lane(queue: Queue, lane: Lane, durable: int) -> bool:
        """Page out the front of ``lane``'s tail up to LSN ``durable``; whether some of
        it waits for a later ``durable()`` (not when a message that was never logged
        stops it: that one stays in memory, and so does everything after it)."""
        tail = lane.tail
        paged = lane.paged
        while tail:
            message = tail[0].message
            lsn = message.lsn
            if lsn == 0 or not message.persistent:
                return False
            if lsn > durable:
                return True
            entry = tail.popleft()
            paged.append(message.seq, (lsn << 1) | (entry.deliveries > 0))
            if entry.deliveries > 1:
                queue.paged_counts[message.seq] = entry.deliveries
        return False

    def _page_in(self, queue: Queue) -> None:
        """Read the next paged-out messages of ``queue`` back into its in-memory head.

        A read that fails never discards a message, and a ``LogReadFailed`` effect
        raises the alarm. The message and those after it go back to the front of the
        paged-out index and the queue delivers nothing more until a retry (with
        backoff, on the timer heap) reads it. But a *transient* failure (the operating
        system failed the read: the record may be intact) that outlasts
        ``READ_SET_ASIDE_ATTEMPTS`` retries sets that one message aside, held back like
        a delayed message until a retry reads it and puts it back in its place, while
        the messages behind it are served: a bad read never blocks a queue for good.
        When the very next record fails too, the log cannot be read at all: the queue
        waits as before. Only with ``repair`` is a record that is really
        unreadable (not a transient error) given up, as MessageLost."""
        lane = queue.next_lane()
        if lane is None:
            return
        set_aside = False  # one message per call: a second failure means the log is down
        while lane.paged and not lane.ready:
            if queue.read_blocked_until is not None:
                return  # a retry is scheduled (see TimersMixin.advance)
            pairs = lane.paged.take(PAGE_IN_BATCH)
            read_log = self.read_log
            if read_log is None:
                raise RuntimeError("messages are indexed by LSN but the broker has no log to read")
            results = read_log([loc >> 1 for _seq, loc in pairs])
            failure: str | None = None
            ready = lane.ready
            i = 0
            for (seq, loc), result in zip(pairs, results):
                r = _logged_message(result, seq, loc >> 1)
                if isinstance(r, str):
                    # a failed read keeps its ``transient`` flag; a wrong record is not
                    failure = result if isinstance(result, str) else r
                    break
                ready.append(self._entry_of(queue, loc, r))
                if queue.paged_counts:
                    queue.paged_counts.pop(seq, None)
                if queue.max_length_bytes is not None:  # (left paged by a failed read at start)
                    queue.ready_bytes += len(r.body)
                i += 1
            if failure is None:
                if queue.read_failure is not None and not set_aside:
                    queue.read_failure = None
                    queue.read_attempts = 0
                continue
            transient = bool(getattr(failure, "transient", False))
            seq, loc = pairs[i]
            if self.config.repair and not transient:
                # the operator chose to give up on unreadable records
                self._settles.setdefault(queue.qid, []).append(seq)
                self._effects.append(MessageLost(queue.name, seq, loc >> 1, failure))
                lane.paged.put_back(pairs[i + 1 :])
                continue
            queue.read_attempts += 1
            delay = min(READ_RETRY_MAX_S, READ_RETRY_MIN_S * 2 ** (queue.read_attempts - 1))
            queue.read_failure = str(failure)
            self._effects.append(LogReadFailed(queue.name, loc >> 1, str(failure), transient, delay))
            if (
                transient
                and not set_aside
                and queue.read_attempts > READ_SET_ASIDE_ATTEMPTS
                and (len(pairs) > i + 1 or lane.paged)
            ):
                # held back like a delayed message: retried by _release_due, which puts
                # it back in its place once read (and backs off while it fails)
                set_aside = True
                queue.delayed.push_paged(round((self.wall_clock() + delay) * 1000.0), seq, loc)
                lane.paged.put_back(pairs[i + 1 :])
                self._schedule_queue(queue)
                continue
            lane.paged.put_back(pairs[i:])
            queue.read_blocked_until = self.clock() + delay
            self._schedule_queue(queue)
            return

    def _load_paged(self, queue: Queue) -> None:
        """Read every paged-out message of ``queue`` into memory, counting its bytes
        (a recovered queue with ``x-max-length-bytes``, see ``Queue.ready_bytes``). A
        read that fails leaves the rest paged out: read when their turn comes."""
        read_log = self.read_log
        for lane in queue.lanes:
            while lane.paged and read_log is not None:
                pairs = lane.paged.take(PAGE_IN_BATCH)
                results = read_log([loc >> 1 for _seq, loc in pairs])
                for i, ((seq, loc), result) in enumerate(zip(pairs, results)):
                    r = _logged_message(result, seq, loc >> 1)
                    if isinstance(r, str):
                        lane.paged.put_back(pairs[i:])
                        return
                    lane.ready.append(self._entry_of(queue, loc, r))
                    queue.paged_counts.pop(seq, None)
                    queue.ready_bytes += len(r.body)

    def _entry_of(self, queue: Queue, loc: int, r: rec.EnqueueRecord) -> Entry:
        """The queue entry of a message read back from its record at ``loc``."""
        lsn = loc >> 1
        message = Message(
            r.seq, r.exchange, r.routing_key, r.body, r.properties, r.expires_at, owned=True, enqueued_at=r.wall_s
        )
        message.lsn = lsn
        expires = r.expires_at
        ttl = queue.message_ttl_s
        if ttl is not None and r.wall_s:
            q_exp = r.wall_s + ttl
            expires = q_exp if expires is None else min(expires, q_exp)
        return Entry(message, max(loc & 1, queue.paged_counts.get(r.seq, 0)), expires)

    def _read_entries(self, queue: Queue, pairs: list[tuple[int, int]]) -> list[Entry]:
        """Entries for ``(seq, locator)`` pairs of ``queue``, read from the log (the
        restore of a queue from an older checkpoint, at recovery).

        A message whose record cannot be read (a damaged or missing segment) leaves the
        queue for good, reported as a MessageLost effect: recovery has already refused
        to start on a damaged log unless the operator asked to repair it."""
        read_log = self.read_log
        if read_log is None:
            raise RuntimeError("messages are indexed by LSN but the broker has no log to read")
        results = read_log([loc >> 1 for _seq, loc in pairs])
        out: list[Entry] = []
        for (seq, loc), result in zip(pairs, results):
            r = _logged_message(result, seq, loc >> 1)
            if isinstance(r, str):
                self._settles.setdefault(queue.qid, []).append(seq)
                self._effects.append(MessageLost(queue.name, seq, loc >> 1, r))
                continue
            out.append(self._entry_of(queue, loc, r))
        return out

    def _pop(self, queue: Queue) -> Entry | None:
        entry = queue.pop()
        if entry is None:
            lane = queue.next_lane()
            if lane is not None and lane.paged:
                self._page_in(queue)
                entry = queue.pop()
        return entry

    def _pop_live(self, queue: Queue) -> Entry | None:
        """The next ready entry, dropping expired ones on the way."""
        while True:
            entry = self._pop(queue)
            if entry is None:
                return None
            if entry.expires_at is not None and entry.expires_at <= self.wall_clock():
                self._dead_letter(queue, entry, "expired")
                continue
            return entry



def _logged_message(result: tuple[int, bytes] | str, seq: int, lsn: int) -> rec.EnqueueRecord | str:
    """Message ``seq``'s ENQUEUE record as read back from LSN ``lsn``, or why it is not."""
    if isinstance(result, str):
        return result
    rtype, payload = result
    due = None
    try:
        if rtype == rec.RecordType.MOVE:
            _qid, _seq, due, payload = rec.decode_move(payload)
        elif rtype == rec.RecordType.SCHEDULE_TICK:
            _name, _tick, payload = rec.decode_tick(payload)
        elif rtype != rec.RecordType.ENQUEUE:
            return f"record {lsn} is of type {rtype}, not a message"
        r = rec.decode_enqueue(payload)
        if due is not None and due > r.wall_s:
            r.wall_s = due  # a delayed publish enters its queues (and its TTL starts) when due
    except (ValueError, IndexError, UnicodeDecodeError, struct_error) as exc:
        return f"record {lsn} does not decode: {exc}"
    if r.seq != seq:
        return f"record {lsn} holds message {r.seq}, not {seq}"
    return r
