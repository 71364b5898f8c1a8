"""``GET /queues/{name}/stream``: streaming consume for curl and browsers.

A half-duplex consumer: NDJSON by default, Server-Sent Events with
``Accept: text/event-stream``. With ``ack=auto`` a message is acked once it has been
written to the connection (messages still waiting in the stream's buffer when the
client leaves go back to the queue, redelivered), and ``prefetch`` bounds the messages
waiting to be written; with ``ack=lease`` each message carries a ``lease_id`` settled
through the REST lease calls, ``prefetch`` bounds the outstanding leases, and leases
still open when the stream ends go back to the queue. Either way the channel's byte
credit bounds what the stream buffers for a client that stops reading.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from broker.api.codec import dumps_line, message_json
from broker.api.permissions import Access, access_for
from broker.core import (
    Broker,
    ConsumerCancelled,
    Deliver,
    Effect,
    ErrorReply,
    InvalidArgument,
    delivery_cost,
)
from broker.http import ClientDisconnected, Request, Response
from broker.runtime import CommandGateway

__all__ = ["handle_stream"]

log = logging.getLogger("ackbus.stream")

SSE_HEARTBEAT_S = 15.0


class _StreamSink:
    def __init__(
        self, remote: str | None = None, gateway: CommandGateway | None = None, channel_id: int = 0, queue: str = ""
    ) -> None:
        #: Who and since when, for ``GET /channels`` (``broker/api/rest/channels.py``).
        self.kind = "stream"
        self.remote = remote
        self.opened_at = time.time()
        self.outbox: list[Any] = []
        self.wakeup = trio.Event()
        self.closing_reason: str | None = None
        self.cancelled: str | None = None
        #: The error code of the stream's last line, when revocation ended it.
        self.error: str | None = None
        self._gateway = gateway
        self._channel_id = channel_id
        self._queue = queue

    def push(self, effect: Effect) -> None:
        if isinstance(effect, Deliver):
            self.outbox.append(effect)
        elif isinstance(effect, ConsumerCancelled):
            self.cancelled = effect.reason
        self.wakeup.set()

    def closing(self, reason: str) -> None:
        self.closing_reason = reason
        self.wakeup.set()

    def shutdown(self) -> None:
        # Not a cancel: the writer must still send the ``closing`` line that
        # :meth:`closing` asked for (both may be called in the same tick). The
        # writer ends by itself once its outbox is flushed; one stuck on a client that
        # does not read is cancelled by the server's shutdown grace period.
        if self.closing_reason is None:
            self.closing_reason = "broker shutting down"
        self.wakeup.set()


    # Revocable (broker.api.auth) -------------------------------------------

    def revoke(self, error: ErrorReply) -> None:
        """The user was deleted or its token revoked: stop consuming now, end the
        stream with a ``closing`` line giving the error and why."""
        self._end(error.code, error.message)

    def recheck(self, access: Access) -> None:
        """The user's permissions changed: end the stream if it may no longer read."""
        if not access.allows("read", self._queue):
            reason = f"read permission on queue {self._queue!r} was revoked for user {access.username!r}"
            self._end("access_refused", reason)

    def _end(self, code: str, reason: str) -> None:
        gateway = self._gateway
        if self.error is not None or gateway is None:
            return
        channel_id = self._channel_id
        tags = gateway.views.consumer_tags(channel_id)

        def cancel_all(core: Broker) -> None:  # nothing is delivered from here on
            for tag in tags:
                core.cancel(channel_id, tag)

        # (called inside the command that changed the user: its effects are that
        # command's to carry out)
        gateway.batch().run(cancel_all)
        self.error = code
        self.cancelled = reason
        self.wakeup.set()


def _stream_item(d: Deliver) -> dict[str, Any]:
    item = message_json(d.message, d.delivery_count)
    item.update(
        exchange=d.message.exchange,
        routing_key=d.message.routing_key,
        redelivered=d.redelivered,
    )
    if d.lease_id is not None:
        item["lease_id"] = d.lease_id
    return item


