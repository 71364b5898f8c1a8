"""``POST /channel``: one full-duplex HTTP/1.1 exchange carrying an AMQP-style channel.

Rules (docs/protocol.md):

* The response (status 200, chunked NDJSON) starts with ``open`` before the request
  body has ended; from then on every error travels in-band as an ``error`` event,
  because a final status sent mid-upload makes clients such as curl stop sending.
* Operations are applied in order. All complete lines of one received chunk are
  applied before the core's effects are pumped, so the confirms of a chunk's
  publishes leave together (coalesced with ``multiple``) after one fsync.
* An op that has a reply (``ok``, ``consume_ok``, ``cancel_ok``, ``close_ok``) first
  pumps the core, so its reply follows every delivery, return and confirm that the ops
  before it made possible (confirms still waiting for an fsync excepted). A client can
  use any such op as a barrier. ``publish`` and the settling ops (``ack``, ``nack``,
  ``reject``, ``touch``) do not pump: their effects leave with the rest of the chunk.
* One reader task (ops in) and one writer task (events out). The writer batches every
  queued event into one chunk. When the connection is idle, events queued during a
  pump leave at its end instead, in the pumping task's own step
  (:meth:`ServedChannel.flush_nowait`): a delivery goes out in the step of the
  publish that caused it, a confirm in the step of the fsync that released it, without
  waiting a pass of trio's run loop for the writer (nor behind the reader's next
  read). While the outbox holds more than ``OUTBOX_MAX_EVENTS`` events, or more than
  ``OUTBOX_MAX_BYTES`` bytes of events other than deliveries
  (returns carry whole message bodies), the reader stops reading, so a client that
  publishes without reading its confirms is slowed by TCP backpressure instead of
  growing broker memory. Likewise while the publishes still waiting for their confirm
  (their records waiting for the disk) exceed ``UNCONFIRMED_MAX_BYTES``: a publisher
  that outruns fsync is slowed down too. Deliveries are bounded separately by the
  core's per-channel byte credit, which the writer returns as it sends.
* However the exchange ends (``close``, end of the request body, disconnect, channel
  error, broker shutdown) the channel is closed in the core exactly once: unacked
  deliveries go back to their queues and consumers are cancelled. Once the channel is
  ending (``close_ok`` or ``error`` queued) its consumers are cancelled at once and the
  session detaches from the runtime, so no event (a delivery, an ack timeout
  expiring) follows those final events.

* Every op's fields are listed; an unknown field is refused (``invalid_argument``),
  as over REST.

The package, by job: ``session.py`` (the session's state, outbox and event writer),
``opfields.py`` (each op's fields and the envelope they share), ``ops.py`` (each
op's handler; the lock ops are ``lock_ops.py``), ``typed.py`` (the per-message
ops, ``publish`` and ``ack``, decoded into typed structs in C: a fast path that
declines whatever the general path must judge), ``reader.py`` (the reader task:
lines in, ops applied, effects flushed per chunk), ``serve.py`` (one channel's
lifetime: open, the two tasks, the ending). Every core command goes through the
runtime's :class:`~broker.runtime.CommandGateway`.
"""

from broker.api.channel.serve import NDJSON_HEADERS, handle_channel
from broker.api.channel.session import (
    EVENT_BYTES,
    FLUSH_TIMEOUT_S,
    OUTBOX_MAX_BYTES,
    OUTBOX_MAX_EVENTS,
    UNCONFIRMED_MAX_BYTES,
    ServedChannel,
)

__all__ = [
    "EVENT_BYTES",
    "FLUSH_TIMEOUT_S",
    "NDJSON_HEADERS",
    "OUTBOX_MAX_BYTES",
    "OUTBOX_MAX_EVENTS",
    "UNCONFIRMED_MAX_BYTES",
    "ServedChannel",
    "handle_channel",
]
