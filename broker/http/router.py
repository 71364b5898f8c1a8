"""Map ``METHOD /path/{param}`` patterns to handlers.

Rules:

* A pattern is a sequence of ``/``-separated segments; a segment is either literal text
  or a whole-segment placeholder ``{name}``. Placeholders match any *non-empty* segment.
* The request path is split on ``/`` **before** percent-decoding, so an encoded slash
  (``%2F``) stays inside its segment: ``/queues/a%2Fb`` has the parameter
  ``name="a/b"`` (RFC 3986 section 2.2: a percent-encoded reserved character is data,
  not a delimiter). Segments decode as UTF-8; invalid UTF-8 is a ``400``, and so is a
  ``%`` not followed by two hex digits (RFC 3986 section 2.1: ``pct-encoded =
  "%" HEXDIG HEXDIG``), which would otherwise be taken literally.
* Literal segments win over placeholders (``/queues/stats`` before
  ``/queues/{name}``), with backtracking, so registration order never matters.
* No route for the path → ``404 not_found``. Routes for the path but not for the
  method → ``405 method_not_allowed`` with an ``Allow`` header (RFC 9110 section
  15.5.6). ``HEAD`` is served by a ``GET`` route's handler (RFC 9110 section 9.3.2;
  the response layer drops the body) unless that route was added with ``head=False``:
  a ``GET`` whose handler has effects (a streaming consume hands out messages) must
  not run for a ``HEAD`` that will never see them, so ``HEAD`` there is a ``405``.
* A router may have a ``guard``: an async function of the request, run after the route
  is found and before its handler, for every route not added with ``public=True``. It
  refuses by raising (an ``HTTPError`` such as a 401), and may return a function the
  router calls once the handler has ended. The router knows nothing of what
  it checks; :meth:`Router.routes` lists every route with its flag, so a test can walk
  the whole table.

The routes live in a trie keyed by segment, so matching costs one dict lookup per
segment whatever the number of routes.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Final, TypeVar
from urllib.parse import unquote

from broker.http.connection import Handler, Request, Response
from broker.http.errors import InvalidRequest, MethodNotAllowed, NoSuchEndpoint

__all__ = ["Guard", "Handler", "RouteInfo", "RouteMatch", "Router"]

_H = TypeVar("_H", bound=Handler)
#: Runs before the handler of every non-public route; refuses by raising. It may
#: return a function to call when the handler ends (to release what it counted).
Guard = Callable[[Request], Awaitable[Callable[[], None] | None]]

_PARAM_RE: Final = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_METHOD_RE: Final = re.compile(r"[A-Z]+")
#: A ``%`` that does not start a ``%XX`` escape.
_BAD_ESCAPE_RE: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")


class _Node:
    """One trie node: children by literal segment, one placeholder child, and the
    handlers of the routes that end here (by method, with their parameter names)."""

    __slots__ = ("implicit_head", "literals", "param", "routes")

    def __init__(self) -> None:
        self.literals: dict[str, _Node] = {}
        self.param: _Node | None = None
        #: method -> (handler, placeholder names, public, pattern)
        self.routes: dict[str, tuple[Handler, tuple[str, ...], bool, str]] = {}
        #: ``HEAD`` is here only as the twin of the ``GET`` route (an explicit ``HEAD``
        #: route replaces it).
        self.implicit_head = False


class RouteMatch:
    """The result of a successful lookup: the handler, the decoded parameters, and
    whether the route is public (its guard does not run)."""

    __slots__ = ("handler", "params", "public")

    def __init__(self, handler: Handler, params: dict[str, str], public: bool = False) -> None:
        self.handler = handler
        self.params = params
        self.public = public


class RouteInfo:
    """One registered route, as :meth:`Router.routes` lists it."""

    __slots__ = ("method", "pattern", "public")

    def __init__(self, method: str, pattern: str, public: bool) -> None:
        self.method = method
        self.pattern = pattern
        self.public = public

    def __repr__(self) -> str:
        return f"<Route {self.method} {self.pattern}{' (public)' if self.public else ''}>"


def split_path(path: str) -> list[str]:
    """Split a request path into percent-decoded segments.

    Raises: ``InvalidRequest`` if a segment's percent-decoding is not UTF-8, a ``%``
    does not start a ``%XX`` escape, or the path does not start with ``/``.
    """
    if not path.startswith("/"):
        raise InvalidRequest(f"request path must start with '/': {path[:64]!r}")
    segments = path[1:].split("/")
    for index, segment in enumerate(segments):
        if "%" in segment:
            if _BAD_ESCAPE_RE.search(segment) is not None:
                raise InvalidRequest(
                    f"path segment {segment[:64]!r} has a '%' that is not a %XX escape "
                    "(write a literal '%' as %25)"
                )
            try:
                segments[index] = unquote(segment, errors="strict")
            except UnicodeDecodeError:
                raise InvalidRequest(
                    f"path segment {segment[:64]!r} is not valid percent-encoded UTF-8"
                ) from None
    return segments


class Router:
    """A set of routes; itself a :data:`Handler`, so it can be served directly.

    Example::

        router = Router()

        @router.route("PUT", "/queues/{name}")
        async def declare_queue(request: Request, response: Response) -> None:
            name = request.path_params["name"]
            ...
    """

    def __init__(self, *, guard: Guard | None = None) -> None:
        self._root = _Node()
        self.guard = guard

    def add(self, method: str, pattern: str, handler: Handler, *, head: bool = True, public: bool = False) -> None:
        """Register ``handler`` for ``method`` on ``pattern``. A ``GET`` route serves
        ``HEAD`` too unless ``head=False`` (its handler has effects a ``HEAD`` must not
        cause). A ``public`` route is served without running the router's guard.

        Raises: ``ValueError`` for a malformed pattern or method, a repeated
        placeholder name, or a route already registered for this method and shape.
        """
        if not _METHOD_RE.fullmatch(method):
            raise ValueError(f"method must be upper-case letters: {method!r}")
        if not pattern.startswith("/"):
            raise ValueError(f"pattern must start with '/': {pattern!r}")
        node = self._root
        names: list[str] = []
        for segment in pattern[1:].split("/"):
            match = _PARAM_RE.fullmatch(segment)
            if match is not None:
                name = match.group(1)
                if name in names:
                    raise ValueError(f"placeholder {{{name}}} repeated in {pattern!r}")
                names.append(name)
                if node.param is None:
                    node.param = _Node()
                node = node.param
            else:
                if "{" in segment or "}" in segment or "%" in segment:
                    raise ValueError(
                        f"segment {segment!r} of {pattern!r}: a placeholder must be a "
                        "whole segment like {name}, and literals are given decoded"
                    )
                node = node.literals.setdefault(segment, _Node())
        if method in node.routes and not (method == "HEAD" and node.implicit_head):
            raise ValueError(f"route {method} {pattern} is already registered")
        node.routes[method] = (handler, tuple(names), public, pattern)
        if method == "HEAD":
            node.implicit_head = False
        elif method == "GET" and head and "HEAD" not in node.routes:
            node.routes["HEAD"] = (handler, tuple(names), public, pattern)
            node.implicit_head = True

    def route(self, method: str, pattern: str, *, head: bool = True, public: bool = False) -> Callable[[_H], _H]:
        """Decorator form of :meth:`add`."""

        def register(handler: _H) -> _H:
            self.add(method, pattern, handler, head=head, public=public)
            return handler

        return register

    def routes(self) -> Iterator[RouteInfo]:
        """Every registered route (``HEAD`` twins of ``GET`` routes included)."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            for method, (_handler, _names, public, pattern) in sorted(node.routes.items()):
                yield RouteInfo(method, pattern, public)
            stack.extend(node.literals.values())
            if node.param is not None:
                stack.append(node.param)

    def match(self, method: str, path: str) -> RouteMatch:
        """Find the handler for ``method`` and the (still percent-encoded) ``path``.

        Raises: ``NoSuchEndpoint`` (404) if no route has this path, ``MethodNotAllowed``
        (405) if routes have it but not for this method, ``InvalidRequest`` (400) for
        a path that does not decode.
        """
        segments = split_path(path)
        values: list[str] = []
        found = self._find(self._root, segments, 0, method, values)
        if found is None:
            raise NoSuchEndpoint(f"no such endpoint: {path[:200]}")
        routes = found.routes
        route = routes.get(method)
        if route is None:
            raise MethodNotAllowed(method, path[:200], sorted(routes))
        handler, names, public, _pattern = route
        return RouteMatch(handler, dict(zip(names, values, strict=True)), public)

    def _find(
        self, node: _Node, segments: list[str], index: int, method: str, values: list[str]
    ) -> _Node | None:
        """Depth-first search, literals first. Returns the first end node serving
        ``method``; failing that, the first end node with any
        route, so the caller can answer 405 rather than 404. ``values`` ends holding the
        placeholder values along the returned path."""
        if index == len(segments):
            return node if node.routes else None
        segment = segments[index]
        base = len(values)
        fallback: _Node | None = None
        fallback_values: list[str] | None = None
        child = node.literals.get(segment)
        if child is not None:
            found = self._find(child, segments, index + 1, method, values)
            if found is not None:
                if _serves(found, method):
                    return found
                fallback, fallback_values = found, list(values)
                del values[base:]
        if node.param is not None and segment:
            values.append(segment)
            found = self._find(node.param, segments, index + 1, method, values)
            if found is not None and (fallback is None or _serves(found, method)):
                return found
            del values[base:]
        if fallback is not None:
            assert fallback_values is not None
            values[:] = fallback_values
        return fallback

    async def __call__(self, request: Request, response: Response) -> None:
        """Dispatch ``request`` to its route's handler, with ``path_params`` set, after
        the guard unless the route is public.

        Raises: whatever :meth:`match` raises, whatever the guard raises, and whatever
        the handler raises.
        """
        found = self.match(request.method, request.path)
        request.path_params = found.params
        if self.guard is None or found.public:
            await found.handler(request, response)
            return
        release = await self.guard(request)
        try:
            await found.handler(request, response)
        finally:
            if release is not None:
                release()


def _serves(node: _Node, method: str) -> bool:
    return method in node.routes
