"""A channel's publishes: encoding one, admitting it to the pending window, writing it
on the current session, and resending the window after a reconnect.

Rules: every publish gets a message id (generated when the caller gave none) and a
place in the channel's publish order (``seq``), then waits for room in the pending
window (:class:`~client.publisher.PublishTracker`). It is written at once if a session
is ready, else it stays in the window and goes out when the next session is
recovered (:meth:`Publisher.resend`), in order, with the same message id, so the
broker's deduplication keeps it exactly-once. This is the publish path: collaborators'
methods are bound once here, and a publish costs no call it does not need.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.lowlevel

from .codec import Properties, encode_publish
from .consumer import YIELD_EVERY, check_delay
from .errors import ConfirmTimeout, SomePublishesFailed
from .publisher import PendingPublish, PublishTracker
from .session import SessionLink
from .status import ChannelStatus
from .transactions import Transactions

__all__ = ["Body", "Publisher", "PropertiesLike"]

Body = bytes | str
PropertiesLike = Properties | Mapping[str, Any] | None


class Publisher:
    """Prepares, admits and sends the publishes of one channel."""

    def __init__(
        self, status: ChannelStatus, tracker: PublishTracker, transactions: Transactions, *, id_prefix: str
    ) -> None:
        self._status = status
        self._tracker = tracker
        self._id_prefix = id_prefix
        # bound once: the per-publish path
        self._check_usable = status.check_usable
        self._check_not_transactional = transactions.check_not_transactional
        self._has_room = tracker.has_room
        self._wait_for_room = tracker.wait_for_room
        self._add = tracker.add
        #: Publishes accepted so far; each one's ``seq`` is its number among them.
        self.published = 0
        self._message_ids = 0
        self._last_properties: Properties | None = None
        self._last_properties_json: dict[str, Any] = {}

    def prepare(
        self,
        exchange: str,
        routing_key: str,
        body: Body,
        properties: PropertiesLike,
        mandatory: bool,
        delay_s: float | None = None,
    ) -> PendingPublish:
        """Encode one publish into its handle (not yet tracked nor sent).

        Raises:
            ConnectionLost, ClientClosed: the channel is not usable.
            ClientError: the channel is transactional and no transaction is open.
            ValueError: a bad ``delay_s`` or property.
        """
        self._check_usable()
        self._check_not_transactional("publish")
        check_delay(True, delay_s)
        if isinstance(body, str):
            body = body.encode("utf-8")
        if properties is not None and properties is self._last_properties:
            props_json = dict(self._last_properties_json)
            props = properties
        else:
            props = Properties.coerce(properties)
            props_json = props.to_json()
            if props.headers is None and isinstance(properties, Properties):
                # The same (immutable) Properties object passed again, as in a
                # publishing loop, need not be validated and converted again.
                self._last_properties, self._last_properties_json = properties, dict(props_json)
        message_id = props.message_id
        if message_id is None:
            self._message_ids += 1
            message_id = props_json["message_id"] = f"{self._id_prefix}-{self._message_ids}"
        line = encode_publish(
            exchange=exchange, routing_key=routing_key, body=body, properties=props_json,
            mandatory=mandatory, op_id=message_id, delay_s=delay_s,
        )
        return PendingPublish(message_id, 0, line)

    async def start(self, handle: PendingPublish) -> None:
        """Wait for room, then track and send ``handle`` (``start_publish``).

        Raises:
            ConnectionLost, ClientClosed: the channel failed or was closed first.
        """
        if self._has_room(handle.size):
            self._enqueue(handle, direct=True)
        else:
            await self._wait_for_room(handle.size)
            self._check_usable()
            self._enqueue(handle, direct=False)
        if not self.published % YIELD_EVERY:
            # A schedule point every few publishes, not every one: a trio scheduling
            # round costs as much as preparing a publish, and the writer sends
            # whatever has queued meanwhile in one chunk anyway. Waiting for room
            # above still blocks (and yields) whenever the window is full.
            await anyio.lowlevel.cancel_shielded_checkpoint()

    async def start_and_wait(self, handle: PendingPublish) -> str:
        """Wait for room, track and send ``handle``, then wait for its confirm
        (``publish``). Raises: see :meth:`client.channel.Channel.publish`."""
        if self._has_room(handle.size):
            self._enqueue(handle, direct=True)
        else:
            await self._wait_for_room(handle.size)
            self._check_usable()
            self._enqueue(handle, direct=False)
        return await handle.wait()

    def start_nowait(self, handle: PendingPublish) -> None:
        """Track and send ``handle`` now (``publish_nowait``).

        Raises:
            anyio.WouldBlock: the pending window is full (nothing was sent).
        """
        if not self._has_room(handle.size):
            raise anyio.WouldBlock
        self._enqueue(handle, direct=True)

    def _enqueue(self, handle: PendingPublish, *, direct: bool) -> None:
        """Track and send a publish. ``direct``: it may be written at once (it did not
        wait for room in a full window, see below)."""
        self.published += 1
        handle.seq = self.published
        self._add(handle)
        session = self._status.session
        if session is not None and session.ready and not session.draining:
            # Written at once only when no other publish is unconfirmed (Nagle's rule,
            # client/session.py): a publishing loop's ops are coalesced instead. Nor
            # when it had to wait for room: a loop that filled its window gets it back
            # all at once when one fsync confirms the lot, and the first publish of
            # the refill sent alone would cost the broker an fsync of its own (window
            # 64: 21.8k -> 18.4k msg/s).
            session.send_nowait(handle.line, direct=direct and len(self._tracker) == 1)

    async def wait_for_confirms(self, timeout_s: float | None) -> None:
        """Wait until every publish made so far is settled. Raises: see
        :meth:`client.channel.Channel.wait_for_confirms`."""
        up_to = self.published
        tracker = self._tracker
        with anyio.move_on_after(math.inf if timeout_s is None else timeout_s) as scope:
            await tracker.wait_settled(up_to)
        if scope.cancelled_caught:
            raise ConfirmTimeout(f"{len(tracker)} publish(es) unconfirmed after {timeout_s} s")
        if self._status.state == "failed":
            raise self._status.error()
        failures = tracker.take_unobserved_failures(up_to)
        if failures:
            raise SomePublishesFailed(failures)

    async def wait_settled(self) -> None:
        """Wait until every publish made so far is settled (failures stay unseen)."""
        await self._tracker.wait_settled(self.published)

    def resend(self, session: SessionLink) -> int:
        """Renumber the pending publishes for ``session`` and write them all, in their
        original order; return how many."""
        resend = self._tracker.restart()
        for handle in resend:
            session.send_nowait(handle.line, direct=False)
        return len(resend)
