"""What every REST resource shares: the request body as typed fields
(:class:`~broker.api.fields.Fields`, shared with the channel's ops), refusal of
unknown query parameters, and route registration (:class:`RestContext`: what a
handler needs).

Unknown JSON fields and unknown query parameters are errors: a typo (``?routing-key=``)
must not silently mean something else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Set
from typing import Any

import orjson

from broker.api.fields import DEFAULT_EXCHANGE_ALIAS, Fields, exchange_name
from broker.core import BrokerViews, InvalidArgument
from broker.http import Request, Response, Router
from broker.runtime import BrokerRuntime, CommandGateway, RuntimeOptions

__all__ = ["DEFAULT_EXCHANGE_ALIAS", "Fields", "RestContext", "RestHandler", "body_fields", "exchange_name"]

def check_query(request: Request, allowed: frozenset[str] = frozenset()) -> None:
    """Refuse query parameters the endpoint does not know (400)."""
    unknown = set(request.query) - allowed
    if unknown:
        known = f"; known: {', '.join(sorted(allowed))}" if allowed else ""
        raise InvalidArgument(
            f"unknown query parameter(s): {', '.join(sorted(unknown))}{known}"
        )


async def body_fields(request: Request, allowed: Set[str]) -> Fields:
    """The request body as :class:`Fields` (an empty body: no fields)."""
    body = await request.read_body()
    if not body.strip():
        return Fields({}, allowed)
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"invalid JSON: {exc}", code="invalid_json") from None
    return Fields(obj, allowed)


#: A REST handler: a module-level function of what it needs and the exchange.
RestHandler = Callable[["RestContext", Request, Response], Awaitable[None]]


class RestContext:
    """What a REST handler needs: the command gateway (every core command goes through
    it), the core's read-only views, the runtime's options, the authenticator (for the
    users family's hashing threads); and :meth:`add`, which registers a handler,
    refusing query parameters the route does not know."""

    def __init__(
        self, router: Router, runtime: BrokerRuntime, auth: Any = None, gateway: CommandGateway | None = None
    ) -> None:
        self.router = router
        self.gateway = gateway if gateway is not None else CommandGateway(runtime)
        self.views: BrokerViews = self.gateway.views
        self.options: RuntimeOptions = runtime.options
        #: The authenticator (``broker.api.auth.Authenticator``), for the users family.
        self.auth = auth

    def add(
        self,
        method: str,
        pattern: str,
        handler: RestHandler,
        *,
        query: frozenset[str] = frozenset(),
        public: bool = False,
    ) -> None:
        """Serve ``METHOD pattern`` with ``handler(self, request, response)``, after
        refusing query parameters outside ``query``. A ``public`` route is served
        without credentials (docs/security.md lists them)."""

        async def checked(request: Request, response: Response) -> None:
            check_query(request, query)
            await handler(self, request, response)

        self.router.add(method, pattern, checked, public=public)
