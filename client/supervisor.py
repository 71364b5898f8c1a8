"""The reconnect supervisor of a :class:`~client.channel.Channel`.

One job: keep a session to the broker alive for the channel. :meth:`Supervisor.serve`
opens a session (:mod:`client.session`), recovers it (declarations replayed,
consumers re-established, pending publishes resent in order with their message ids,
so the broker's deduplication keeps them exactly-once), serves its events
(:mod:`client.events`), and when it ends backs off (:mod:`client.backoff`) and opens
the next, until the channel is closed or its reconnect policy gives up. After
``MAX_UNATTRIBUTED_ERRORS`` sessions in a row ended by a broker ``error`` naming no
operation, with no confirm in between, the channel fails rather than resend into the
same error forever; an error while replaying a declaration is fatal for the same
reason. Giving up is the channel's to carry out (``give_up``, given to the
constructor: it fails every publish and consumer).
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from .backoff import Backoff
from .consumer_registry import ConsumerRegistry
from .endpoint import Endpoint, StreamOpener
from .errors import (
    BrokerRequestError,
    ChannelClosedByBroker,
    ClientError,
    ConnectionLost,
    TLSRefused,
)
from .events import RAISED, EventDispatcher, log
from .publishing import Publisher
from .requester import Requester
from .session import SessionEnded, SessionLink, open_session
from .settings import Settings
from .status import ChannelStatus
from .topology import Topology, describe_op
from .transactions import Transactions

__all__ = ["MAX_UNATTRIBUTED_ERRORS", "Supervisor"]

# Sessions in a row that a broker ``error`` without an ``id`` ended, with no confirm
# in between, before the channel gives up instead of resending into the same error.
MAX_UNATTRIBUTED_ERRORS = 5


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


class Supervisor:
    """Opens, recovers and serves the sessions of one channel (see the module
    docstring)."""

    def __init__(
        self,
        endpoint: Endpoint,
        opener: StreamOpener,
        settings: Settings,
        *,
        status: ChannelStatus,
        requests: Requester,
        topology: Topology,
        consumers: ConsumerRegistry,
        publisher: Publisher,
        transactions: Transactions,
        events: EventDispatcher,
        give_up: Callable[[str, BaseException | None], None],
    ) -> None:
        self._endpoint = endpoint
        self._opener = opener
        self._settings = settings
        self._status = status
        self._requests = requests
        self._topology = topology
        self._consumers = consumers
        self._publisher = publisher
        self._transactions = transactions
        self._events = events
        self._give_up = give_up
        self._backoff = Backoff(settings.reconnect)
        self._generation = 0
        self._stopping = False
        self._scope = anyio.CancelScope()
        #: Sessions opened (the first one and every reconnect).
        self.sessions_opened = 0
        #: Times the channel was recovered on a new session after losing one.
        self.reconnects = 0
        #: Publishes written again on a new session after a reconnect.
        self.resent = 0

    def stop(self) -> None:
        """Open no new session once the current one ends."""
        self._stopping = True

    def cancel(self) -> None:
        """Stop now: :meth:`serve` returns (its session is closed)."""
        self._stopping = True
        self._scope.cancel()

    async def serve(self) -> None:
        """Open, recover and serve sessions until stopped or given up. Never raises
        (except on a bug): failures are given up to the channel."""
        status = self._status
        with self._scope:
            while not self._stopping:
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
                    if _refused_for_good(exc, first_open=status.state == "opening"):
                        self._give_up(f"the broker refused the channel: {exc}", exc)
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
                self.sessions_opened += 1
                await self._run_session(session)
                if self._stopping:
                    return
                unattributed = self._events.unattributed_errors
                if unattributed >= MAX_UNATTRIBUTED_ERRORS:
                    self._give_up(
                        f"the broker closed the channel {unattributed} times in a "
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
        what = "open" if self._status.state == "opening" else "reconnect"
        if delay is None:
            log.error(
                "giving up: could not %s a channel to %s after %d attempt(s): %s",
                what, self._endpoint, self._backoff.attempts, reason, extra=RAISED,
            )
            self._give_up(
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

    async def _run_session(self, session: SessionLink) -> None:
        status = self._status
        status.session = session
        status.pulse()
        try:
            async with anyio.create_task_group() as nursery:
                nursery.start_soon(self._recover, session)
                await session.serve(self._events.on_event)
                nursery.cancel_scope.cancel()
        finally:
            status.session = None
            self._consumers.session_ended(session.generation)
            session.deliveries.clear()
            status.pulse()

    async def _recover(self, session: SessionLink) -> None:
        """Replay declarations, re-consume, resend pending publishes, mark ready."""
        status = self._status
        try:
            with anyio.fail_after(self._settings.request_timeout_s):
                replies = [(op, self._requests.send(session, op)) for op in self._topology.ops()]
                for op, reply in replies:
                    try:
                        await reply.wait()
                    except ChannelClosedByBroker as exc:
                        self._give_up(
                            f"the channel could not be recovered: re-declaring "
                            f"{describe_op(op)} failed: {exc}",
                            exc,
                        )
                        return
                consumers = await self._consumers.recover(session)
        except SessionEnded:
            return
        except TimeoutError:
            session.abort(ConnectionLost("the broker did not answer while recovering the channel"))
            return
        if not session.alive or session.draining:
            return
        self._transactions.lose()  # (a transaction of the session before is gone)
        resent = self._publisher.resend(session)
        if status.state != "opening":
            self.resent += resent
            self.reconnects += 1
            log.info(
                "channel to %s recovered: %d consumer(s) re-established, %d pending publish(es) resent",
                self._endpoint, consumers, resent,
            )
        else:
            log.info("channel %s open on %s", session.channel_id, self._endpoint)
        session.ready = True
        self._backoff.reset()
        if status.state == "opening":
            status.state = "open"
        status.pulse()
