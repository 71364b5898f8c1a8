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

The methods here belong to :class:`~broker.core.broker.Broker`; they share its state
(:class:`~broker.core.state.BrokerState`).
"""

from __future__ import annotations

from typing import Any

from .entities import Channel, Transaction
from .errors import ChannelError, InvalidArgument
from .state import BrokerState

__all__ = ["TransactionsMixin", "MAX_TX_BYTES", "MAX_TX_OPS"]

#: Most message bytes and operations one transaction may hold (a commit is one write).
MAX_TX_BYTES = 8 * 1024 * 1024
MAX_TX_OPS = 100_000


class TransactionsMixin(BrokerState):
    """Transactions (see the module docstring)."""

    def tx_select(self, channel_id: int) -> None:
        """Make the channel transactional. Raises ChannelError (``precondition_failed``)
        when it already is, or has publishes not yet confirmed."""
        ch = self._channel(channel_id)
        if ch.tx is not None:
            raise ChannelError("the channel is already transactional", code="precondition_failed")
        if len(ch.confirms) or ch.last_released_tag != ch.publish_seq:
            raise ChannelError(
                "publishes of this channel are not all confirmed yet: wait for their confirms, then tx_select",
                code="precondition_failed",
            )
        ch.tx = Transaction()

    def tx_commit(self, channel_id: int) -> int:
        """Apply the transaction's publishes and settles in one step; return how many
        operations. Everything is checked first: a settle whose delivery is gone
        (expired meanwhile) raises ChannelError and nothing is applied."""
        ch = self._transactional(channel_id)
        tx = ch.tx
        assert tx is not None
        # Every settle must still name deliveries, in order (an earlier "multiple" may
        # have taken a later one's tag): checked on a copy, before anything changes.
        remaining = set(ch.deliveries)
        for _kind, tag, multiple, _requeue, _delay in tx.settles:
            if multiple:
                if tag != 0 and tag not in remaining:
                    self._lookup_delivery(ch, tag)  # (raises, saying why)
                    raise ChannelError(f"delivery tag {tag} is settled earlier in this transaction",
                                       code="unknown_delivery_tag")
                remaining = {t for t in remaining if tag != 0 and t > tag}
            elif tag in remaining:
                remaining.discard(tag)
            else:
                self._lookup_delivery(ch, tag)
                raise ChannelError(f"delivery tag {tag} is settled earlier in this transaction",
                                   code="unknown_delivery_tag")
        ch.tx = None  # (so that the operations below apply)
        try:
            for tag, args in tx.publishes:
                self._publish_tagged(ch, tag, *args)
            for kind, tag, multiple, requeue, delay_s in tx.settles:
                if kind == "ack":
                    self.ack(channel_id, tag, multiple)
                else:
                    self.nack(channel_id, tag, multiple, requeue, delay_s=delay_s)
        finally:
            ch.tx = Transaction()
        self._keep_together = True
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
            self._confirm_dirty[ch.id] = ch
        ch.tx = Transaction()
        return len(tx.publishes) + len(tx.settles)

    def _transactional(self, channel_id: int) -> Channel:
        ch = self._channel(channel_id)
        if ch.tx is None:
            raise ChannelError("the channel is not transactional: tx_select first", code="precondition_failed")
        return ch

    def _tx_publish(
        self,
        ch: Channel,
        exchange_name: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        mandatory: bool,
        delay_s: float | None,
    ) -> int:
        """Hold a publish for the commit; return its tag."""
        tx = ch.tx
        assert tx is not None
        if tx.bytes + len(body) > MAX_TX_BYTES or len(tx.publishes) + len(tx.settles) >= MAX_TX_OPS:
            raise InvalidArgument(
                f"transaction too large (at most {MAX_TX_OPS} operations and {MAX_TX_BYTES} bytes of messages)",
                code="payload_too_large",
            )
        ch.publish_seq += 1
        self.stats["published"] += 1
        tx.bytes += len(body)
        tx.publishes.append((ch.publish_seq, (exchange_name, routing_key, body, properties, mandatory, delay_s)))
        return ch.publish_seq

    def _tx_settle(
        self, ch: Channel, kind: str, tag: int, multiple: bool, requeue: bool, delay_s: float | None
    ) -> None:
        """Hold an ack or nack for the commit (its tag is checked now, and again then)."""
        tx = ch.tx
        assert tx is not None
        if not isinstance(tag, int) or isinstance(tag, bool):
            raise ChannelError("delivery_tag must be an integer", code="invalid_argument")
        if not (multiple and tag == 0):
            self._lookup_delivery(ch, tag)
        if len(tx.publishes) + len(tx.settles) >= MAX_TX_OPS:
            raise InvalidArgument(f"transaction too large (at most {MAX_TX_OPS} operations)", code="payload_too_large")
        tx.settles.append((kind, tag, multiple, requeue, delay_s))
