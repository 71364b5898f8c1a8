"""Consumers: the message stream a ``consume`` yields, and the messages in it.

Rules:

- A :class:`MessageStream` belongs to one channel and keeps its consumer tag across
  reconnects; the channel re-establishes it on every new session.
- Deliveries are buffered in arrival order. The broker bounds the buffer: at most
  ``prefetch`` unacked deliveries per consumer are ever sent.
- When the session that delivered some buffered messages ends, those messages are
  dropped before anyone sees them: the broker has already put them back in the queue
  (``redelivered``), so handing them out would only double the work. (``no_ack``
  deliveries are kept: nobody will redeliver them.)
- Once stopped (by :meth:`Channel.stop_consuming`, a graceful shutdown, or leaving the
  ``consume`` block) a stream yields nothing more: iteration ends at the next
  ``__anext__``, and buffered messages are nacked with ``requeue=True`` so they go back
  to their place in the queue at once.
- A :class:`Message` is settled at most once. Settling a message whose session is gone
  (or whose delivery expired) sends nothing and returns ``False``: the broker has
  requeued it and will deliver it again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import anyio
import anyio.lowlevel

from .codec import Properties
from .errors import ClientError, ConsumerCancelled, MessageAlreadySettled
from .messages import Reply

__all__ = ["Message", "MessageStream", "Settler"]


# ack/nack/reject, the stream's __anext__ and Channel.start_publish pass a schedule
# point once every this many calls (and whenever they must wait) rather than on every
# one, so a loop of publishes or acks queues many ops before the channel's writer runs
# and they leave in one chunk. Measured with prefetch 100: 2.2 acks per chunk and ~16k
# msgs/s with a schedule point on every call; 30 and ~32k with this.
YIELD_EVERY = 16


class Settler(Protocol):
    """What a message needs from its channel: settling it on the session that
    delivered it (:class:`~client.settling.DeliverySettler`)."""

    async def settle(self, message: Message, op: str, requeue: bool, delay_s: float | None = None) -> bool:
        """Send ``op`` (``ack``, ``nack``, ``reject``) for ``message``; return whether
        it was sent. Raises: MessageAlreadySettled."""
        ...

    def touch(self, message: Message) -> bool:
        """Send ``touch`` for ``message``; return whether it was sent."""
        ...


#: Longest delay the broker takes (2^32 - 1 ms).
MAX_DELAY_S = ((1 << 32) - 1) / 1000.0


def check_delay(requeue: bool, delay_s: float | None) -> None:
    """Raises ValueError for a delay the broker would refuse, or one without requeue."""
    if delay_s is None:
        return
    if not requeue:
        raise ValueError("a delay needs requeue=True: a message not requeued does not come back")
    if isinstance(delay_s, bool) or not isinstance(delay_s, (int, float)) or not 0 <= delay_s <= MAX_DELAY_S:
        raise ValueError(f"delay_s must be a number of seconds 0..{MAX_DELAY_S:g}")


class Death:
    """One entry of a message's dead-letter history (RabbitMQ's ``x-death``): it was
    dead-lettered ``count`` times from ``queue`` for ``reason`` (``rejected``,
    ``expired``, ``maxlen``, ``delivery_limit``), last at ``time`` (epoch seconds),
    having been published to ``exchange`` with ``routing_keys``."""

    __slots__ = ("queue", "reason", "count", "time", "exchange", "routing_keys")

    def __init__(
        self, queue: str, reason: str, count: int, time: int, exchange: str, routing_keys: list[str]
    ) -> None:
        self.queue = queue
        self.reason = reason
        self.count = count
        self.time = time
        self.exchange = exchange
        self.routing_keys = routing_keys

    def __repr__(self) -> str:
        return f"<Death queue={self.queue!r} reason={self.reason!r} count={self.count}>"


def parse_death(headers: Mapping[str, Any] | None) -> list[Death]:
    """The ``x-death`` history in ``headers`` (entries that do not parse are skipped)."""
    raw = (headers or {}).get("x-death")
    out: list[Death] = []
    if not isinstance(raw, list):
        return out
    for item in raw:
        if not isinstance(item, dict):
            continue
        keys = item.get("routing-keys")
        out.append(
            Death(
                str(item.get("queue", "")),
                str(item.get("reason", "")),
                int(item.get("count", 1)) if isinstance(item.get("count", 1), int) else 1,
                int(item.get("time", 0)) if isinstance(item.get("time", 0), (int, float)) else 0,
                str(item.get("exchange", "")),
                [str(k) for k in keys] if isinstance(keys, list) else [],
            )
        )
    return out


class Message:
    """One delivered message.

    Attributes:
        body: the message bytes.
        properties: its :class:`~client.codec.Properties`.
        exchange, routing_key: where it was published.
        redelivered: the broker delivered it before (to this or another consumer) and
            it was not acked then.
        delivery_count: how many times its queue delivered it before this delivery
            (0 the first time); see :attr:`death` for its dead-letter history.
        delivery_tag: its tag on the session that delivered it.
        consumer_tag: the consumer it was delivered to.
    """

    __slots__ = (
        "body", "_properties", "_raw_properties", "exchange", "routing_key", "redelivered", "delivery_tag",
        "consumer_tag", "generation", "_settler", "_settled", "delivery_count",
    )

    def __init__(
        self,
        settler: Settler,
        generation: int,
        *,
        body: bytes,
        properties: Properties | None = None,
        exchange: str,
        routing_key: str,
        redelivered: bool,
        delivery_tag: int,
        consumer_tag: str,
        settled: bool = False,
        delivery_count: int = 0,
        raw_properties: dict[str, Any] | None = None,
    ) -> None:
        """``properties``, or ``raw_properties``: the wire object, already checked
        (:func:`~client.codec.check_properties`), made :class:`Properties` when
        first read. Building them is most of what handing out a delivery costs, and
        many consumers never read them."""
        self.body = body
        self.delivery_count = delivery_count
        self._properties = properties
        self._raw_properties = raw_properties
        self.exchange = exchange
        self.routing_key = routing_key
        self.redelivered = redelivered
        self.delivery_tag = delivery_tag
        self.consumer_tag = consumer_tag
        #: Which session of the channel delivered it (internal).
        self.generation = generation
        self._settler = settler
        self._settled = settled

    @property
    def properties(self) -> Properties:
        props = self._properties
        if props is None:
            props = self._properties = Properties.from_json(self._raw_properties)
        return props

    @properties.setter
    def properties(self, value: Properties) -> None:
        self._properties = value

    @property
    def message_id(self) -> str | None:
        return self.properties.message_id

    @property
    def death(self) -> list[Death]:
        """The message's dead-letter history (its ``x-death`` header), newest first:
        empty for a message never dead-lettered."""
        return parse_death(self.properties.headers)

    @property
    def settled(self) -> bool:
        """``ack``/``nack``/``reject`` was called (or the consumer is ``no_ack``)."""
        return self._settled

    def text(self, encoding: str = "utf-8") -> str:
        """The body decoded as text."""
        return self.body.decode(encoding)

    async def ack(self) -> bool:
        """Acknowledge: the broker forgets the message.

        Returns ``True`` when the ack was sent on the session that delivered the message,
        ``False`` when that session is gone or the delivery expired: then the broker has
        already put the message back in its queue and will deliver it again
        (``redelivered``), so it is processed at least once. A ``True`` ack can still
        be lost if the connection drops before the broker reads it, with the same
        outcome.

        Raises:
            MessageAlreadySettled: already settled; nothing was sent.
        """
        return await self._settler.settle(self, "ack", False)

    async def nack(self, *, requeue: bool = True, delay_s: float | None = None) -> bool:
        """Negative-acknowledge: with ``requeue`` (the default) the message goes back to
        its place in the queue — after ``delay_s`` seconds if given (a retry later) —;
        without, the broker dead-letters it to its queue's dead-letter exchange (reason
        ``rejected``), or drops it when the queue has none. A message past its queue's
        ``x-delivery-limit`` is dead-lettered instead of requeued. Returns like
        :meth:`ack`.

        Raises:
            MessageAlreadySettled: already settled; nothing was sent.
            ValueError: ``delay_s`` without ``requeue``, or out of range.
        """
        check_delay(requeue, delay_s)
        return await self._settler.settle(self, "nack", requeue, delay_s)

    async def reject(self, *, requeue: bool = False, delay_s: float | None = None) -> bool:
        """Reject: by default the message is dead-lettered (or dropped, see
        :meth:`nack`); with ``requeue=True`` it goes back to the queue, after
        ``delay_s`` if given. Returns like :meth:`ack`.

        Raises:
            MessageAlreadySettled: already settled; nothing was sent.
            ValueError: ``delay_s`` without ``requeue``, or out of range.
        """
        check_delay(requeue, delay_s)
        return await self._settler.settle(self, "reject", requeue, delay_s)

    async def touch(self) -> bool:
        """Reset this delivery's ack timeout (consumers started with ``ack_timeout_s``):
        a handler that needs longer than the timeout calls this now and then so the
        broker does not take the message back. Returns ``True`` when sent on the session
        that delivered the message, ``False`` when that session is gone or the delivery
        already expired (the broker requeued it).

        Raises:
            MessageAlreadySettled: already settled; nothing was sent.
        """
        if self._settled:
            raise MessageAlreadySettled(
                f"message {self.delivery_tag} of consumer {self.consumer_tag!r} is already settled"
            )
        await anyio.lowlevel.checkpoint()
        return self._settler.touch(self)

    def _mark_settled(self) -> None:
        """Raises MessageAlreadySettled when already settled."""
        if self._settled:
            raise MessageAlreadySettled(
                f"message {self.delivery_tag} of consumer {self.consumer_tag!r} is already settled"
            )
        self._settled = True

    def __repr__(self) -> str:
        return (
            f"<Message tag={self.delivery_tag} rk={self.routing_key!r} "
            f"id={self.message_id!r} redelivered={self.redelivered}>"
        )


class MessageStream:
    """The messages of one consumer, as an async iterator (``async for msg in stream``).

    Iteration ends (``StopAsyncIteration``) once the consumer is stopped. It raises
    :class:`~client.errors.ConsumerCancelled` (after the buffered messages) when the
    broker cancelled the consumer, and :class:`~client.errors.ConnectionLost` or
    :class:`~client.errors.ClientClosed` when its channel is gone.
    """

    def __init__(
        self,
        queue: str,
        consumer_tag: str,
        *,
        prefetch: int,
        no_ack: bool,
        exclusive: bool,
        arguments: dict[str, Any] | None,
        ack_timeout_s: float | None = None,
    ) -> None:
        self.queue = queue
        self.ack_timeout_s = ack_timeout_s
        self.consumer_tag = consumer_tag
        self.prefetch = prefetch
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.arguments = arguments
        #: Generation of the session this consumer was last established on.
        self.consumed_generation = 0
        #: Reply to the ``cancel`` sent when stopping, if one was sent.
        self.cancel_reply: Reply | None = None
        self.delivered = 0
        self._buffer: deque[Message] = deque()
        self._next_calls = 0
        self._wake = anyio.Event()
        self._receiving = True
        self._receiving_changed = anyio.Event()
        self._stopped = False
        self._end: Callable[[], ClientError] | None = None

    @property
    def stopped(self) -> bool:
        """Stopped by this program (no more messages will be yielded)."""
        return self._stopped

    @property
    def active(self) -> bool:
        """Neither stopped nor ended by the broker or a channel failure."""
        return not self._stopped and self._end is None

    @property
    def receiving(self) -> bool:
        """Whether the broker delivers to this consumer: False while it is a standby of
        a single-active-consumer queue (``x-single-active-consumer``), until the active
        one goes; see :meth:`wait_receiving`."""
        return self._receiving

    async def wait_receiving(self) -> None:
        """Wait until this consumer is the active one of its queue."""
        while not self._receiving:
            await self._receiving_changed.wait()

    def _set_receiving(self, receiving: bool) -> None:
        self._receiving = receiving
        if receiving:
            self._receiving_changed.set()
            self._receiving_changed = anyio.Event()

    @property
    def buffered(self) -> int:
        """Messages received and not yet yielded."""
        return len(self._buffer)

    def consume_op(self) -> dict[str, Any]:
        op: dict[str, Any] = {
            "op": "consume",
            "queue": self.queue,
            "consumer_tag": self.consumer_tag,
            "prefetch": self.prefetch,
            "no_ack": self.no_ack,
        }
        if self.exclusive:
            op["exclusive"] = True
        if self.arguments:
            op["arguments"] = self.arguments
        if self.ack_timeout_s is not None:
            op["ack_timeout_ms"] = max(1, round(self.ack_timeout_s * 1000))
        return op

    def __aiter__(self) -> MessageStream:
        return self

    async def __anext__(self) -> Message:
        self._next_calls += 1
        if not self._buffer or not self._next_calls % YIELD_EVERY:
            await anyio.lowlevel.checkpoint()
        while True:
            if self._stopped:
                raise StopAsyncIteration
            if self._buffer:
                return self._buffer.popleft()
            if self._end is not None:
                raise self._end()
            if self._wake.is_set():
                self._wake = anyio.Event()
            await self._wake.wait()

    async def receive(self) -> Message:
        """The next message.

        Raises:
            anyio.EndOfStream: the consumer was stopped.
            ConsumerCancelled, ConnectionLost, ClientClosed: see the class docstring.
        """
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            raise anyio.EndOfStream from None

    # --- driven by the channel --------------------------------------------------------

    def push(self, message: Message) -> None:
        self.delivered += 1
        self._buffer.append(message)
        self._wake.set()

    def take_buffer(self) -> list[Message]:
        messages = list(self._buffer)
        self._buffer.clear()
        return messages

    def drop_generation(self, generation: int) -> None:
        """Forget buffered deliveries of an ended session (the broker requeued them)."""
        if self.no_ack or not self._buffer:
            return
        self._buffer = deque(m for m in self._buffer if m.generation != generation)

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    def cancelled_by_broker(self, reason: str) -> None:
        tag = self.consumer_tag
        self.end(lambda: ConsumerCancelled(tag, reason))

    def end(self, make_error: Callable[[], ClientError]) -> None:
        if self._end is None:
            self._end = make_error
        self._wake.set()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else ("ended" if self._end else "active")
        return f"<MessageStream {self.consumer_tag!r} queue={self.queue!r} {state}>"
