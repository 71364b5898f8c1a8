"""The one-shot REST calls of the HTTP API (docs/http-api.md).

Each handler validates its input completely before it touches the core, so a bad
request changes nothing; core errors (:class:`~broker.core.BrokerError`) propagate to
the server, which turns them into JSON error responses.
"""

from __future__ import annotations

from typing import Any

import trio

from broker.core import (
    EXCHANGE_TYPES,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    Unavailable,
)
from broker.http.codec import message_json, properties_from_headers
from broker.http.router import Router
from broker.http.runtime import BrokerRuntime

__all__ = ["add_rest_routes", "exchange_name", "Fields"]

DEFAULT_EXCHANGE_ALIAS = "amq.default"


def exchange_name(name: str) -> str:
    """``amq.default`` names the default exchange ("") in paths and bodies."""
    return "" if name == DEFAULT_EXCHANGE_ALIAS else name


class Fields:
    """Typed access to a JSON request object; unknown fields are an error (catches typos)."""

    def __init__(self, obj: Any, allowed: set[str], what: str = "request body") -> None:
        if not isinstance(obj, dict):
            raise InvalidArgument(f"{what} must be a JSON object")
        unknown = set(obj) - allowed
        if unknown:
            raise InvalidArgument(f"unknown field(s) in {what}: {', '.join(sorted(unknown))}")
        self.obj = obj

    def str(self, name: str, default: str | None = None) -> str:
        value = self.obj.get(name, default)
        if value is None:
            raise InvalidArgument(f"field {name} is required")
        if not isinstance(value, str):
            raise InvalidArgument(f"field {name} must be a string")
        return value

    def opt_str(self, name: str) -> str | None:
        value = self.obj.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"field {name} must be a string")
        return value

    def bool(self, name: str, default: bool) -> bool:
        value = self.obj.get(name, default)
        if not isinstance(value, bool):
            raise InvalidArgument(f"field {name} must be true or false")
        return value

    def dict(self, name: str) -> dict[str, Any]:
        value = self.obj.get(name, {})
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise InvalidArgument(f"field {name} must be an object")
        return value

    def number(self, name: str, default: float | None, *, minimum: float = 0) -> float | None:
        value = self.obj.get(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
            raise InvalidArgument(f"field {name} must be a number >= {minimum:g}")
        return float(value)

    def list(self, name: str) -> list[Any]:
        value = self.obj.get(name)
        if not isinstance(value, list) or not value:
            raise InvalidArgument(f"field {name} must be a non-empty list")
        return value


async def _body_fields(request: Any, allowed: set[str]) -> Fields:
    body = await request.read_body()
    if not body.strip():
        return Fields({}, allowed)
    import orjson

    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"invalid JSON: {exc}", code="invalid_json") from None
    return Fields(obj, allowed)


