"""The one-shot REST calls of the HTTP API (docs/http-api.md).

Each handler validates its input completely before it touches the core, so a bad
request changes nothing; core errors (:class:`~broker.core.BrokerError`) propagate to
the server, which turns them into JSON error responses. Unknown JSON fields and unknown
query parameters are errors too: a typo (``?routing-key=``) must not silently mean
something else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import trio

from broker.core import (
    EXCHANGE_TYPES,
    AccessRefused,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    check_routing_key,
)
from broker.api.codec import message_json, properties_from_headers
from broker.http.errors import ClientDisconnected
from broker.http.router import Handler, Router
from broker.runtime import BrokerRuntime

__all__ = ["add_rest_routes", "exchange_name", "Fields"]

DEFAULT_EXCHANGE_ALIAS = "amq.default"


def exchange_name(name: str) -> str:
    """``amq.default`` names the default exchange ("") in paths and bodies."""
    return "" if name == DEFAULT_EXCHANGE_ALIAS else name


# Fields has methods named str, bool, dict and list, which hide the builtins inside its
# body: its annotations use these aliases.
_Text = str
_Bool = bool
_Dict = dict
_List = list


class Fields:
    """Typed access to a JSON request object; unknown fields are an error (catches typos)."""

    def __init__(self, obj: Any, allowed: set[_Text], what: _Text = "request body") -> None:
        if not isinstance(obj, dict):
            raise InvalidArgument(f"{what} must be a JSON object")
        unknown = set(obj) - allowed
        if unknown:
            raise InvalidArgument(f"unknown field(s) in {what}: {', '.join(sorted(unknown))}")
        self.obj = obj

    def str(self, name: _Text, default: _Text | None = None) -> _Text:
        value = self.obj.get(name, default)
        if value is None:
            raise InvalidArgument(f"field {name} is required")
        if not isinstance(value, str):
            raise InvalidArgument(f"field {name} must be a string")
        return value

    def opt_str(self, name: _Text) -> _Text | None:
        value = self.obj.get(name)
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"field {name} must be a string")
        return value

    def bool(self, name: _Text, default: _Bool) -> _Bool:
        value = self.obj.get(name, default)
        if not isinstance(value, bool):
            raise InvalidArgument(f"field {name} must be true or false")
        return value

    def dict(self, name: _Text) -> _Dict[_Text, Any]:
        value = self.obj.get(name, {})
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise InvalidArgument(f"field {name} must be an object")
        return value

    def number(self, name: _Text, default: float | None, *, minimum: float = 0) -> float | None:
        value = self.obj.get(name)
        if value is None:  # absent or null: the default
            value = default
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
            raise InvalidArgument(f"field {name} must be a number >= {minimum:g}")
        return float(value)

    def list(self, name: _Text) -> _List[Any]:
        value = self.obj.get(name)
        if not isinstance(value, list) or not value:
            raise InvalidArgument(f"field {name} must be a non-empty list")
        return value


def _check_query(request: Any, allowed: frozenset[str] = frozenset()) -> None:
    """Refuse query parameters the endpoint does not know (400)."""
    unknown = set(request.query) - allowed
    if unknown:
        known = f"; known: {', '.join(sorted(allowed))}" if allowed else ""
        raise InvalidArgument(
            f"unknown query parameter(s): {', '.join(sorted(unknown))}{known}"
        )


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

    def route(
        method: str, pattern: str, *, query: frozenset[str] = frozenset()
    ) -> Callable[[Handler], Handler]:
        """``router.route`` that first refuses query parameters outside ``query``."""

        def register(handler: Handler) -> Handler:
            async def checked(request: Any, response: Any) -> None:
                _check_query(request, query)
                await handler(request, response)

            router.add(method, pattern, checked)
            return handler

        return register

    def check_queue(name: str) -> None:
        if name not in core.queues:
            raise NotFound(f"no queue {name!r}")

    @route("GET", "/healthz")
    async def healthz(request: Any, response: Any) -> None:
        if not runtime.ready:
            await response.send_json(503, {"status": "recovering", "ready": False})
        elif runtime.shutting_down:
            await response.send_json(503, {"status": "shutting_down", "ready": False})
        else:
            await response.send_json(
                200, {"status": "ok", "ready": True, "storage_ok": core.storage_ok}
            )

    @route("GET", "/overview")
    async def overview(request: Any, response: Any) -> None:
        await response.send_json(200, runtime.overview())

    # ------------------------------------------------------------- exchanges

    @route("PUT", "/exchanges/{name}")
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

    @route("DELETE", "/exchanges/{name}", query=frozenset({"if_unused"}))
    async def delete_exchange(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = exchange_name(request.path_params["name"])
        core.delete_exchange(name, if_unused=request.query.get_bool("if_unused", False))
        await runtime.wait_durable()
        await response.send_json(200, {"deleted": name or DEFAULT_EXCHANGE_ALIAS})

    @route("GET", "/exchanges")
    async def list_exchanges(request: Any, response: Any) -> None:
        await response.send_json(
            200, {"exchanges": [_exchange_info(x) for x in core.exchanges.values()]}
        )

    @route("GET", "/exchanges/{name}")
    async def get_exchange(request: Any, response: Any) -> None:
        name = exchange_name(request.path_params["name"])
        exchange = core.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange {name!r}")
        info = _exchange_info(exchange)
        info["bindings"] = [b for b in core.list_bindings() if b["exchange"] == name]
        await response.send_json(200, info)

    @route("POST", "/exchanges/{name}/publish", query=frozenset({"routing_key", "mandatory"}))
    async def publish(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = exchange_name(request.path_params["name"])
        routing_key = check_routing_key(request.query.get_str("routing_key", ""))
        mandatory = request.query.get_bool("mandatory", False)
        properties = properties_from_headers(_utf8_headers(request.headers.items()))
        body = await request.read_body()
        if len(body) > opts.max_body_bytes:  # pragma: no cover - the server enforces it first
            raise PayloadTooLarge(f"message body over {opts.max_body_bytes} bytes")
        exchange = core.exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no exchange {name!r}")
        if exchange.internal:
            # The core would nack it, but no retry can succeed: a client error, not 503.
            raise AccessRefused(f"exchange {name!r} is internal: publish to it is refused")
        ack, reason, routed, returned = await runtime.publish_and_confirm(
            name, routing_key, body, properties, mandatory
        )
        if not ack:
            await response.send_json(
                503,
                {
                    "error": "nack",
                    "message": f"message not taken: {reason}",
                    "confirm": "nack",
                    "reason": reason or "",
                },
            )
            return
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

    @route("PUT", "/queues/{name}")
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

    @route("DELETE", "/queues/{name}", query=frozenset({"if_unused", "if_empty"}))
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

    @route("GET", "/queues")
    async def list_queues(request: Any, response: Any) -> None:
        await response.send_json(
            200, {"queues": [core.queue_info(q) for q in core.queues.values()]}
        )

    @route("GET", "/queues/{name}")
    async def get_queue(request: Any, response: Any) -> None:
        name = request.path_params["name"]
        queue = core.queues.get(name)
        if queue is None:
            raise NotFound(f"no queue {name!r}")
        await response.send_json(200, core.queue_info(queue))

    @route("POST", "/queues/{name}/purge")
    async def purge(request: Any, response: Any) -> None:
        runtime.check_ready()
        count = core.purge_queue(request.path_params["name"])
        runtime.pump()
        await response.send_json(200, {"purged": count})

    @route("POST", "/queues/{name}/get", query=frozenset({"max", "wait", "lease"}))
    async def get_messages(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = request.path_params["name"]
        max_count = request.query.get_int("max", 1, min_value=1, max_value=1000)
        # A longer wait is capped, not refused (docs/operations.md, max_wait_s): the
        # answer is the same as for a wait that found nothing.
        wait_s = min(request.query.get_float("wait", 0.0, min_value=0.0), opts.max_wait_s)
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
            # Park until a message arrives or the wait is over: no polling. Meanwhile
            # watch the connection: a client that left must not be handed leases
            # (its messages would stay invisible until the leases expired).
            event = runtime.queue_event(name)
            core.park_getter(name)
            try:
                if not await _wait_or_disconnect(request, event, deadline):
                    raise ClientDisconnected("the client left during a long-poll get")
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

    @route("POST", "/queues/{name}/ack")
    async def ack_leases(request: Any, response: Any) -> None:
        runtime.check_ready()
        f = await _body_fields(request, {"lease_ids"})
        lease_ids = f.list("lease_ids")
        check_queue(request.path_params["name"])
        count = core.ack_leases(lease_ids, queue=request.path_params["name"])
        runtime.pump()
        await response.send_json(200, {"acked": count})

    @route("POST", "/queues/{name}/nack")
    async def nack_leases(request: Any, response: Any) -> None:
        runtime.check_ready()
        f = await _body_fields(request, {"lease_ids", "requeue"})
        lease_ids, requeue = f.list("lease_ids"), f.bool("requeue", True)
        check_queue(request.path_params["name"])
        count = core.nack_leases(lease_ids, requeue=requeue, queue=request.path_params["name"])
        runtime.pump()
        await response.send_json(200, {"nacked": count})

    @route("POST", "/queues/{name}/extend")
    async def extend_leases(request: Any, response: Any) -> None:
        runtime.check_ready()
        f = await _body_fields(request, {"lease_ids", "lease"})
        lease_ids = f.list("lease_ids")
        lease_s = f.number("lease", opts.default_lease_s, minimum=0.001)
        assert lease_s is not None
        check_queue(request.path_params["name"])
        count = core.extend_leases(lease_ids, lease_s, queue=request.path_params["name"])
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

    @route("POST", "/bindings")
    async def bind(request: Any, response: Any) -> None:
        runtime.check_ready()
        source, dest, key, args, to_x = await binding_args(request)
        created = core.bind(source, dest, key, args, to_exchange=to_x)
        await runtime.wait_durable()
        await response.send_json(201 if created else 200, {"bound": True, "created": created})

    @route("DELETE", "/bindings")
    async def unbind(request: Any, response: Any) -> None:
        runtime.check_ready()
        source, dest, key, args, to_x = await binding_args(request)
        core.unbind(source, dest, key, args, to_exchange=to_x)
        await runtime.wait_durable()
        await response.send_json(200, {"unbound": True})

    @route("GET", "/bindings")
    async def list_bindings(request: Any, response: Any) -> None:
        await response.send_json(200, {"bindings": core.list_bindings()})


def _utf8_headers(items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Header values as UTF-8 text. HTTP hands over bytes (decoded as Latin-1 by the
    server, RFC 9110 section 5.5 "obs-text"); curl and every client library send
    ``-H 'X-Header-City: Zürich'`` as UTF-8, and property values are UTF-8 strings.
    Only the headers that can carry properties (``Content-*``, ``X-*``) are checked."""
    out = []
    for name, value in items:
        if not value.isascii() and name.startswith(("x-", "content-")):
            try:
                value = value.encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidArgument(f"header {name} is not valid UTF-8") from None
        out.append((name, value))
    return out


async def _wait_or_disconnect(request: Any, event: trio.Event, deadline: float) -> bool:
    """Wait for ``event`` until ``deadline``; return False if the client closed the
    connection first (True when the event fired or the time passed)."""
    gone = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal gone
            await request.wait_disconnected()
            gone = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        with trio.move_on_at(deadline):
            await event.wait()
        nursery.cancel_scope.cancel()
    return not gone


def _exchange_info(exchange: Any) -> dict[str, Any]:
    info: dict[str, Any] = exchange.info()
    if info["name"] == "":
        info["name"] = DEFAULT_EXCHANGE_ALIAS
    return info
