"""What every REST resource shares: typed JSON request fields, refusal of unknown
query parameters, and route registration.

Unknown JSON fields and unknown query parameters are errors: a typo (``?routing-key=``)
must not silently mean something else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from broker.core import InvalidArgument
from broker.http import Handler, Router
from broker.runtime import BrokerRuntime

__all__ = ["DEFAULT_EXCHANGE_ALIAS", "Fields", "RestContext", "body_fields", "exchange_name"]

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


def check_query(request: Any, allowed: frozenset[str] = frozenset()) -> None:
    """Refuse query parameters the endpoint does not know (400)."""
    unknown = set(request.query) - allowed
    if unknown:
        known = f"; known: {', '.join(sorted(allowed))}" if allowed else ""
        raise InvalidArgument(
            f"unknown query parameter(s): {', '.join(sorted(unknown))}{known}"
        )


async def body_fields(request: Any, allowed: set[str]) -> Fields:
    """The request body as :class:`Fields` (an empty body: no fields)."""
    body = await request.read_body()
    if not body.strip():
        return Fields({}, allowed)
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"invalid JSON: {exc}", code="invalid_json") from None
    return Fields(obj, allowed)


class RestContext:
    """What a resource family's routes are registered with: the router, the runtime,
    and :meth:`route`, which refuses query parameters a route does not know."""

    def __init__(self, router: Router, runtime: BrokerRuntime, auth: Any = None) -> None:
        self.router = router
        self.runtime = runtime
        #: The authenticator (``broker.api.auth.Authenticator``), for the users family.
        self.auth = auth
        self.core = runtime.core
        self.options = runtime.options

    def route(
        self, method: str, pattern: str, *, query: frozenset[str] = frozenset(), public: bool = False
    ) -> Callable[[Handler], Handler]:
        """``router.route`` that first refuses query parameters outside ``query``. A
        ``public`` route is served without credentials (docs/security.md lists them)."""

        def register(handler: Handler) -> Handler:
            async def checked(request: Any, response: Any) -> None:
                check_query(request, query)
                await handler(request, response)

            self.router.add(method, pattern, checked, public=public)
            return handler

        return register
