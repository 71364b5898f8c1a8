"""The queue store: every queue, its messages in memory, paged out and delayed.

Declares, looks up, deletes and purges queues; takes messages in (:meth:`enqueue`:
lanes by priority, ``x-max-length`` overflow, page-out of a durable queue's tail once
its records are written) and hands them out (:meth:`pop_live`, paging in and expiring
on the way). Numbers messages (``take_seq``) and queues. What a queue's timer does
when it fires is queuetimers.py's; parked long-polls are longpolls.py's.

Leaving a queue for a reason (expiry, overflow) dead-letters the message, and deleting
a queue cancels its consumers and drops its bindings: those belong to the components
above the store, which :meth:`QueueStore.connect` names once (they are built after it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import records as rec
from .constants import (
    QUEUE_ARGUMENTS,
    QUEUE_DELETED,
    REST_CHANNEL,
    check_arguments,
    check_entity_arguments,
)
from .delays import Delays
from .effects import QueueAutoDeleted, QueueReady
from .entities import ChannelState, Queue
from .errors import (
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
    Unavailable,
)
from .expiry import Expiry
from .lanes import Lane
from .log import MessageLog
from .message import Entry, StoredMessage
from .names import SERVER_NAMED_PREFIX, check_name
from .pager import Pager
from .shared import Outbox, Wakeups
from .totals import Totals

__all__ = ["QueueStore", "queue_record"]


def _unconnected(*args: Any) -> None:
    raise RuntimeError("QueueStore.connect() was not called")


class QueueStore:
    """Queues and their messages (see the module docstring). Owns ``queues`` (by name),
    the queues by id, and the counters that number messages, queues and generated
    names."""

    def __init__(
        self,
        log: MessageLog,
        delays: Delays,
        pager: Pager,
        expiry: Expiry,
        outbox: Outbox,
        wakeups: Wakeups,
        totals: Totals,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        boot_id: str,
        max_queues: int,
        memory_messages_per_queue: int,
    ) -> None:
        self._log = log
        self._delays = delays
        self._pager = pager
        self._expire = expiry.expire
        self._outbox = outbox
        self._dispatch = wakeups.dispatch
        self._getters = wakeups.getters
        self._totals = totals
        self._clock = clock
        self._wall_clock = wall_clock
        self._boot_id = boot_id
        self._max_queues = max_queues
        self.memory_messages_per_queue = memory_messages_per_queue
        self.queues: dict[str, Queue] = {}
        self.by_id: dict[int, Queue] = {}
        self._next_seq = 1
        self._next_qid = 1
        self._next_name = 1
        # queues whose tail may hold messages to page out once their records are written
        self._page_out_due: dict[str, Queue] = {}
        # recovered queues whose timers (delays, expiries, x-expires) are not yet set
        self._to_schedule: list[Queue] = []
        # the components above the store (see connect())
        self._dead_letter: Callable[[Queue, Entry, str], None] = _unconnected
        self._cancel_consumers: Callable[[Queue, str], None] = _unconnected
        self._drop_bindings: Callable[[Queue], None] = _unconnected
        self._channel_open: Callable[[int], ChannelState] = _unconnected  # type: ignore[assignment]
        self._owner_of: Callable[[int], int] = _unconnected  # type: ignore[assignment]

    def connect(
        self,
        *,
        dead_letter: Callable[[Queue, Entry, str], None],
        cancel_consumers: Callable[[Queue, str], None],
        drop_bindings: Callable[[Queue], None],
        channel: Callable[[int], ChannelState],
        owner_of: Callable[[int], int],
    ) -> None:
        """Name the components above the store that it calls back: ``dead_letter`` (a
        message leaves a queue for a reason), ``cancel_consumers`` and
        ``drop_bindings`` (a queue is deleted), ``channel`` (an open channel by id, or
        ChannelError), ``owner_of`` (whose exclusive queues a channel may use: its own
        or its connection's, connections.py). Called once, by ``Broker``."""
        self._dead_letter = dead_letter
        self._cancel_consumers = cancel_consumers
        self._drop_bindings = drop_bindings
        self._channel_open = channel
        self._owner_of = owner_of

    # ------------------------------------------------------------- numbering

    def take_seq(self) -> int:
        """The sequence number of a new message."""
        seq = self._next_seq
        self._next_seq = seq + 1
        return seq

    def recovered_counters(self, next_seq: int, next_qid: int) -> None:
        """Recovery saw messages and queues numbered below these."""
        self._next_seq = max(self._next_seq, next_seq)
        self._next_qid = max(self._next_qid, next_qid)

    def add_recovered(self, queue: Queue) -> None:
        """A queue declared by a replayed record (recovery)."""
        queue.adopt(self._totals)
        self.queues[queue.name] = queue
        self.by_id[queue.qid] = queue
        self._next_qid = max(self._next_qid, queue.qid + 1)

    def drop_recovered(self, queue: Queue) -> None:
        """A replayed queue deleted or replaced by a later record (recovery)."""
        del self.queues[queue.name]
        del self.by_id[queue.qid]

    def recount_totals(self) -> None:
        """Recovery built the queues in bulk: count their messages once."""
        self._totals.recount(self.queues.values())

    def counters(self) -> tuple[int, int]:
        """(next message seq, next qid), for a checkpoint's META record."""
        return self._next_seq, self._next_qid

    # ------------------------------------------------------------- queues

    def declare_queue(
        self, name: object, *, durable: bool = True, exclusive: bool = False, auto_delete: bool = False,
        arguments: object = None, passive: bool = False, channel_id: int = REST_CHANNEL, reserved_ok: bool = False,
    ) -> tuple[Queue, bool]:
        """Declare a queue; return it and whether it was created.

        An empty name asks for a server-generated one; ``reserved_ok``: an ``amq.``
        name a broker made (a cluster's routing copy of another node's). Raises NotFound (passive,
        missing), PreconditionFailed (exists with other settings), ResourceLocked
        (exclusive to another channel), AccessRefused, InvalidArgument, Unavailable,
        ChannelError (exclusive on a channel that is not open).
        """
        arguments = check_arguments(arguments)
        generated = name == ""
        if generated:
            if passive:
                raise NotFound("no queue ''")
            # Skip names already taken (a durable server-named queue recovered
            # from a run that used the same boot id).
            while True:
                name = f"{SERVER_NAMED_PREFIX}{self._boot_id}-{self._next_name}"
                self._next_name += 1
                if name not in self.queues:
                    break
        else:
            name = check_name("queue", name, allow_reserved=True)
        if not passive:
            # Validated before comparing with an existing queue: an invalid declaration
            # is the same error (InvalidArgument) whether or not the queue exists.
            check_entity_arguments("queue", arguments, QUEUE_ARGUMENTS)
            if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
                raise InvalidArgument("x-dead-letter-routing-key needs x-dead-letter-exchange")
            if exclusive and channel_id == REST_CHANNEL:
                raise InvalidArgument("exclusive queues belong to a channel: declare them on one")
        existing = self.queues.get(name)
        owner = self._owner_of(channel_id)
        if existing is not None:
            if existing.exclusive_owner is not None and existing.exclusive_owner != owner:
                raise ResourceLocked(f"queue {name!r} is exclusive to another channel")
            if not passive and (existing.exclusive_owner is not None) != exclusive:  # (RabbitMQ's 405)
                raise ResourceLocked(f"queue {name!r} exists with exclusive={not exclusive}")
            if not passive and existing.settings() != (durable, exclusive, auto_delete, arguments):
                raise PreconditionFailed(
                    f"queue {name!r} exists with other settings (durable={existing.durable}, "
                    f"exclusive={existing.exclusive_owner is not None}, "
                    f"auto_delete={existing.auto_delete}, arguments={existing.arguments})"
                )
            self._delays.touch_queue(existing)
            return existing, False
        if passive:
            raise NotFound(f"no queue {name!r}")
        if not generated and not reserved_ok:  # only the broker may create amq.* queues
            check_name("queue", name)
        if exclusive:
            self._channel_open(channel_id)  # ChannelError before anything changes
        if len(self.queues) >= self._max_queues:
            raise Unavailable(f"queue limit reached ({self._max_queues})", code="limit_reached")
        if durable and not exclusive and not self._log.storage_ok:
            raise Unavailable(f"storage is failing: {self._log.storage_reason}", code="storage_failed")
        queue = Queue(
            self._next_qid, name, durable, owner if exclusive else None, auto_delete, arguments
        )
        self._next_qid += 1
        queue.adopt(self._totals)
        self.queues[name] = queue
        self.by_id[queue.qid] = queue
        if exclusive:
            self._channel_open(channel_id).exclusive_queues.add(name)
        if queue.persistent_log:
            self._log.append(rec.RecordType.DECLARE_QUEUE, rec.encode_json(queue_record(queue)))
        self._delays.touch_queue(queue)
        # every queue is bound to the default exchange by its name (implicitly)
        return queue, True

    def queue(self, name: str, channel_id: int = REST_CHANNEL) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            raise NotFound(f"no queue {name!r}")
        if queue.exclusive_owner is not None and queue.exclusive_owner != self._owner_of(channel_id):
            raise ResourceLocked(f"queue {name!r} is exclusive to another channel")
        return queue

    def delete_queue(
        self, name: str, *, if_unused: bool = False, if_empty: bool = False, channel_id: int = REST_CHANNEL,
        reason: str = QUEUE_DELETED,
    ) -> int:
        """Delete a queue; return how many ready messages it held.

        Its consumers are cancelled (``ConsumerCancelled`` with ``reason``: a caller
        that removes the queue from this core for another reason than a delete says
        so there); its unacked deliveries stay with their channels and are simply
        forgotten when settled.
        Raises NotFound, ResourceLocked, PreconditionFailed (if_unused / if_empty).
        """
        queue = self.queue(name, channel_id)
        if if_unused and queue.consumers:
            raise PreconditionFailed(f"queue {name!r} has consumers")
        if if_empty and queue.ready_count():
            raise PreconditionFailed(f"queue {name!r} is not empty")
        return self.remove_queue(queue, reason)

    def remove_queue(self, queue: Queue, reason: str, *, by_itself: bool = False) -> int:
        """Delete ``queue`` (consumers cancelled with ``reason``, bindings dropped);
        return how many ready messages it held. ``by_itself``: no client asked for it
        (``QueueAutoDeleted``: auto-delete, x-expires, exclusive owner gone)."""
        count = queue.ready_count()
        queue.deleted = True
        if by_itself:
            self._outbox.emit(QueueAutoDeleted(queue.name, reason))
        if queue.getters:
            self._outbox.emit(QueueReady(queue.name))  # parked gets answer 404 now
        self._cancel_consumers(queue, reason)
        queue.clear_ready()
        self._totals.unacked -= queue.unacked  # (forgotten when settled: see finish_delivery)
        self._page_out_due.pop(queue.name, None)
        self._drop_bindings(queue)
        del self.queues[queue.name]
        del self.by_id[queue.qid]
        self._dispatch.pop(queue.name, None)
        if queue.persistent_log:
            self._log.forget_queue(queue.qid)
            self._log.append(rec.RecordType.DELETE_QUEUE, rec.encode_json({"qid": queue.qid}))
        return count

    def purge_queue(self, name: str, *, channel_id: int = REST_CHANNEL) -> int:
        """Drop every ready or delayed message of a queue (not the unacked ones); return
        the count.

        Raises: NotFound; Unavailable (``storage_failed``) while the log cannot be
        written and the queue logs its messages: a purge whose records cannot be
        written would come undone at the next start, so it is not reported done."""
        queue = self.queue(name, channel_id)
        self._log.check_settles_writable(queue, "purge")
        entries, paged_seqs = queue.clear_ready()
        self._page_out_due.pop(queue.name, None)
        if queue.persistent_log:
            seqs = [e.message.seq for e in entries if e.message.persistent]
            seqs.extend(paged_seqs)
            if seqs:
                self._log.settle_seqs(queue.qid, seqs)
        return len(entries) + len(paged_seqs)

    # ------------------------------------------------------------- messages

    def enqueue(
        self, queue: Queue, message: StoredMessage, wall: float, *, due: float | None = None, deliveries: int = 0
    ) -> None:
        """Add ``message`` to ``queue`` at ``wall`` (its TTL counts from then), or hold
        it back until ``due``; ``deliveries``: times it was delivered before (a message
        another copy of the queue hands over: ``Publishing.restore``)."""
        expires = message.expires_at
        if queue.message_ttl_s is not None:
            q_exp = wall + queue.message_ttl_s
            expires = q_exp if expires is None else min(expires, q_exp)
        entry = Entry(message, deliveries, expires)
        if due is not None:
            queue.published += 1
            self._delays.hold_back(queue, entry, due)
            return
        # an expiry must wake the queue in time (scheduled once it is in place); one
        # that may come out of queue order (the message's own) is indexed
        if expires is None:
            schedule = False
        elif message.expires_at is None:
            schedule = queue.wake_at is None
        else:
            queue.expiring.add(message.seq, expires)
            schedule = queue.wake_at is None or expires - wall < queue.wake_at - self._clock()
        lane = queue.lanes[0] if queue.max_priority is None else queue.lane_for(message)
        if lane.tail or lane.paged:
            lane.tail.append(entry)
            self._page_out_due[queue.name] = queue
        elif (
            len(lane.ready) < (self.memory_messages_per_queue if queue.max_priority is None else self._lane_memory(queue))
            or self._log.read_log is None
            or not queue.persistent_log
            or queue.max_length_bytes is not None  # (bounded by it: see Queue.ready_bytes)
        ):
            lane.ready.append(entry)
        else:
            lane.tail.append(entry)
            self._page_out_due[queue.name] = queue
        queue.published += 1
        self._totals.ready += 1
        if queue.max_length_bytes is not None:
            queue.ready_bytes += len(message.body)
        if schedule:
            self._delays.schedule_queue(queue)
        if queue.max_length is not None or queue.max_length_bytes is not None:
            self.drop_over_limit(queue)
        if queue.consumers:
            self._dispatch[queue.name] = queue
        if queue.getters:
            self._getters[queue.name] = queue

    def _lane_memory(self, queue: Queue) -> int:
        """How many ready messages each lane of a priority queue keeps in memory: the
        queue's share, divided among its lanes."""
        return max(1, self.memory_messages_per_queue // len(queue.lanes))

    def drop_over_limit(self, queue: Queue) -> None:
        """x-overflow drop-head: drop the oldest ready messages while the queue is past
        its length limits, after a publish or a requeue (RabbitMQ's rule); dead-letter
        each (reason ``maxlen``), reading it back first only when there is somewhere to
        dead-letter it to."""
        while queue.overflow == "drop-head" and queue.over_limit():
            entry = queue.pop()
            if entry is None and queue.dead_letter_exchange is not None:
                self._pager.page_in(queue)
                entry = queue.pop()
            if entry is not None:
                if entry.message.expires_at is not None:
                    queue.expiring.discard(entry.message.seq)
                self._dead_letter(queue, entry, "maxlen")
                continue
            lane = queue.next_lane()
            for seq, _loc in lane.paged.take(1) if lane is not None else ():
                self._totals.ready -= 1
                queue.dead_lettered["maxlen"] = queue.dead_lettered.get("maxlen", 0) + 1
                queue.paged_counts.pop(seq, None)
                self._log.settle_seqs(queue.qid, [seq])

    def page_out(self) -> None:
        """Records are durable up to the log's ``durable_lsn``: move the messages at the front of each due queue's tails whose records are
        written into its paged-out index, dropping their bodies from memory."""
        if not self._page_out_due:
            return
        durable = self._log.durable_lsn
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

    def pop(self, queue: Queue) -> Entry | None:
        entry = queue.pop()
        if entry is None:
            lane = queue.next_lane()
            if lane is not None and lane.paged:
                self._pager.page_in(queue)
                entry = queue.pop()
        return entry

    def pop_live(self, queue: Queue) -> Entry | None:
        """The next ready entry, dropping expired ones on the way; None also when every
        lane's next one is held back (``Queue.hold_after``)."""
        while True:
            entry = self.pop(queue)
            if entry is None:
                return None
            bound = queue.hold_after
            if bound is not None and entry.message.seq > bound:
                queue.requeue(entry)  # (a priority queue's lower lanes may hold older ones)
                lane = queue.lane_at_most(bound) if len(queue.lanes) > 1 else None
                if lane is None:
                    return None
                if lane.head() is None:
                    self._pager.page_in(queue, lane)
                entry = queue.pop_lane(lane)
                if entry is None:  # its read failed: tried again with backoff
                    return None
            expires = entry.expires_at
            if expires is not None:
                if entry.message.expires_at is not None:
                    queue.expiring.discard(entry.message.seq)  # (indexed again if it comes back)
                if expires <= self._wall_clock():
                    self._dead_letter(queue, entry, "expired")
                    continue
            return entry

    # ------------------------------------------------------------- recovered timers

    def start_recovered_timers(self) -> None:
        """Recovered queues' timers start now: due delays, expiries (what expired while
        the broker was down leaves now: a TTL queue reads its head back to know), and
        x-expires (whose unused time starts over at a restart)."""
        if not self._to_schedule:
            return
        for queue in self._to_schedule:
            if not queue.deleted:
                queue.unused_since = self._clock()
                if queue.message_ttl_s is not None or queue.expiring:
                    self._expire(queue)
                self._delays.schedule_queue(queue)
        self._to_schedule = []

    def schedule_when_started(self, queue: Queue) -> None:
        """A recovered queue's timers start with the next ``take_effects()`` (recovery
        may run where the clock cannot be read)."""
        self._to_schedule.append(queue)


def queue_record(queue: Queue) -> dict[str, Any]:
    """A DECLARE_QUEUE record's payload."""
    return {
        "qid": queue.qid,
        "name": queue.name,
        "auto_delete": queue.auto_delete,
        "arguments": queue.arguments,
    }
