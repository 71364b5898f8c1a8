"""The management UI's files: ``GET /ui/`` and its assets, and ``GET /`` redirecting
there (docs/ui.md).

The files ship inside the package (``broker/api/ui_static/``, package data): plain
HTML, CSS and JavaScript modules, no build step, nothing fetched from anywhere else.
They are read once, when the routes are built, and served from memory with an ETag, so
a page load costs no disk IO and a reload is a ``304``. Only the files found there are
served (a fixed table, no path from the request ever reaches the file system).

Every answer carries a Content-Security-Policy that allows only this origin's scripts,
styles and API (``connect-src 'self'``), forbids framing (clickjacking; RFC 7034's
``X-Frame-Options`` too, for older browsers), and ``nosniff``.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Final

from broker.http import NoSuchEndpoint, Request, Response, Router

__all__ = ["UI_PREFIX", "add_ui_routes", "load_ui_files"]

UI_PREFIX: Final = "/ui/"

_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".txt": "text/plain; charset=utf-8",
}

_SECURITY_HEADERS: Final = (
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
)


class _File:
    __slots__ = ("body", "content_type", "etag")

    def __init__(self, body: bytes, content_type: str) -> None:
        self.body = body
        self.content_type = content_type
        self.etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'


def load_ui_files() -> dict[str, _File]:
    """Every file of ``broker/api/ui_static`` by name (``index.html``, ``app.js``...)."""
    files: dict[str, _File] = {}
    root = resources.files("broker.api").joinpath("ui_static")
    if not root.is_dir():  # pragma: no cover - a broken install
        return files
    for entry in root.iterdir():
        name = entry.name
        suffix = name[name.rfind(".") :] if "." in name else ""
        if entry.is_file() and suffix in _TYPES:
            files[name] = _File(entry.read_bytes(), _TYPES[suffix])
    return files


def add_ui_routes(router: Router) -> None:
    """Register ``GET /``, ``GET /ui``, ``GET /ui/`` and ``GET /ui/{file}``."""
    files = load_ui_files()

    async def send(request: Request, response: Response, name: str) -> None:
        f = files.get(name)
        if f is None:
            raise NoSuchEndpoint(f"no such UI file: {name[:100]}")
        # no-cache: revalidate every time (a 304 is one round trip on loopback), so an
        # upgraded broker never runs yesterday's script against today's API.
        headers = [("etag", f.etag), ("cache-control", "no-cache"), *_SECURITY_HEADERS]
        if f.etag in (request.headers.get("if-none-match") or ""):
            await response.send_empty(304, headers=headers)
            return
        await response.send_bytes(200, f.body, content_type=f.content_type, headers=headers)

    async def to_ui(request: Request, response: Response) -> None:
        await response.send_empty(302, headers=[("location", UI_PREFIX), ("cache-control", "no-cache")])

    async def index(request: Request, response: Response) -> None:
        await send(request, response, "index.html")

    async def asset(request: Request, response: Response) -> None:
        await send(request, response, request.path_params["file"])

    # public: the files hold no data, and the page asks for a login when the API
    # answers 401 (a guarded page would get the browser's own Basic prompt instead)
    router.add("GET", "/", to_ui, public=True)
    router.add("GET", "/ui", to_ui, public=True)
    router.add("GET", "/ui/", index, public=True)
    router.add("GET", "/ui/{file}", asset, public=True)