def add_rest_routes(router: Router, runtime: BrokerRuntime) -> None:
    """Register every REST endpoint on ``router``."""
    core = runtime.core
    opts = runtime.options

    @router.route("GET", "/healthz")
    async def healthz(request: Any, response: Any) -> None:
        if not runtime.ready:
            await response.send_json(503, {"status": "recovering", "ready": False})
        elif runtime.shutting_down:
            await response.send_json(503, {"status": "shutting_down", "ready": False})
        else:
            await response.send_json(
                200, {"status": "ok", "ready": True, "storage_ok": core.storage_ok}
            )

    @router.route("GET", "/overview")
    async def overview(request: Any, response: Any) -> None:
        await response.send_json(200, runtime.overview())

    # ------------------------------------------------------------- exchanges

    @router.route("PUT", "/exchanges/{name}")
    async def put_exchange(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = exchange_name(request.path_params["name"])
        f = await _body_fields(request, {"type", "durable", "auto_delete", "internal", "arguments", "passive"})
        etype = f.str("type", "direct")
        if etype not in EXCHANGE_TYPES:
            raise InvalidArgument(f"type must be one of {', '.join(EXCHANGE_TYPES)}")
        exchange, created = core.declare_exchange(
            name,
            etype,
            durable=f.bool("durable", True),
            auto_delete=f.bool("auto_delete", False),
            internal=f.bool("internal", False),
            arguments=f.dict("arguments"),
            passive=f.bool("passive", False),
        )
        if created and exchange.durable:
            await runtime.wait_durable()
        await response.send_json(201 if created else 200, _exchange_info(exchange))

    @router.route("DELETE", "/exchanges/{name}")
    async def delete_exchange(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = exchange_name(request.path_params["name"])
        core.delete_exchange(name, if_unused=request.query.get_bool("if_unused", False))
        await runtime.wait_durable()
        await response.send_json(200, {"deleted": name or DEFAULT_EXCHANGE_ALIAS})

    @router.route("GET", "/exchanges")
    async def list_exchanges(request: Any, response: Any) -> None:
        await response.send_json(
            200, {"exchanges": [_exchange_info(x) for x in core.exchanges.values()]}
        )

    @router.route("GET", "/exchanges/{name}")
    async def get_exchange(request: Any, response: Any) -> None:
        name = exchange_name(request.path_params["name"])
        exchange = core.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange {name!r}")
        info = _exchange_info(exchange)
        info["bindings"] = [b for b in core.list_bindings() if b["exchange"] == name]
        await response.send_json(200, info)

    @router.route("POST", "/exchanges/{name}/publish")
    async def publish(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = exchange_name(request.path_params["name"])
        routing_key = request.query.get_str("routing_key", "")
        mandatory = request.query.get_bool("mandatory", False)
        properties = properties_from_headers(list(request.headers.items()))
        body = await request.read_body()
        if len(body) > opts.max_body_bytes:  # pragma: no cover - the server enforces it first
            raise PayloadTooLarge(f"message body over {opts.max_body_bytes} bytes")
        if name not in core.exchanges:
            raise NotFound(f"no exchange {name!r}")
        ack, reason, routed, returned = await runtime.publish_and_confirm(
            name, routing_key, body, properties, mandatory
        )
        if not ack:
            raise Unavailable(f"message not taken: {reason}", code="nack")
        if returned:
            await response.send_json(
                404,
                {
                    "error": "no_route",
                    "message": f"mandatory message is unroutable: no queue is bound to "
                    f"exchange {name or DEFAULT_EXCHANGE_ALIAS!r} for routing key {routing_key!r}",
                    "confirm": "ack",
                    "routed": 0,
                },
            )
            return
        await response.send_json(200, {"confirm": "ack", "routed": routed})

    # ---------------------------------------------------------------- queues

    @router.route("PUT", "/queues/{name}")
    async def put_queue(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = request.path_params["name"]
        f = await _body_fields(request, {"durable", "exclusive", "auto_delete", "arguments", "passive"})
        queue, created = core.declare_queue(
            name,
            durable=f.bool("durable", True),
            exclusive=f.bool("exclusive", False),
            auto_delete=f.bool("auto_delete", False),
            arguments=f.dict("arguments"),
            passive=f.bool("passive", False),
        )
        if created and queue.durable:
            await runtime.wait_durable()
        await response.send_json(201 if created else 200, core.queue_info(queue))

    @router.route("DELETE", "/queues/{name}")
    async def delete_queue(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = request.path_params["name"]
        count = core.delete_queue(
            name,
            if_unused=request.query.get_bool("if_unused", False),
            if_empty=request.query.get_bool("if_empty", False),
        )
        runtime.pump()
        await runtime.wait_durable()
        await response.send_json(200, {"deleted": name, "messages": count})

    @router.route("GET", "/queues")
    async def list_queues(request: Any, response: Any) -> None:
        await response.send_json(
            200, {"queues": [core.queue_info(q) for q in core.queues.values()]}
        )

    @router.route("GET", "/queues/{name}")
    async def get_queue(request: Any, response: Any) -> None:
        name = request.path_params["name"]
        queue = core.queues.get(name)
        if queue is None:
            raise NotFound(f"no queue {name!r}")
        await response.send_json(200, core.queue_info(queue))

    @router.route("POST", "/queues/{name}/purge")
    async def purge(request: Any, response: Any) -> None:
        runtime.check_ready()
        count = core.purge_queue(request.path_params["name"])
        runtime.pump()
        await response.send_json(200, {"purged": count})

    @router.route("POST", "/queues/{name}/get")
    async def get_messages(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = request.path_params["name"]
        max_count = request.query.get_int("max", 1, min_value=1, max_value=1000)
        wait_s = request.query.get_float("wait", 0.0, min_value=0.0, max_value=opts.max_wait_s)
        lease_s = request.query.get_float(
            "lease", opts.default_lease_s, min_value=0.001, max_value=opts.max_lease_s
        )
        await request.read_body()
        deadline = trio.current_time() + wait_s
        while True:
            leases = core.get(name, max_count, lease_s)
            runtime.pump()
            if leases or trio.current_time() >= deadline:
                break
            # Park until a message arrives or the wait is over: no polling.
            event = runtime.queue_event(name)
            core.park_getter(name)
            try:
                with trio.move_on_at(deadline):
                    await event.wait()
            finally:
                core.unpark_getter(name)
            if runtime.shutting_down:
                break
        messages = []
        for lease_id, d, redelivered in leases:
            m = message_json(d.entry.message)
            m.update(
                lease_id=lease_id,
                exchange=d.entry.message.exchange,
                routing_key=d.entry.message.routing_key,
                redelivered=redelivered,
            )
            messages.append(m)
        await response.send_json(200, {"messages": messages})

    @router.route("POST", "/queues/{name}/ack")
    async def ack_leases(request: Any, response: Any) -> None:
        runtime.check_ready()
        f = await _body_fields(request, {"lease_ids"})
        count = core.ack_leases(f.list("lease_ids"))
        runtime.pump()
        await response.send_json(200, {"acked": count})

    @router.route("POST", "/queues/{name}/nack")
    async def nack_leases(request: Any, response: Any) -> None:
        runtime.check_ready()
        f = await _body_fields(request, {"lease_ids", "requeue"})
        count = core.nack_leases(f.list("lease_ids"), requeue=f.bool("requeue", True))
        runtime.pump()
        await response.send_json(200, {"nacked": count})

    @router.route("POST", "/queues/{name}/extend")
    async def extend_leases(request: Any, response: Any) -> None:
        runtime.check_ready()
        f = await _body_fields(request, {"lease_ids", "lease"})
        lease_s = f.number("lease", opts.default_lease_s, minimum=0.001)
        assert lease_s is not None
        count = core.extend_leases(f.list("lease_ids"), lease_s)
        runtime.pump()
        await response.send_json(200, {"extended": count, "lease": lease_s})

    # -------------------------------------------------------------- bindings

    async def binding_args(request: Any) -> tuple[str, str, str, dict[str, Any], bool]:
        f = await _body_fields(request, {"exchange", "queue", "to_exchange", "routing_key", "arguments"})
        source = exchange_name(f.str("exchange"))
        queue = f.opt_str("queue")
        to_exchange = f.opt_str("to_exchange")
        if (queue is None) == (to_exchange is None):
            raise InvalidArgument("give exactly one of queue and to_exchange")
        dest = queue if queue is not None else exchange_name(to_exchange or "")
        return source, dest, f.str("routing_key", ""), f.dict("arguments"), to_exchange is not None

    @router.route("POST", "/bindings")
    async def bind(request: Any, response: Any) -> None:
        runtime.check_ready()
        source, dest, key, args, to_x = await binding_args(request)
        created = core.bind(source, dest, key, args, to_exchange=to_x)
        await runtime.wait_durable()
        await response.send_json(201 if created else 200, {"bound": True, "created": created})

    @router.route("DELETE", "/bindings")
    async def unbind(request: Any, response: Any) -> None:
        runtime.check_ready()
        source, dest, key, args, to_x = await binding_args(request)
        core.unbind(source, dest, key, args, to_exchange=to_x)
        await runtime.wait_durable()
        await response.send_json(200, {"unbound": True})

    @router.route("GET", "/bindings")
    async def list_bindings(request: Any, response: Any) -> None:
        await response.send_json(200, {"bindings": core.list_bindings()})


def _exchange_info(exchange: Any) -> dict[str, Any]:
    info: dict[str, Any] = exchange.info()
    if info["name"] == "":
        info["name"] = DEFAULT_EXCHANGE_ALIAS
    return info
