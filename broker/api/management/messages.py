"""The two calls RabbitMQ calls "for testing" that tools use anyway:
``POST /api/exchanges/%2F/{name}/publish`` and ``POST /api/queues/%2F/{name}/get``.

A publish goes through ``CommandGateway.publish_and_confirm``, as ackbus's own
``POST /exchanges/{name}/publish``: ``{"routed": true}`` once confirmed (persisted
when persistent). A get takes messages as leases (``core.get``, as ``POST
/queues/{name}/get``) and settles them at once as ``ackmode`` says:
``ack_requeue_false`` acks them, ``ack_requeue_true`` and ``reject_requeue_true``
return them to the queue (redelivered), ``reject_requeue_false`` rejects them
(dead-lettered where the queue says so). Each message carries RabbitMQ's
``message_count``: the messages left in the queue after it was taken.

Message properties are AMQP's, as ackbus stores them, with RabbitMQ's spelling of
``expiration`` (a string of milliseconds). A ``reply_to`` of ``amq.rabbitmq.reply-to``
itself is refused, as RabbitMQ refuses it: the call has no consumer of its replies.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

from broker.api.management.body import known_fields, require_keys
from broker.api.management.context import ManagementContext
from broker.api.management.errors import ObjectNotFound
from broker.api.management.reading import DEFAULT_EXCHANGE_PATH, exchange_path_name
from broker.api.permissions import access_for
from broker.api.userid import user_id_refusal
from broker.core import REPLY_TO, Broker, ErrorReply, InvalidArgument, check_properties
from broker.http import Request, Response

PUBLISH_KEYS: Final = frozenset({"properties", "routing_key", "payload", "payload_encoding"})
GET_KEYS: Final = frozenset({"count", "ackmode", "encoding", "truncate", "requeue"})
ACKMODES: Final = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
#: The most messages one get takes (ackbus's own get takes as many).
MAX_GET_COUNT: Final = 1000


def add_routes(ctx: ManagementContext) -> None:
    """Register this family's endpoints."""
    ctx.add("POST", "/exchanges/{vhost}/{name}/publish", publish)
    ctx.add("POST", "/queues/{vhost}/{name}/get", get)


def properties_in(value: Any) -> dict[str, Any] | None:
    """RabbitMQ's publish ``properties`` as ackbus's (checked by the core's rules):
    ``expiration`` arrives as a string of milliseconds."""
    if isinstance(value, list) and not value:
        return None  # RabbitMQ's own empty properties ([] in Erlang's JSON)
    if not isinstance(value, dict):
        raise InvalidArgument("properties must be an object")
    props = dict(value)
    expiration = props.get("expiration")
    if isinstance(expiration, str):
        if not expiration.isascii() or not expiration.isdigit():
            raise InvalidArgument("property expiration must be a string of milliseconds")
        props["expiration"] = int(expiration)
    return check_properties(props)


def properties_out(props: dict[str, Any] | None) -> Any:
    """ackbus's stored properties as RabbitMQ shows them (``[]`` when none)."""
    if not props:
        return []
    out = dict(props)
    if "expiration" in out:
        out["expiration"] = str(out["expiration"])
    return out


