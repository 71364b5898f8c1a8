"""A channel's outbox as the bytes of one chunk: every queued event encoded, many
deliveries per ``deliveries`` event when the client takes them (docs/protocol.md,
"Batches"), with the delivery credit the chunk uses (compiled in the compiled build;
docs/architecture.md, "The compiled build").

``ServedChannel._take_outbox`` calls :func:`encode_outbox` once per flush; the
per-delivery work (a row of a ``deliveries`` event, its credit) is here, so that the
compiled build reads the core's ``Deliver`` effects natively.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from broker.api.codec import event_json
from broker.core import Deliver, delivery_cost

__all__ = ["BATCH_MAX_BYTES", "delivery_row", "encode_outbox"]

# Bodies (delivery_cost) past which a ``deliveries`` event is closed and the next
# begins: keeps an event line far below a client's longest accepted line.
BATCH_MAX_BYTES = 256 << 10

_OPTIONS = orjson.OPT_APPEND_NEWLINE
_dumps = orjson.dumps


def delivery_row(effect: Deliver) -> list[Any]:
    """One delivery as a row of a ``deliveries`` event (docs/protocol.md, "Batched
    deliveries"): ``[consumer_tag, delivery_tag, redelivered, delivery_count,
    exchange, routing_key, properties, body]``, the body as text when it is UTF-8,
    else ``{"b64": ...}``; the properties as in a ``deliver`` event."""
    message = effect.message
    body = message.body
    text: Any
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = {"b64": base64.b64encode(body).decode("ascii")}
    properties: dict[str, Any] = message.properties or {}
    count = effect.delivery_count
    if count:
        properties = dict(properties)
        properties["headers"] = {**(properties.get("headers") or {}), "x-delivery-count": count}
    return [
        effect.consumer_tag, effect.delivery_tag, effect.redelivered, count,
        message.exchange, message.routing_key, properties, text,
    ]


def encode_outbox(batch: list[Any], batched: bool) -> tuple[bytes, int]:
    """The events of ``batch`` (core effects addressed to the channel, or event
    dicts) as one chunk's bytes, in order, and the delivery credit its deliveries
    use. ``batched``: the client takes ``deliveries`` events, so each run of
    consecutive deliveries is one event (split past ``BATCH_MAX_BYTES``); a delivery
    under a lease is always its own ``deliver`` event."""
    parts: list[bytes] = []
    rows: list[Any] = []
    credit = 0
    run_bytes = 0
    for item in batch:
        if type(item) is dict:
            if rows:
                parts.append(_dumps({"ev": "deliveries", "d": rows}, option=_OPTIONS))
                rows, run_bytes = [], 0
            parts.append(_dumps(item, option=_OPTIONS))
            continue
        if type(item) is Deliver:
            cost = delivery_cost(item.message.body)
            credit += cost
            if batched and item.lease_id is None:
                run_bytes += cost
                rows.append(delivery_row(item))
                if run_bytes >= BATCH_MAX_BYTES:
                    parts.append(_dumps({"ev": "deliveries", "d": rows}, option=_OPTIONS))
                    rows, run_bytes = [], 0
                continue
        if rows:
            parts.append(_dumps({"ev": "deliveries", "d": rows}, option=_OPTIONS))
            rows, run_bytes = [], 0
        parts.append(_dumps(event_json(item), option=_OPTIONS))
    if rows:
        parts.append(_dumps({"ev": "deliveries", "d": rows}, option=_OPTIONS))
    return b"".join(parts), credit
