"""A channel's events, applied in order, synchronously, from the session's reader
task: confirms settle the pending window (:mod:`client.publisher`), deliveries go to
their consumer (:mod:`client.consumer_registry`), replies wake their caller.

An ``error`` event closes that session. If it names a publish (by ``id`` = message
id), that publish fails with :class:`~client.errors.PublishRefused` and is not resent;
if it names a request (integer ids), that request raises
:class:`~client.errors.ChannelClosedByBroker`. An error without an ``id`` is blamed on
the oldest unanswered request, if any, else counted in
:attr:`EventDispatcher.unattributed_errors` (reset by every confirm), which the
supervisor uses to give up rather than resend into the same error forever.
"""

from __future__ import annotations

import logging

from .codec import (
    Ack,
    BrokerCancel,
    CancelOk,
    Closing,
    ConsumeOk,
    ConsumerActive,
    Deliver,
    DeliverBatch,
    Error,
    Event,
    Expired,
    Nack,
    Ok,
    Return,
)
from .consumer_registry import ConsumerRegistry
from .errors import ChannelClosedByBroker, ProtocolError
from .failover import NodeSteering
from .pending import UnknownDeliveryTag
from .publisher import PublishTracker
from .session import SessionLink

__all__ = ["EventDispatcher", "RAISED", "log"]

log = logging.getLogger("ackbus.client")

#: ``extra`` of a log record whose failure also reaches a caller as an exception (a
#: program that reports those itself, as the CLI does, filters such records out)
RAISED = {"ackbus_raised": True}


class EventDispatcher:
    """Applies the events of a channel's sessions to its publishes and consumers."""

    def __init__(self, tracker: PublishTracker, consumers: ConsumerRegistry, steering: NodeSteering | None = None) -> None:
        self._tracker = tracker
        #: moves the channel to another node of a cluster that refuses its publishes
        self._steering = steering
        # bound once: the per-event path
        self._on_ack = tracker.on_ack
        self._on_deliver = consumers.on_deliver
        self._on_deliveries = consumers.on_deliveries
        self._consumers = consumers
        #: Sessions in a row that an ``error`` without an ``id`` ended, with no confirm
        #: in between.
        self.unattributed_errors = 0

    def on_event(self, session: SessionLink, event: Event) -> None:
        """Apply one event of ``session``.

        Raises:
            ProtocolError: a confirm of a delivery tag never used.
        """
        try:
            if isinstance(event, Ack):
                self._on_ack(event.delivery_tag, event.multiple)
                self.unattributed_errors = 0
                if self._steering is not None:
                    self._steering.confirmed()
            elif type(event) is DeliverBatch:
                self._on_deliveries(session, event.rows)
            elif isinstance(event, Deliver):
                self._on_deliver(session, event)
            elif isinstance(event, Nack):
                log.warning("publish nacked (delivery tag %d%s): %s", event.delivery_tag,
                            " and before" if event.multiple else "", event.reason, extra=RAISED)
                self._tracker.on_nack(event.delivery_tag, event.multiple, event.reason)
                self.unattributed_errors = 0
                if self._steering is not None:
                    self._steering.refused(event.reason, session.abort)
            elif isinstance(event, Return):
                self._tracker.on_return(
                    event.delivery_tag, event.reply_code, event.reason, event.message
                )
            elif isinstance(event, (Ok, ConsumeOk, CancelOk)):
                if isinstance(event, ConsumeOk):
                    # (here, in event order: an ``active`` event may follow at once)
                    self._consumers.on_receiving(event.consumer_tag, event.active)
                reply = session.replies.pop(event.id, None) if isinstance(event.id, int) else None
                if reply is not None:
                    reply.set(event)
            elif isinstance(event, Error):
                self._on_error(session, event)
            elif isinstance(event, ConsumerActive):
                self._consumers.on_receiving(event.consumer_tag, True)
            elif isinstance(event, BrokerCancel):
                self._consumers.on_broker_cancel(event.consumer_tag, event.reason)
            elif isinstance(event, Expired):
                # The broker requeued it; a later ack of this tag would be an error.
                session.deliveries.pop(event.delivery_tag, None)
            elif isinstance(event, Closing):
                session.draining = True
        except UnknownDeliveryTag as exc:
            raise ProtocolError(str(exc)) from exc

    def _on_error(self, session: SessionLink, event: Error) -> None:
        session.draining = True
        error = ChannelClosedByBroker(event.code, event.message)
        # blamed on a caller's request or publish, which raises it (see below)
        if isinstance(event.id, int):
            blamed = event.id in session.replies
        else:
            blamed = isinstance(event.id, str) or bool(session.replies)
        log.warning("the broker closed the channel: %s: %s", event.code, event.message,
                    extra=RAISED if blamed else None)
        if isinstance(event.id, int):
            reply = session.replies.pop(event.id, None)
            if reply is not None:
                reply.fail(error)
        elif isinstance(event.id, str):
            self._tracker.refuse(event.id, event.code, event.message)
        elif session.replies:
            # A broker that does not echo the id: it applies ops in order and answers
            # requests as it applies them, so the oldest unanswered request is the
            # likeliest cause.
            session.replies.pop(min(session.replies)).fail(error)
        else:
            self.unattributed_errors += 1
        session.abort(error)