async def publish(ctx: ManagementContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = exchange_path_name(request.path_params["name"])
    f = await known_fields(request, PUBLISH_KEYS)
    require_keys(f, "routing_key", "properties", "payload", "payload_encoding")
    routing_key = f.str("routing_key")
    payload = f.str("payload")
    encoding = f.str("payload_encoding")
    if encoding == "string":
        body = payload.encode("utf-8", "surrogatepass")
    elif encoding == "base64":
        try:
            body = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument("payload is not valid base64") from None
    else:
        raise InvalidArgument(f"unsupported payload_encoding {encoding[:40]!r}: string or base64")
    properties = properties_in(f.obj["properties"])
    access = access_for(request)
    access.require("publish", name or DEFAULT_EXCHANGE_PATH)
    forged = user_id_refusal((properties or {}).get("user_id"), access.username)
    if forged is not None:
        raise InvalidArgument(f"406 PRECONDITION_FAILED - {forged}")
    if not ctx.views.exchange_exists(name):
        # RabbitMQ: 400, the channel's 404 in the reason
        raise InvalidArgument(f"404 NOT_FOUND - no exchange {name!r} in vhost '/'")
    if (properties or {}).get("reply_to") == REPLY_TO:
        # direct reply-to names the publisher's own consumer of it: a management
        # publish has none (RabbitMQ's answer; a reply to a decoded name passes)
        raise InvalidArgument("406 PRECONDITION_FAILED - fast reply consumer does not exist")
    outcome = await ctx.gateway.publish_and_confirm(name, routing_key, body, properties)
    refusal = outcome.refusal()
    if refusal is not None:
        raise refusal
    if not outcome.ack:
        await response.send_json(503, {"error": "nack", "reason": f"message not taken: {outcome.reason or ''}"})
        return
    await response.send_json(200, {"routed": outcome.routed > 0})


def _payload(body: bytes, encoding: str, truncate: int | None) -> tuple[str, str]:
    """(payload, payload_encoding) of a message's body."""
    shown = body if truncate is None else body[:truncate]
    if encoding == "auto":
        try:
            return shown.decode("utf-8"), "string"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(shown).decode("ascii"), "base64"


async def get(ctx: ManagementContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    f = await known_fields(request, GET_KEYS)
    require_keys(f, "count", "ackmode", "encoding")
    count = f.obj["count"]
    if isinstance(count, str) and count.isascii() and count.isdigit():
        count = int(count)  # rabbitmqadmin sends it as text
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_GET_COUNT:
        raise InvalidArgument(f"count must be an integer 1..{MAX_GET_COUNT}")
    ackmode = f.str("ackmode")
    if ackmode not in ACKMODES:
        raise InvalidArgument(f"ackmode must be one of {', '.join(ACKMODES)}")
    encoding = f.str("encoding")
    if encoding not in ("auto", "base64"):
        raise InvalidArgument("Unsupported encoding. Please use auto or base64.")
    truncate = f.obj.get("truncate")
    if isinstance(truncate, str) and truncate.isascii() and truncate.isdigit():
        truncate = int(truncate)
    if truncate is not None and (isinstance(truncate, bool) or not isinstance(truncate, int) or truncate < 0):
        raise InvalidArgument("truncate must be a whole number of bytes")
    access = access_for(request)
    access.require("get", name)
    access.require("settle", name)
    if not ctx.views.queue_exists(name):
        raise ObjectNotFound(f"no queue {name!r}")

    def take(core: Broker) -> list[dict[str, Any]]:
        # one command: the leases are taken and settled before anything else runs
        leases = core.get(name, count, None)
        ready = core.views.queue_counter("messages_ready", name) or 0
        out = []
        for index, (_lease_id, d, redelivered) in enumerate(leases):
            message = d.entry.message
            payload, payload_encoding = _payload(message.body, encoding, truncate)
            out.append({
                "payload_bytes": len(message.body),
                "redelivered": redelivered,
                "exchange": message.exchange,
                "routing_key": message.routing_key,
                "message_count": ready + len(leases) - index - 1,
                "properties": properties_out(message.properties),
                "payload": payload,
                "payload_encoding": payload_encoding,
            })
        ids = [lease_id for lease_id, _d, _r in leases]
        if ids:
            try:
                if ackmode == "ack_requeue_false":
                    core.ack_leases(ids, queue=name)
                else:
                    core.nack_leases(ids, requeue=ackmode != "reject_requeue_false", queue=name)
            except ErrorReply:
                # refused (the log cannot be written): the messages go back at once,
                # not when their leases lapse
                core.nack_leases(ids, requeue=True, queue=name)
                raise
        return out

    await response.send_json(200, ctx.gateway.run(take))
