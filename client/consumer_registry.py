"""A channel's consumers: their streams by consumer tag, their ``consume`` and
``cancel``, their deliveries, and their re-establishment on every new session.

Rules: a consumer keeps its tag across reconnects. Its first ``consume`` is sent by its
caller (:meth:`ConsumerRegistry.start`), who must see the broker's answer (a refusal
raises :class:`~client.errors.ChannelClosedByBroker`); after a reconnect the
supervisor re-sends it (:meth:`ConsumerRegistry.recover`), and a refusal then ends
that stream with :class:`~client.errors.ConsumerCancelled`. A stopped consumer sends
``cancel`` and nacks (requeues) what it buffered but did not yield; a delivery for a
stopped or unknown consumer is nacked at once. Once :meth:`ConsumerRegistry.stop_all`
ran (or the connection stopped consuming, during a graceful shutdown), consumers
started later are stopped from the start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from .codec import Deliver, delivery_row
from .consumer import Message, MessageStream
from .errors import ChannelClosedByBroker, ClientError, ConnectionLost
from .requester import Requester
from .session import SessionEnded, SessionLink
from .settling import DeliverySettler
from .status import ChannelStatus

__all__ = ["ConsumerRegistry"]


class ConsumerRegistry:
    """The consumers of one channel, by consumer tag."""

    def __init__(
        self,
        status: ChannelStatus,
        requests: Requester,
        settler: DeliverySettler,
        *,
        tag_prefix: str,
        timeout_s: float,
        connection_stopped: Callable[[], bool],
    ) -> None:
        self._status = status
        self._requests = requests
        self._settler = settler
        self._settle_nowait = settler.settle_nowait
        self._tag_prefix = tag_prefix
        self._timeout_s = timeout_s
        self._connection_stopped = connection_stopped
        self._streams: dict[str, MessageStream] = {}
        self._tags = 0
        self._stopped = False

    def __len__(self) -> int:
        return len(self._streams)

    # --- started and stopped by the channel's caller -----------------------------------

    async def start(
        self,
        queue: str,
        *,
        prefetch: int,
        consumer_tag: str | None,
        no_ack: bool,
        exclusive: bool,
        arguments: dict[str, Any] | None,
        ack_timeout_s: float | None,
    ) -> MessageStream:
        """Register a consumer and wait for the broker's ``consume_ok`` (see
        :meth:`client.channel.Channel.consume`).

        Raises:
            ValueError: a bad ``prefetch`` or ``ack_timeout_s``, a tag in use.
            ChannelClosedByBroker: the broker refused the consumer.
            ConnectionLost, ClientClosed: the channel became unusable.
        """
        if prefetch < 0:
            raise ValueError("prefetch must be >= 0")
        if ack_timeout_s is not None and not ack_timeout_s > 0:
            raise ValueError("ack_timeout_s must be > 0")
        self._status.check_usable()
        if consumer_tag is None:
            self._tags += 1
            consumer_tag = f"{self._tag_prefix}-{self._tags}"
        if consumer_tag in self._streams:
            raise ValueError(f"consumer tag {consumer_tag!r} already in use on this channel")
        stream = MessageStream(
            queue, consumer_tag, prefetch=prefetch, no_ack=no_ack, exclusive=exclusive,
            arguments=arguments, ack_timeout_s=ack_timeout_s,
        )
        if self._stopped or self._connection_stopped():
            stream.stop()
            return stream
        self._streams[consumer_tag] = stream
        try:
            await self._establish(stream)
        except BaseException:
            self._streams.pop(consumer_tag, None)
            raise
        return stream

    async def _establish(self, stream: MessageStream) -> None:
        while True:
            session = await self._status.wait_ready()
            if stream.consumed_generation == session.generation:
                return  # recovery of this session established it already
            if not stream.active:
                return
            stream.consumed_generation = session.generation
            reply = self._requests.send(session, stream.consume_op())
            try:
                with anyio.fail_after(self._timeout_s):
                    await reply.wait()
                return
            except SessionEnded:
                continue  # the next session's recovery re-consumes it
            except TimeoutError:
                raise ConnectionLost(f"no consume_ok for {stream.queue!r}") from None

    def stop_all(self) -> None:
        """Stop every consumer, and any started later."""
        self._stopped = True
        for stream in list(self._streams.values()):
            self.stop(stream)

    def stop(self, stream: MessageStream) -> None:
        """Stop ``stream``: send ``cancel`` on its session, requeue its buffer."""
        if stream.stopped:
            return
        stream.stop()
        session = self._status.session
        if (
            session is not None
            and session.alive
            and stream.consumed_generation == session.generation
            and self._streams.get(stream.consumer_tag) is stream
        ):
            stream.cancel_reply = self._requests.send(session, {"op": "cancel", "consumer_tag": stream.consumer_tag})
        for message in stream.take_buffer():
            if not message.settled:
                self._settle_nowait(message, "nack", True)

    async def close(self, stream: MessageStream) -> None:
        """Stop ``stream``, wait (a while) for its ``cancel_ok``, forget it."""
        try:
            self.stop(stream)
            reply = stream.cancel_reply
            if reply is not None and self._status.state not in ("closed", "failed"):
                with anyio.move_on_after(self._timeout_s):
                    try:
                        await reply.wait()
                    except (SessionEnded, ChannelClosedByBroker):
                        pass
        finally:
            if self._streams.get(stream.consumer_tag) is stream:
                del self._streams[stream.consumer_tag]

    def end_all(self, make_error: Callable[[], ClientError]) -> None:
        """The channel is gone: every stream raises ``make_error()`` once drained."""
        for stream in self._streams.values():
            stream.end(make_error)

    # --- driven by the supervisor ----------------------------------------------------

    async def recover(self, session: SessionLink) -> int:
        """Re-establish on ``session`` every consumer established on an earlier one;
        a refused one ends (``ConsumerCancelled``). Return how many were sent.
        (One whose first consume is still to be sent is consumed by its caller.)

        Raises:
            SessionEnded: the session ended first.
        """
        streams = [s for s in self._streams.values() if s.active and s.consumed_generation]
        replies = []
        for stream in streams:
            stream.consumed_generation = session.generation
            replies.append((stream, self._requests.send(session, stream.consume_op())))
        for stream, reply in replies:
            try:
                await reply.wait()
            except ChannelClosedByBroker as exc:
                self.drop(stream, f"could not re-consume after a reconnect: {exc}")
        return len(streams)

    def session_ended(self, generation: int) -> None:
        """Forget what the streams buffered from the session ``generation``."""
        for stream in self._streams.values():
            stream.drop_generation(generation)

    def drop(self, stream: MessageStream, reason: str) -> None:
        """The broker cancelled ``stream`` (or refused it again)."""
        if self._streams.get(stream.consumer_tag) is stream:
            del self._streams[stream.consumer_tag]
        stream.cancelled_by_broker(reason)

    # --- events, in order, from the session's reader -----------------------------------

    def on_deliver(self, session: SessionLink, event: Deliver) -> None:
        """Hand a delivery to its stream (nacked at once if nobody takes it)."""
        stream = self._streams.get(event.consumer_tag)
        no_ack = stream is not None and stream.no_ack
        message = Message(
            self._settler,
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
                self._settle_nowait(message, "nack", True)
            return
        stream.push(message)

    def on_deliveries(self, session: SessionLink, rows: list[Any]) -> None:
        """Hand each delivery of a ``deliveries`` event to its stream, as
        :meth:`on_deliver` does, with no event object per delivery.

        Raises:
            ProtocolError: a malformed row (the deliveries before it were handed out).
        """
        settler, generation, deliveries = self._settler, session.generation, session.deliveries
        streams = self._streams
        last_tag: str | None = None
        stream: MessageStream | None = None
        for row in rows:
            consumer_tag, tag, redelivered, count, exchange, routing_key, properties, body = delivery_row(row)
            if consumer_tag != last_tag:
                last_tag, stream = consumer_tag, streams.get(consumer_tag)
            no_ack = stream is not None and stream.no_ack
            message = Message(
                settler, generation, body=body, raw_properties=properties, exchange=exchange,
                routing_key=routing_key, redelivered=redelivered, delivery_count=count,
                delivery_tag=tag, consumer_tag=consumer_tag, settled=no_ack,
            )
            if not no_ack:
                deliveries[tag] = message
            if stream is None or stream.stopped:
                if not no_ack:
                    self._settle_nowait(message, "nack", True)
                continue
            stream.push(message)

    def on_receiving(self, consumer_tag: str, receiving: bool) -> None:
        """The broker said whether it delivers to this consumer (single active
        consumer: ``consume_ok``'s ``active``, then ``active``)."""
        stream = self._streams.get(consumer_tag)
        if stream is not None:
            stream._set_receiving(receiving)

    def on_broker_cancel(self, consumer_tag: str, reason: str) -> None:
        stream = self._streams.get(consumer_tag)
        if stream is not None:
            self.drop(stream, reason)
