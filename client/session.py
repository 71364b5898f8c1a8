"""One session of a channel: a :class:`SessionLink`, the ``POST /channel`` exchange on
its own connection that carries the channel's ops out and its events in.

A :class:`~client.channel.Channel` outlives its sessions: when one drops, its
supervisor (:mod:`client.supervisor`) opens the next. A session only moves lines:

- :func:`open_session` connects, sends the request head, and reads up to the ``open``
  event (events that arrived in the same read are kept and dispatched first).
- :meth:`SessionLink.send_nowait` queues an encoded op; a writer task flushes the
  queue in chunks, many ops per chunk, so pipelined publishes cost one syscall per
  batch rather than per message. A lone op with no other task runnable (a publisher
  awaiting its confirm, a paced producer asleep) is written at once instead: waiting
  scheduling rounds for ops nobody is about to queue would only add latency. The
  queue is bounded by its producers: publishes by the pending window, acks by
  prefetch, requests by their callers.
- *Direct writes*: an op that nothing is queued behind, and that the caller marks
  ``direct`` (a publish with no other publish unconfirmed that did not wait for room
  in the window, a request) is not handed
  to the writer when the writer is parked with nothing queued or being sent: it is
  written by :meth:`SessionLink.send_nowait` itself, in the producer's own step,
  with a non-blocking write (plain TCP only, see
  :meth:`~client.duplex.DuplexExchange.write_nowait`). Handing it over cost a pass
  of trio's run loop, and often the reading of a confirm woken in the same pass went
  first. The rule is Nagle's: send at once when nothing is in flight, else let the
  batch build up. A publishing loop keeps publishes unconfirmed, so its ops queue
  and leave in large chunks as before; so do settling ops (``ack``, ``nack``,
  ``reject``, ``touch``), never ``direct``: nobody waits on them, and a consumer
  settles in bursts. Order is kept: a direct write happens only with nothing queued
  or being sent, and bytes the socket did not take go out (by the writer) before
  anything else.
- :meth:`SessionLink.serve` runs the writer and the reader until the exchange ends,
  handing each decoded event to a callback, synchronously and in order. After a read
  that handed deliveries to consumers, the reader lets them run before it reads
  again.

Rules: a session never reconnects and is never reused. It ends exactly once; its
``end_reason`` is ``None`` for a clean end (the broker ended the response), else the
error that ended it. Per-session state the channel needs (outstanding replies,
unacked deliveries) is kept here so it dies with the session.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from ._backend import tasks_runnable
from .codec import (
    Deliver,
    DeliverBatch,
    Error,
    Event,
    LineSplitter,
    Open,
    decode_event,
    encode_op,
)
from .duplex import DuplexExchange
from .endpoint import Endpoint, StreamOpener
from .errors import ChannelClosedByBroker, ClientError, ConnectionLost, ProtocolError
from .messages import Reply

if TYPE_CHECKING:
    from .consumer import Message

__all__ = ["SessionLink", "open_session", "Reply", "SessionEnded"]

CHUNK_BYTES = 256 * 1024
# Scheduling rounds the writer waits for more ops before sending a chunk (unless a lone
# op is queued and no other task is runnable: that one goes at once). More rounds
# make bigger chunks but stall the pipeline: with 64, a window of 1000 publishes went
# out as one lump and confirms came back in lumps (pipelined publish ~25k/s); with 8,
# publishes and confirms overlap (~31k/s, same machine and run).
COALESCE_ROUNDS = 8
#: Most delivery tags in one ``ack`` op's ``delivery_tags`` (each extension of the
#: queued op re-encodes it).
ACK_LIST_MAX = 128
# The ``multiple`` ack line, formatted rather than encoded from a dict (once per
# message a consumer acks in order; the same bytes ``encode_op`` makes of an int tag).
_MULTIPLE_ACK = b'{"op":"ack","delivery_tag":%d,"multiple":true}\n'


class SessionEnded(Exception):
    """Internal: the session a reply was awaited on ended first."""


class SessionLink:
    """One session of a channel: a live ``POST /channel`` exchange, and what dies with
    it (its replies awaited, its deliveries unsettled, its ack coalescing). Created by
    :func:`open_session`."""

    def __init__(
        self,
        exchange: DuplexExchange,
        generation: int,
        opened: Open,
        splitter: LineSplitter,
        backlog: list[Event],
    ) -> None:
        self.generation = generation
        self.channel_id = opened.channel
        self.server = opened.server
        #: The broker takes ``ack`` ops with ``delivery_tags`` (and may send
        #: ``deliveries`` events, which are read either way).
        self.batches = "batches" in opened.features
        #: Recovery finished: publishes may be written to this session.
        self.ready = False
        #: The broker announced ``closing``: send no new publishes here.
        self.draining = False
        #: Outstanding request replies by op id.
        self.replies: dict[int, Reply] = {}
        #: Deliveries not yet settled, by delivery tag.
        self.deliveries: dict[int, Message] = {}
        self.end_reason: BaseException | None = None
        self.ended = anyio.Event()
        self._exchange = exchange
        self._splitter = splitter
        self._backlog = backlog
        self._out: deque[bytes] = deque()
        # Ops queued so far, counting an ack merged into the queued ack before it: how
        # the writer's coalescing sees that ops are still coming (see _coalesce).
        self._queued = 0
        # Only settling ops were queued since the writer last parked (see _coalesce).
        self._settles_only = True
        self._out_ready = anyio.Event()
        # True only while the writer is parked with nothing queued or left over: an
        # op may then be written directly (see the module docstring).
        self._direct = False
        # Framed bytes a direct write left over; the writer sends them first.
        self._leftover = b""
        self._finish = False
        self._scope = anyio.CancelScope()
        # Every delivery tag up to this one is settled (or was never ours to settle),
        # as far as acks have looked (see send_ack).
        self._settled_floor = 0
        # The multiple ack last queued, while it is still the last queued op.
        self._ack_tail: bytes | None = None
        # The tags of the ``delivery_tags`` ack last queued (and its line), while it
        # is still the last queued op.
        self._ack_list: list[int] = []
        self._ack_list_line: bytes | None = None

    @property
    def alive(self) -> bool:
        return not self.ended.is_set()

    def send_nowait(self, line: bytes, *, direct: bool = True, settling: bool = False) -> None:
        """Queue one encoded op line (no effect once the session is finishing), or,
        with ``direct``, write it at once when the writer is idle (see the module
        docstring). A connection found broken by that write ends the session (the op
        is then lost with it, as a queued one would be). ``settling``: an ``ack``,
        ``nack``, ``reject`` or ``touch``, which nobody waits on (never ``direct``;
        see :meth:`_coalesce`)."""
        if self._finish or self.ended.is_set():
            return
        if not settling:
            self._settles_only = False
        if self._direct and direct:
            try:
                leftover = self._exchange.write_nowait(line)
            except ConnectionLost as exc:
                self.abort(exc)
                return
            if leftover:
                # The writer sends it first; until then nothing may be written directly.
                self._leftover = leftover
                self._direct = False
                self._out_ready.set()
            return
        self._direct = False  # an op is queued: nothing may overtake it
        self._queued += 1
        self._out.append(line)
        self._out_ready.set()

    def send_ack(self, tag: int) -> None:
        """Queue the ack of delivery ``tag`` (already gone from :attr:`deliveries`).

        When no earlier delivery is unsettled it goes as ``multiple`` (which settles
        only ``tag`` then), and a run of such acks queued back to back, as a consumer
        acking in order makes them, leaves as one op: the last one queued replaces
        its predecessor while that is still last in the queue. The broker then parses
        and applies one op per chunk of acks instead of one per message."""
        deliveries = self.deliveries
        floor = self._settled_floor
        # Deliveries arrive in tag order, so every tag below ``tag`` has arrived:
        # advance over those not pending any more (amortised O(1): it never goes back).
        while floor < tag and floor + 1 not in deliveries:
            floor += 1
        self._settled_floor = floor
        out = self._out
        if floor != tag:
            if not self.batches:
                self.send_op({"op": "ack", "delivery_tag": tag}, direct=False, settling=True)
                return
            # Out of order: acks queued back to back leave as one op listing them.
            tags = self._ack_list
            extend = self._ack_list_line is not None and out and out[-1] is self._ack_list_line
            if extend and len(tags) < ACK_LIST_MAX:
                tags.append(tag)
            else:
                tags = self._ack_list = [tag]
                extend = False
            line = encode_op({"op": "ack", "delivery_tags": tags})
            if extend:
                out[-1] = line
                self._queued += 1
            else:
                self.send_nowait(line, direct=False, settling=True)
            self._ack_list_line = line if out and out[-1] is line else None
            return
        line = _MULTIPLE_ACK % tag
        if self._ack_tail is not None and out and out[-1] is self._ack_tail:
            out[-1] = line
            self._queued += 1
        else:
            self.send_nowait(line, direct=False, settling=True)
        self._ack_tail = line if out and out[-1] is line else None

    def send_op(self, op: dict[str, Any], *, direct: bool = True, settling: bool = False) -> None:
        """Encode and queue one op (``direct``, ``settling``: see :meth:`send_nowait`)."""
        self.send_nowait(encode_op(op), direct=direct, settling=settling)

    def request(self, op: dict[str, Any], op_id: int) -> Reply:
        """Queue ``op`` with ``id`` = ``op_id`` and return the awaitable reply."""
        reply = Reply(str(op.get("op")))
        if self.ended.is_set():
            reply.fail(SessionEnded())
            return reply
        self.replies[op_id] = reply
        self.send_op({**op, "id": op_id})
        return reply

    def finish_nowait(self) -> None:
        """Flush what is queued, then end the request body (used after ``close``)."""
        self._finish = True
        self._out_ready.set()

    def abort(self, reason: BaseException | None = None) -> None:
        """End the session now (the connection is closed by :meth:`serve`)."""
        if self.end_reason is None and reason is not None:
            self.end_reason = reason
        self._direct = False
        self._scope.cancel()

    async def serve(self, on_event: Callable[[SessionLink, Event], None]) -> None:
        """Run the writer and the reader until the exchange ends; then close the
        connection, fail outstanding replies with :class:`SessionEnded`, and set
        :attr:`ended`. Never raises :class:`ClientError`: the reason is stored in
        :attr:`end_reason`. Exceptions raised by ``on_event`` other than
        :class:`ClientError` are bugs and propagate."""
        try:
            with self._scope:
                async with anyio.create_task_group() as nursery:
                    nursery.start_soon(self._guard, self._write_loop, nursery.cancel_scope)
                    await self._guard(lambda: self._read_loop(on_event), nursery.cancel_scope)
        finally:
            with anyio.CancelScope(shield=True):
                await self._exchange.aclose()
            for reply in self.replies.values():
                reply.fail(SessionEnded())
            self.replies.clear()
            self.ended.set()

    async def _guard(self, fn: Callable[[], Any], scope: anyio.CancelScope) -> None:
        try:
            await fn()
        except ClientError as exc:
            if self.end_reason is None:
                self.end_reason = exc
        finally:
            scope.cancel()

    async def _read_loop(self, on_event: Callable[[SessionLink, Event], None]) -> None:
        backlog, self._backlog = self._backlog, []
        for event in backlog:
            on_event(self, event)
        while True:
            data = await self._exchange.receive_some()
            if not data:
                self._splitter.check_at_end()
                return
            delivered = False
            for line in self._splitter.feed(data):
                event = decode_event(line)
                on_event(self, event)
                delivered = delivered or type(event) is Deliver or type(event) is DeliverBatch
            if delivered and tasks_runnable():
                await _let_consumers_run()

    async def _write_loop(self) -> None:
        out = self._out
        exchange = self._exchange
        # The ops queued now have had their coalescing wait (see below).
        coalesced = False
        while True:
            if self._leftover:
                leftover, self._leftover = self._leftover, b""
                await exchange.send_framed(leftover)
                continue
            if not out:
                if self._finish:
                    await exchange.end()
                    await anyio.sleep_forever()
                self._out_ready = anyio.Event()
                self._direct = exchange.can_write_nowait
                parked_at = self._queued
                self._settles_only = True
                try:
                    await self._out_ready.wait()
                finally:
                    self._direct = False
                if out:
                    await self._coalesce(self._queued - parked_at, self._settles_only)
                    coalesced = True
                continue
            if not coalesced and self._settles_only:
                # Only settling ops came while the last chunk was being sent: a consumer
                # still acking. Let it add more, as after a park, rather than sending a
                # chunk per pass of the run loop from here on.
                coalesced = True
                await self._coalesce(2, True)
                continue
            batch: list[bytes] = []
            size = 0
            while out and size < CHUNK_BYTES:
                line = out.popleft()
                batch.append(line)
                size += len(line)
            self._settles_only = True
            coalesced = False
            await exchange.send(b"".join(batch))

    async def _coalesce(self, queued_while_parked: int, settles_only: bool) -> None:
        """Wait while ops may still be coming, so that one chunk carries many.

        The writer has just been woken by a first op (``queued_while_parked`` ops were
        queued since it parked). Tasks producing ops right now (a publishing loop, a
        consumer acking) queue more in the next scheduling rounds: wait for them while
        ops keep coming, up to ``COALESCE_ROUNDS`` rounds, until two rounds in a row
        add nothing. Ops are counted as queued, not by the queue's length: an in-order
        ack merged into the queued ``multiple`` ack before it (:meth:`send_ack`)
        leaves the length at one, and judged by the length a consumer acking in order
        had its acks sent every other round, a chunk per ~16 messages instead of one
        per batch of deliveries. But a lone op with no other task runnable goes at
        once: nobody is about to queue another (its publisher awaits the confirm, a
        paced producer sleeps), and waiting would only add latency (two of the six
        passes of the run loop per one-at-a-time publish). Not when only settling ops
        were queued (``settles_only``): nobody waits on them, and the consumer
        settling them may well be among the tasks of this very pass, which
        ``tasks_runnable`` does not see; sent at once, its acks left in a chunk per
        one or two of its schedule points again. They wait the two quiet rounds (two
        passes of the run loop with nothing else to do).

        ``tasks_runnable`` does not count tasks still to run in the current batch: a
        producer among them that queues more right after this send just wakes the
        writer again. For the same reason a round without growth and with nothing
        runnable is no proof that producing is over, and ending there halved the
        ops per chunk of pipelined publishing and acking (64 to 32 publishes, 29 to
        14 acks): with several ops queued the two quiet rounds stay.
        """
        if queued_while_parked <= 1 and not settles_only and not tasks_runnable():
            return
        quiet = 0
        for _ in range(COALESCE_ROUNDS):
            queued = self._queued
            await anyio.lowlevel.cancel_shielded_checkpoint()
            if self._queued != queued:
                quiet = 0
                continue
            quiet += 1
            if quiet == 2:
                return


async def _let_consumers_run() -> None:
    """Let the consumers just handed deliveries run before the reader reads again.

    The reader's next read usually finds nothing and has to register for readiness;
    done first, it delays the consumer, whose delivery is waiting (traced with trio
    instruments on the e2e benchmark: hand-over to the consumer's step 43 -> 34 µs
    median, the reader's step after the hand-over 33 -> 17 µs). Trio runs the tasks
    of one pass in random order, so one schedule point would put the consumer first
    only half of the time: two do it always, for one extra run-loop pass per read (a
    pass serves all the deliveries of the read). Only after deliveries: a reader
    that yields is a runnable task, and the writer, seeing one, would wait rounds
    for more ops before sending a lone one (a publisher's next publish after its
    confirm, say).
    """
    await anyio.lowlevel.checkpoint()
    await anyio.lowlevel.checkpoint()


async def open_session(
    endpoint: Endpoint,
    opener: StreamOpener,
    *,
    generation: int,
    max_line_bytes: int,
) -> SessionLink:
    """Open ``POST /channel`` and read up to its ``open`` event. The caller bounds the
    time with a cancel scope.

    Raises:
        ConnectionLost: the broker could not be reached or the connection broke.
        BrokerRequestError: the broker refused the channel request (non-200).
        ChannelClosedByBroker: the broker answered with an ``error`` event.
        ProtocolError: the first event is not ``open`` or not valid.
    """
    try:
        stream = await opener(endpoint)
    except OSError as exc:
        raise ConnectionLost(f"cannot connect to {endpoint}: {exc}") from exc
    exchange = await DuplexExchange.open(
        stream,
        endpoint,
        endpoint.target("/channel"),
        # batches: many deliveries in one event, many acks in one op (docs/protocol.md)
        headers=[
            ("Content-Type", "application/x-ndjson"), ("Accept", "application/x-ndjson"),
            ("Ackbus-Features", "batches"),
        ],
    )
    ok = False
    try:
        splitter = LineSplitter(max_line_bytes)
        events: list[Event] = []
        while not events:
            data = await exchange.receive_some()
            if not data:
                raise ConnectionLost(f"{endpoint}: channel response ended before 'open'")
            events = [decode_event(line) for line in splitter.feed(data)]
        first = events[0]
        if isinstance(first, Error):
            raise ChannelClosedByBroker(first.code, first.message)
        if not isinstance(first, Open):
            raise ProtocolError(f"channel started with {type(first).__name__}, not 'open'")
        session = SessionLink(exchange, generation, first, splitter, events[1:])
        ok = True
        return session
    finally:
        if not ok:
            with anyio.CancelScope(shield=True):
                await exchange.aclose()