async def handle_stream(gateway: CommandGateway, request: Request, response: Response) -> None:
    """Stream a queue's messages until the client leaves or the broker closes."""
    gateway.check_ready()
    options = gateway.runtime.options
    queue = request.path_params["name"]
    access_for(request).require("consume", queue)
    prefetch = request.query.get_int("prefetch", 100)  # the core checks its range (consume)
    ack_mode = request.query.get_str("ack", "auto")
    if ack_mode not in ("auto", "lease"):
        raise InvalidArgument("ack must be auto or lease")
    lease_s = request.query.get_float("lease", options.default_lease_s, min_value=0.001, max_value=options.max_lease_s)
    sse = "text/event-stream" in (request.headers.get("accept") or "")
    await request.read_body()
    principal = request.principal
    if principal is not None:
        gateway.runtime.check_channel_room()
        principal.check_consumer(gateway.runtime.core)  # a stream is one consumer of the user's
    channel_id = gateway.open_channel()
    sink = _StreamSink(request.remote, gateway, channel_id, queue)
    gateway.attach(channel_id, sink)
    disconnected = False
    try:
        if principal is not None:
            principal.open_channel(channel_id)  # and one of its channels
            principal.open_session(sink)  # ended at once if its credentials are revoked
        # Auto mode is not a no_ack consumer: its deliveries are acked by the writer
        # once written, so a client that leaves loses nothing still buffered here.
        lease = lease_s if ack_mode == "lease" else None
        # (its effects, the first deliveries, are carried out once the response started)
        gateway.batch().run(lambda core: core.consume(channel_id, queue, prefetch=prefetch, lease_s=lease))
        content_type = "text/event-stream" if sse else "application/x-ndjson"
        await response.start(200, content_type=content_type, headers=[("cache-control", "no-cache")])
        gateway.flush()
        async with trio.open_nursery() as nursery:

            async def watch_client() -> None:
                nonlocal disconnected
                await request.wait_disconnected()
                disconnected = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_client)
            try:
                await _write_loop(gateway, channel_id, sink, response, sse, ack_mode == "auto")
            except ClientDisconnected:
                disconnected = True
            nursery.cancel_scope.cancel()
        if not disconnected:
            await response.end()
    except ClientDisconnected:
        pass
    finally:
        if principal is not None:
            principal.close_channel(channel_id)
            principal.close_session(sink)
        gateway.close_channel(channel_id, "stream ended")


async def _write_loop(
    gateway: CommandGateway, channel_id: int, sink: _StreamSink, response: Response, sse: bool, auto_ack: bool
) -> None:
    while True:
        if not sink.outbox:
            if sink.cancelled is not None or sink.closing_reason is not None:
                reason = sink.cancelled or sink.closing_reason
                last: dict[str, Any] = {"reason": reason}
                if sink.error is not None:
                    last["error"] = sink.error
                if sse:
                    await response.send(b"event: closing\ndata: " + dumps_line(last) + b"\n")
                else:
                    await response.send(dumps_line({"ev": "closing", **last}))
                return
            sink.wakeup = trio.Event()
            with trio.move_on_after(SSE_HEARTBEAT_S if sse else float("inf")):
                await sink.wakeup.wait()
                continue
            await response.send(b": heartbeat\n\n")
            continue
        batch = sink.outbox
        sink.outbox = []
        parts = []
        credit = 0
        for d in batch:
            line = dumps_line(_stream_item(d))
            if sse:
                parts.append(b"data: " + line + b"\n")
            else:
                parts.append(line)
            credit += delivery_cost(d.message.body)
        await response.send(b"".join(parts))
        # One that expired meanwhile (a queue's short x-consumer-timeout and a slow
        # write) is back in its queue already: it is not acked.
        written = gateway.views.unacked_tags(channel_id, [d.delivery_tag for d in batch]) if auto_ack else []

        def settle(core: Broker) -> None:
            for tag in written:
                core.ack(channel_id, tag)
            core.grant_credit(channel_id, credit)

        gateway.run(settle)
