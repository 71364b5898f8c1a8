"""Transactions (AMQP 0-9-1's ``tx``): publishes and settles that take effect together.

After ``tx_select`` a channel is transactional: its publishes (numbered as usual) and
its acks, nacks and rejects are held, not applied, until ``tx_commit`` applies them all
in one step - their records go to the log in one batch the log keeps in one write
group (``AppendRecords.together``), so a crash leaves all of them or none - or
``tx_rollback`` discards them. Either way the next transaction starts at once.

Confirms and transactions: AMQP forbids both on one channel; ackbus channels always
confirm, so they coexist this way: ``tx_select`` needs every earlier publish confirmed
(a clean start), and each publish of a transaction is confirmed at its commit (once the
commit is on disk) or nacked at its rollback ("transaction rolled back"). Every publish
still gets exactly one confirm.

:class:`Transactions` holds the commands; a transactional channel's operations are held
by the deliveries (settles) and the publishing (publishes) as they arrive, and applied
through them at the commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .delivery import Deliveries
from .entities import MAX_TX_BYTES, MAX_TX_OPS, ChannelState, Transaction
from .errors import ChannelError
from .log import MessageLog
from .publishing import Publishing

__all__ = ["Transactions", "TxPublish", "MAX_TX_BYTES", "MAX_TX_OPS"]

#: A publish a transaction holds: (tag, exchange, routing key, body, properties,
#: mandatory, delay_s, dedup).
TxPublish = tuple[int, str, str, bytes, dict[str, Any] | None, bool, float | None, bool]


class Transactions:
    """Transactions (see the module docstring)."""

    def __init__(self, deliveries: Deliveries, publishing: Publishing, log: MessageLog) -> None:
        self._deliveries = deliveries
        self._publishing = publishing
        self._log = log

    def tx_select(self, channel_id: int) -> None:
        """Make the channel transactional. Raises ChannelError (``precondition_failed``)
        when it already is, or has publishes not yet confirmed."""
        ch = self._deliveries.channel(channel_id)
        if ch.tx is not None:
            raise ChannelError("the channel is already transactional", code="precondition_failed")
        if len(ch.confirms) or ch.last_released_tag != ch.publish_seq:
            raise ChannelError(
                "publishes of this channel are not all confirmed yet: wait for their confirms, then tx_select",
                code="precondition_failed",
            )
        ch.tx = Transaction()

    def tx_publishes(self, channel_id: int) -> list[TxPublish]:
        """The publishes the transaction holds, in order: (tag, exchange, routing key,
        body, properties, mandatory, delay_s, dedup). A cluster routes them before the commit
        to learn which reach queues of other nodes. Raises ChannelError when the
        channel is not transactional."""
        tx = self._transactional(channel_id).tx
        assert tx is not None
        return [(tag, *args) for tag, args in tx.publishes]

    def tx_commit(self, channel_id: int, elsewhere: Mapping[int, int] | None = None) -> int:
        """Apply the transaction's publishes and settles in one step; return how many
        operations. Everything is checked first: a settle whose delivery is gone
        (expired meanwhile) raises ChannelError and nothing is applied.

        ``elsewhere`` (a cluster): publish tag -> how many other nodes it is forwarded
        to at this commit. Such a publish's confirm also waits for that many answers
        (``settle_held_confirm``), and reaching no queue of this node it is not
        returned as unroutable (its queues are elsewhere)."""
        ch = self._transactional(channel_id)
        tx = ch.tx
        assert tx is not None
        # Every settle must still name deliveries, in order (an earlier "multiple" may
        # have taken a later one's tag): checked on a copy, before anything changes.
        remaining = set(ch.deliveries)
        for _kind, tag, multiple, _requeue, _delay in tx.settles:
            if multiple:
                if tag != 0 and tag not in remaining:
                    self._deliveries.lookup_delivery(ch, tag)  # (raises, saying why)
                    raise ChannelError(f"delivery tag {tag} is settled earlier in this transaction",
                                       code="unknown_delivery_tag")
                remaining = {t for t in remaining if tag != 0 and t > tag}
            elif tag in remaining:
                remaining.discard(tag)
            else:
                self._deliveries.lookup_delivery(ch, tag)
                raise ChannelError(f"delivery tag {tag} is settled earlier in this transaction",
                                   code="unknown_delivery_tag")
        ch.tx = None  # (so that the operations below apply)
        try:
            for tag, args in tx.publishes:
                answers = elsewhere.get(tag) if elsewhere else None
                if answers is None:
                    self._publishing.publish_tagged(ch, tag, *args)
                    continue
                exchange, routing_key, body, properties, _mandatory, delay_s, dedup = args
                self._publishing.publish_tagged(ch, tag, exchange, routing_key, body, properties, False, delay_s, dedup)
                ch.confirms.hold(tag, answers)
            for kind, tag, multiple, requeue, delay_s in tx.settles:
                if kind == "ack":
                    self._deliveries.ack(channel_id, tag, multiple)
                else:
                    self._deliveries.nack(channel_id, tag, multiple, requeue, delay_s=delay_s)
        finally:
            ch.tx = Transaction()
        self._log.keep_together()
        return len(tx.publishes) + len(tx.settles)

    def tx_rollback(self, channel_id: int) -> int:
        """Discard the transaction: its publishes are nacked, its settles forgotten
        (the deliveries stay unacked). Returns how many operations."""
        ch = self._transactional(channel_id)
        tx = ch.tx
        assert tx is not None
        for tag, _args in tx.publishes:
            ch.confirms.add(tag, 0, False, "transaction rolled back")
        if tx.publishes:
            self._log.confirms_due(ch)
        ch.tx = Transaction()
        return len(tx.publishes) + len(tx.settles)

    def _transactional(self, channel_id: int) -> ChannelState:
        ch = self._deliveries.channel(channel_id)
        if ch.tx is None:
            raise ChannelError("the channel is not transactional: tx_select first", code="precondition_failed")
        return ch
