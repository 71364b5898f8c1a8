"""The reconnect supervisor of a :class:`~client.channel.Channel`.

One job: keep a session to the broker alive for the channel. ``_serve`` opens a
session (``client.session``), recovers it (declarations replayed, consumers
re-established, pending publishes resent in order with their message ids, so the
broker's deduplication keeps them exactly-once), serves its events, and when it ends
backs off (``client.backoff``) and opens the next, until the channel is closed or its
reconnect policy gives up. Events are applied in order, synchronously, from the
session's reader task (``_on_event``): confirms settle the pending buffer
(``client.publisher``), deliveries go to their consumer (``client.consumer``), replies
wake their caller. An ``error`` event closes that session: if it names a publish (by
message id) that publish is refused and not resent; if it names a request, that request
fails; an error naming nothing is blamed on the oldest unanswered request, and after
``MAX_UNATTRIBUTED_ERRORS`` such errors in a row with no confirm in between the channel
fails rather than resend into the same error forever.

:class:`Supervisor` is the half of ``Channel`` that does this; its state is the
channel's (set in ``Channel.__init__``, declared below for the type checker), and the
few channel methods it calls are declared the same way.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal

import anyio

from .backoff import Backoff
from .codec import (
    Ack,
    BrokerCancel,
    CancelOk,
    Closing,
    ConsumeOk,
    ConsumerActive,
    Deliver,
    Error,
    Event,
    Expired,
    Nack,
    Ok,
    Return,
)
from .consumer import Message, MessageStream, Settler
from .errors import (
    BrokerRequestError,
    ChannelClosedByBroker,
    ClientError,
    ConnectionLost,
    ProtocolError,
    TLSRefused,
)
from .pending import UnknownDeliveryTag
from .publisher import PublishTracker
from .session import ChannelSession, SessionEnded, open_session
from .settings import Settings
from .topology import Topology, describe_op
from .transport import Endpoint, StreamOpener

__all__ = ["MAX_UNATTRIBUTED_ERRORS", "State", "Supervisor"]

# Sessions in a row that a broker ``error`` without an ``id`` ended, with no confirm
# in between, before the channel gives up instead of resending into the same error.
MAX_UNATTRIBUTED_ERRORS = 5

State = Literal["opening", "open", "closing", "closed", "failed"]

log = logging.getLogger("ackbus.client")

#: ``extra`` of a log record whose failure also reaches a caller as an exception (a
#: program that reports those itself, as the CLI does, filters such records out)
RAISED = {"ackbus_raised": True}


def _refused_for_good(exc: BaseException, *, first_open: bool) -> bool:
    """Whether a failed channel open is not worth retrying: refused credentials or
    permissions (401, 403: the same credentials cannot do better next time, and each
    retry counts against the broker's failed-login limit); and, while the channel has
    never opened, a 429 (too many failed logins from this address, or a per-user
    limit) and a TLS connection refused for want of a client certificate: the program
    learns why at once rather than after the policy's retries. A channel that was
    open retries those two (a restarted broker may answer 429 for a while)."""
    if isinstance(exc, BrokerRequestError):
        return exc.status in (401, 403) or (first_open and exc.status == 429)
    return first_open and isinstance(exc, TLSRefused)


class Supervisor(Settler):
    """Opens, recovers and serves the sessions of one channel (see the module
    docstring)."""

    _endpoint: Endpoint
    _opener: StreamOpener
    _settings: Settings
    _tracker: PublishTracker
    _topology: Topology
    _consumers: dict[str, MessageStream]
    _session: ChannelSession | None
    _generation: int
    _state: State
    _backoff: Backoff
    _stop_reconnecting: bool
    _scope: anyio.CancelScope
    _changed: anyio.Event
    _resent: int
    _reconnects: int
    _sessions_opened: int
    _unattributed_errors: int

    if TYPE_CHECKING:

        def _fail(self, message: str, cause: BaseException | None) -> None: ...

        def _pulse(self) -> None: ...

        def _check_usable(self) -> None: ...

        def _next_request_id(self) -> int: ...

        def _lose_transaction(self) -> None: ...

    async def _wait_opened(self) -> None:
        """Wait for the first ready session. Raises: ConnectionLost, ClientClosed."""
        while self._state == "opening":
            await self._changed.wait()
        self._check_usable()

    async def _serve(self) -> None:
        """Open, recover and serve sessions until closed or given up. Never raises
        (except on a bug): failures are recorded on the channel."""
        with self._scope:
            while not self._stop_reconnecting:
                self._generation += 1
                try:
                    with anyio.fail_after(self._settings.connect_timeout_s):
                        session = await open_session(
                            self._endpoint,
                            self._opener,
                            generation=self._generation,
                            max_line_bytes=self._settings.max_line_bytes,
                        )
                except (ClientError, TimeoutError) as exc:
                    if _refused_for_good(exc, first_open=self._state == "opening"):
                        self._fail(f"the broker refused the channel: {exc}", exc)
                        return
                    error: BaseException = exc
                    if isinstance(exc, TimeoutError):
                        error = ConnectionLost(
                            f"no channel from {self._endpoint} within "
                            f"{self._settings.connect_timeout_s} s"
                        )
                    if not await self._sleep_before_retry(error):
                        return
                    continue
                self._sessions_opened += 1
                await self._run_session(session)
                if self._stop_reconnecting:
                    return
                if self._unattributed_errors >= MAX_UNATTRIBUTED_ERRORS:
                    self._fail(
                        f"the broker closed the channel {self._unattributed_errors} times in a "
                        f"row, without progress, with an error naming no operation: "
                        f"{session.end_reason}",
                        session.end_reason,
                    )
                    return
                if not await self._sleep_before_retry(
                    session.end_reason or ConnectionLost("the broker ended the channel")
                ):
                    return

    async def _sleep_before_retry(self, reason: BaseException | None) -> bool:
        delay = self._backoff.next_delay(anyio.current_time())
        what = "open" if self._state == "opening" else "reconnect"
        if delay is None:
            log.error(
                "giving up: could not %s a channel to %s after %d attempt(s): %s",
                what, self._endpoint, self._backoff.attempts, reason, extra=RAISED,
            )
            self._fail(
                f"could not {what} a channel to {self._endpoint} "
                f"({self._backoff.attempts} attempt(s)): {reason}",
                reason,
            )
            return False
        log.warning(
            "could not %s a channel to %s (attempt %d): %s; retrying in %.2f s",
            what, self._endpoint, self._backoff.attempts, reason, delay,
        )
        await anyio.sleep(delay)
        return True

    async def _run_session(self, session: ChannelSession) -> None:
        self._session = session
        self._pulse()
        try:
            async with anyio.create_task_group() as nursery:
                nursery.start_soon(self._recover, session)
                await session.serve(self._on_event)
                nursery.cancel_scope.cancel()
        finally:
            self._session = None
            for stream in self._consumers.values():
                stream.drop_generation(session.generation)
            session.deliveries.clear()
            self._pulse()

    async def _recover(self, session: ChannelSession) -> None:
        """Replay declarations, re-consume, resend pending publishes, mark ready."""
        try:
            with anyio.fail_after(self._settings.request_timeout_s):
                replies = [
                    (op, session.request(op, self._next_request_id()))
                    for op in self._topology.ops()
                ]
                for op, reply in replies:
                    try:
                        await reply.wait()
                    except ChannelClosedByBroker as exc:
                        self._fail(
                            f"the channel could not be recovered: re-declaring "
                            f"{describe_op(op)} failed: {exc}",
                            exc,
                        )
                        return
                # Only consumers established on an earlier session: one whose first
                # consume is still to be sent is consumed by its caller, who must see
                # the broker's answer to it (a refusal is a ChannelClosedByBroker).
                consumers = [s for s in self._consumers.values() if s.active and s.consumed_generation]
                creplies = []
                for stream in consumers:
                    stream.consumed_generation = session.generation
                    creplies.append((stream, session.request(stream.consume_op(), self._next_request_id())))
                for stream, reply in creplies:
                    try:
                        await reply.wait()
                    except ChannelClosedByBroker as exc:
                        self._drop_consumer(stream, f"could not re-consume after a reconnect: {exc}")
        except SessionEnded:
            return
        except TimeoutError:
            session.abort(ConnectionLost("the broker did not answer while recovering the channel"))
            return
        if not session.alive or session.draining:
            return
        self._lose_transaction()  # (a transaction of the session before is gone)
        resend = self._tracker.restart()
        for handle in resend:
            session.send_nowait(handle.line, direct=False)
        if self._state != "opening":
            self._resent += len(resend)
            self._reconnects += 1
            log.info(
                "channel to %s recovered: %d consumer(s) re-established, %d pending publish(es) resent",
                self._endpoint, len(consumers), len(resend),
            )
        else:
            log.info("channel %s open on %s", session.channel_id, self._endpoint)
        session.ready = True
        self._backoff.reset()
        if self._state == "opening":
            self._state = "open"
        self._pulse()

    def _drop_consumer(self, stream: MessageStream, reason: str) -> None:
        if self._consumers.get(stream.consumer_tag) is stream:
            del self._consumers[stream.consumer_tag]
        stream.cancelled_by_broker(reason)

    # --- internals: events ------------------------------------------------------------

    def _on_event(self, session: ChannelSession, event: Event) -> None:
        try:
            if isinstance(event, Ack):
                self._tracker.on_ack(event.delivery_tag, event.multiple)
                self._unattributed_errors = 0
            elif isinstance(event, Deliver):
                self._on_deliver(session, event)
            elif isinstance(event, Nack):
                log.warning("publish nacked (delivery tag %d%s): %s", event.delivery_tag,
                            " and before" if event.multiple else "", event.reason, extra=RAISED)
                self._tracker.on_nack(event.delivery_tag, event.multiple, event.reason)
                self._unattributed_errors = 0
            elif isinstance(event, Return):
                self._tracker.on_return(
                    event.delivery_tag, event.reply_code, event.reason, event.message
                )
            elif isinstance(event, (Ok, ConsumeOk, CancelOk)):
                if isinstance(event, ConsumeOk):
                    # (here, in event order: an ``active`` event may follow at once)
                    consumer = self._consumers.get(event.consumer_tag)
                    if consumer is not None:
                        consumer._set_receiving(event.active)
                reply = session.replies.pop(event.id, None) if isinstance(event.id, int) else None
                if reply is not None:
                    reply.set(event)
            elif isinstance(event, Error):
                self._on_error(session, event)
            elif isinstance(event, ConsumerActive):
                stream = self._consumers.get(event.consumer_tag)
                if stream is not None:
                    stream._set_receiving(True)
            elif isinstance(event, BrokerCancel):
                stream = self._consumers.get(event.consumer_tag)
                if stream is not None:
                    self._drop_consumer(stream, event.reason)
            elif isinstance(event, Expired):
                # The broker requeued it; a later ack of this tag would be an error.
                session.deliveries.pop(event.delivery_tag, None)
            elif isinstance(event, Closing):
                session.draining = True
        except UnknownDeliveryTag as exc:
            raise ProtocolError(str(exc)) from exc

    def _on_deliver(self, session: ChannelSession, event: Deliver) -> None:
        stream = self._consumers.get(event.consumer_tag)
        no_ack = stream is not None and stream.no_ack
        message = Message(
            self,
            session.generation,
            body=event.body,
            properties=event.properties,
            exchange=event.exchange,
            routing_key=event.routing_key,
            redelivered=event.redelivered,
            delivery_count=event.delivery_count,
            delivery_tag=event.delivery_tag,
            consumer_tag=event.consumer_tag,
            settled=no_ack,
        )
        if not no_ack:
            session.deliveries[event.delivery_tag] = message
        if stream is None or stream.stopped:
            if not no_ack:
                self._settle(message, "nack", True)
            return
        stream.push(message)

    def _on_error(self, session: ChannelSession, event: Error) -> None:
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
            self._unattributed_errors += 1
        session.abort(error)
