"""The log's feedback: what the core does when records become durable or fail.

The IO layer reports back on the records the core produced: :meth:`Durability.durable`
once records up to an LSN are on disk (confirms waiting on them are released, written
tails page out, compaction's copies take effect), :meth:`Durability.storage_failed` when
some could not be written (their publishes are nacked and undone), and
:meth:`Durability.storage_recovered` when writes succeed again. The disk alarm refuses
persistent publishes meanwhile (:meth:`Durability.refuse_publishes`).

A confirm may also wait for a condition the core does not know of (a replicated
queue's majority): the edge holds it by the record's LSN
(:meth:`Durability.hold_confirms`) and later releases or nacks it. The ``Broker`` binds
these commands as its own (``Broker.durable``, ``Broker.hold_confirms``, ...).
"""

from __future__ import annotations

from collections.abc import Iterable

from .compaction import Compaction
from .delays import Delays
from .delivery import Deliveries
from .log import MessageLog
from .queues import QueueStore

__all__ = ["Durability"]


class Durability:
    """The log's feedback and confirms held from outside (see the module docstring).
    Owns nothing: the LSNs, marks and held set are the log's, the confirms the
    channels'."""

    def __init__(
        self, log: MessageLog, deliveries: Deliveries, store: QueueStore, delays: Delays, compaction: Compaction
    ) -> None:
        self._log = log
        self._deliveries = deliveries
        self._store = store
        self._delays = delays
        self._compaction = compaction

    # ------------------------------------------------------------- the log

    def durable(self, lsn: int) -> None:
        """Records up to ``lsn`` are on disk: release the confirms that waited on them."""
        log = self._log
        if not log.durable(lsn):
            return
        for ch in self._deliveries.channels.values():
            if len(ch.confirms):
                log.confirms_due(ch)
        self._compaction.durable(lsn)
        self._store.page_out()
        self._delays.page_out()

    def storage_failed(self, first_lsn: int, last_lsn: int, reason: str) -> None:
        """Records ``first_lsn``..``last_lsn`` could not be written.

        Publishes that waited on them are nacked, their messages leave the queues they
        have not yet left and are forgotten by the deduplication window (so a resend
        is taken again), and persistent publishes are refused until
        :meth:`storage_recovered`.
        """
        failed = self._log.fail(first_lsn, last_lsn, reason)
        self._compaction.failed(first_lsn, last_lsn)
        for ch in self._deliveries.channels.values():
            if ch.confirms.fail_lsns(first_lsn, last_lsn, f"storage failure: {reason}"):
                self._log.confirms_due(ch)
        by_queue: dict[str, set[int]] = {}
        for _lsn, message, queues in failed:
            for routed in queues:
                by_queue.setdefault(routed.name, set()).add(message.seq)
        for qname, seqs in by_queue.items():
            queue = self._store.queues.get(qname)
            if queue is not None:
                queue.remove_entries(seqs)

    def refuse_publishes(self, reason: str) -> None:
        """Refuse persistent publishes to durable queues (nacked with ``reason``) while
        settles still go through: the disk is nearly full, and what space is left is
        kept for the acks and checkpoints that free it."""
        self._log.publish_refusal = reason

    def accept_publishes(self) -> None:
        self._log.publish_refusal = None

    def storage_recovered(self) -> None:
        """Writes succeed again: accept persistent publishes again."""
        self._log.storage_ok = True
        self._log.storage_reason = ""

    # ----------------------------------------------- confirms held from outside

    def hold_confirms(self, lsns: Iterable[int]) -> None:
        """The acks of publishes whose record has one of ``lsns`` also wait for
        :meth:`release_held_confirms` (or turn into nacks at
        :meth:`nack_held_confirms`), whatever the disk says: the edge knows of one
        more condition (a replicated queue's majority). The core does not know which."""
        self._log.held.update(lsns)

    def release_held_confirms(self, lsns: Iterable[int]) -> None:
        """The outside condition of ``lsns`` is met: their acks go once durable."""
        held = self._log.held
        held.difference_update(lsns)
        for ch in self._deliveries.channels.values():
            if len(ch.confirms):
                self._log.confirms_due(ch)

    def nack_held_confirms(self, lsns: Iterable[int], reason: str, *, keep_held: bool = False) -> None:
        """The outside condition of ``lsns`` cannot be met: their publishes are nacked
        with ``reason`` (their messages stay where they are: a nack promises nothing).

        ``keep_held``: the condition is not met *yet* (a majority is missing, the
        messages stay): the acks waiting now are nacked, but ``lsns`` stay held, so a
        resend answered by the deduplication window from one of them waits for its
        fate (released, or nacked again) instead of being acked from the local disk."""
        wanted = set(lsns) & self._log.held
        if not wanted:
            return
        if not keep_held:
            self._log.held.difference_update(wanted)
        for ch in self._deliveries.channels.values():
            if ch.confirms.fail_held(wanted, reason):
                self._log.confirms_due(ch)
