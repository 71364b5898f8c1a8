"""Settling deliveries: what a :class:`~client.consumer.Message`'s ``ack``, ``nack``,
``reject`` and ``touch`` send, and on which session.

Rules: a message is settled at most once (``MessageAlreadySettled`` otherwise). The op
goes out only on the session that delivered the message while that session still holds
the delivery unsettled (it is in the session's ``deliveries``); otherwise nothing is
sent and the call returns ``False``: the broker has requeued the message (the session
ended, or the delivery expired) and will deliver it again. Settling ops are never
written directly (:mod:`client.session`): nobody waits on them, and a consumer settles
in bursts that the session's writer coalesces (acks in order even become one
``multiple`` ack, :meth:`~client.session.SessionLink.send_ack`). A settle passes a
schedule point once every ``YIELD_EVERY`` calls, not on every one, so a loop of acks
queues many before the writer runs.
"""

from __future__ import annotations

from typing import Any

import anyio.lowlevel

from .consumer import YIELD_EVERY, Message
from .session import SessionLink
from .status import ChannelStatus
from .transactions import Transactions

__all__ = ["DeliverySettler"]


class DeliverySettler:
    """Settles the deliveries of one channel (the :class:`~client.consumer.Settler`
    its messages hold)."""

    def __init__(self, status: ChannelStatus, transactions: Transactions) -> None:
        self._status = status
        self._check_not_transactional = transactions.check_not_transactional
        self._calls = 0

    def _delivering_session(self, message: Message) -> SessionLink | None:
        """The live session that delivered ``message`` and still holds it unsettled,
        else None (reconnected since, or the delivery expired)."""
        session = self._status.session
        if (
            session is None
            or session.generation != message.generation
            or not session.alive
            or message.delivery_tag not in session.deliveries
        ):
            return None
        return session

    def settle_nowait(self, message: Message, op: str, requeue: bool, delay_s: float | None = None) -> bool:
        """Mark ``message`` settled and queue ``op`` (``ack``, ``nack``, ``reject``) on
        its session; return whether it was sent.

        Raises:
            MessageAlreadySettled: already settled; nothing was sent.
            ClientError: the channel is transactional and no transaction is open.
        """
        self._check_not_transactional(op)
        message._mark_settled()
        session = self._delivering_session(message)
        if session is None:
            return False
        del session.deliveries[message.delivery_tag]
        if op == "ack":
            session.send_ack(message.delivery_tag)
        else:
            settle: dict[str, Any] = {"op": op, "delivery_tag": message.delivery_tag, "requeue": requeue}
            if delay_s:
                settle["delay_s"] = delay_s
            session.send_op(settle, direct=False, settling=True)
        return True

    async def settle(self, message: Message, op: str, requeue: bool, delay_s: float | None = None) -> bool:
        """:meth:`settle_nowait`, then a schedule point every ``YIELD_EVERY`` settles
        (shielded: the op is already queued, so the caller must learn its result)."""
        sent = self.settle_nowait(message, op, requeue, delay_s)
        self._calls += 1
        if not self._calls % YIELD_EVERY:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        return sent

    def touch(self, message: Message) -> bool:
        """Queue a ``touch`` of ``message`` on its session; return whether it was sent."""
        session = self._delivering_session(message)
        if session is None:
            return False
        session.send_op({"op": "touch", "delivery_tag": message.delivery_tag}, direct=False, settling=True)
        return True
