"""Cross-site request forgery: refuse a state-changing request that a browser sent on
behalf of another site.

A page on another site can make the browser send a ``POST`` (a form, or ``fetch`` with
``mode: "no-cors"``) to the broker at ``127.0.0.1:8080``: with no users configured the
broker serves loopback without credentials, and with HTTP Basic a browser may attach
credentials it has cached. The browser says where such a request comes from, in headers
a page cannot forge: ``Sec-Fetch-Site`` (Fetch Metadata, sent by current browsers) and
``Origin`` (RFC 6454 section 7; sent with every ``POST``, ``PUT`` and ``DELETE`` a page
makes). The rules, applied to every method but ``GET``, ``HEAD`` and ``OPTIONS``
(RFC 9110 section 9.2.1: those are safe, and no route here changes state on them):

1. ``Sec-Fetch-Site: same-origin`` or ``none`` (the user's own action): served. The
   browser's word wins over ``Origin``, so a reverse proxy that rewrites ``Host``
   does not break the management UI.
2. ``Sec-Fetch-Site: cross-site`` or ``same-site`` (another port or subdomain is another
   application): refused.
3. Otherwise an ``Origin`` header must name this server: its ``host[:port]`` equal to
   the request's ``Host`` (default ports aside); ``Origin: null`` (a sandboxed frame, a
   ``file:`` page) is refused.
4. No ``Origin`` and no ``Sec-Fetch-Site``: not a browser page (curl, the client
   library, programs), served.

A refusal is ``403 cross_site_request`` with the reason, before the route runs, so
nothing is changed (and no request body is read). This is the one place the check
lives: the API's whole router is wrapped by :func:`protect`. It is the check OWASP
recommends ("verifying origin with standard headers", "Fetch Metadata"), and needs no
token in the page.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlsplit

from broker.http import Handler, HTTPError, Request, Response

__all__ = ["CrossSiteRequest", "SAFE_METHODS", "cross_site_reason", "protect"]

SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS: Final = {"http": "80", "https": "443"}


class CrossSiteRequest(HTTPError):
    """A state-changing request a browser sent from another site (403)."""

    code = "cross_site_request"
    status = 403


def _strip_default_port(netloc: str, scheme: str) -> str:
    default = _DEFAULT_PORTS.get(scheme)
    if default is not None and netloc.endswith(":" + default):
        return netloc[: -len(default) - 1]
    return netloc


def cross_site_reason(method: str, headers: Any) -> str | None:
    """Why a request with ``method`` and ``headers`` (a ``Headers``) must be refused
    as cross-site, or None when it may be served (see the module's rules)."""
    if method in SAFE_METHODS:
        return None
    site = (headers.get("sec-fetch-site") or "").strip().lower()
    if site in ("same-origin", "none"):
        return None
    if site in ("cross-site", "same-site"):
        return f"the browser sent this request from another site (Sec-Fetch-Site: {site})"
    origin = headers.get("origin")
    if origin is None:
        return None
    origin = origin.strip()
    if origin == "null":
        return "the request comes from an opaque origin (Origin: null)"
    try:
        parts = urlsplit(origin)
    except ValueError:
        return f"the Origin header is not an origin: {origin[:100]!r}"
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        return f"the Origin header is not an http(s) origin: {origin[:100]!r}"
    host = (headers.get("host") or "").strip().lower()
    theirs = _strip_default_port(parts.netloc.lower(), parts.scheme)
    if not host or _strip_default_port(host, parts.scheme) != theirs:
        return f"Origin {origin[:100]!r} is not this server ({host[:100] or 'no Host header'})"
    return None


def protect(app: Handler) -> Handler:
    """``app`` behind the cross-site check: a refused request raises
    :class:`CrossSiteRequest` before ``app`` sees it."""

    async def checked(request: Request, response: Response) -> None:
        if request.method not in SAFE_METHODS:
            reason = cross_site_reason(request.method, request.headers)
            if reason is not None:
                raise CrossSiteRequest(f"cross-site request refused: {reason}")
        await app(request, response)

    return checked
