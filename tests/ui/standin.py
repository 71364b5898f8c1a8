"""A small HTTP server for the browser tests, on its own loopback port (so its pages
are another origin than the broker's):

* ``attacker_page``: a page of "another site" that tries to change the broker through
  the visitor's browser (cross-site request forgery);
* the UI's own files, with every API call answered ``401`` (HTTP Basic challenge) until
  an ``Authorization`` it accepts arrives, as a broker with users does; then canned
  answers (``answers``) for the API families the UI shows only when they exist.
  It stands in for the broker's authentication, which lives apart from the UI; the UI
  only has to send what the login form produced, and to send it on every call.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from broker.api.ui import load_ui_files

__all__ = ["StandIn", "open_standin"]


class StandIn:
    def __init__(self, server: ThreadingHTTPServer) -> None:
        self.server = server
        self.pages: dict[str, bytes] = {}
        self.accepted: set[str] = set()
        #: API answers by path (besides /overview), for a broker with more families
        self.answers: dict[str, object] = {}
        #: (path, Authorization header or None) of every API call
        self.calls: list[tuple[str, str | None]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@contextmanager
def open_standin() -> Iterator[StandIn]:
    files = load_ui_files()

    class Handler(BaseHTTPRequestHandler):
        standin: StandIn

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            standin = self.standin
            if self.path in standin.pages:
                self._send(200, standin.pages[self.path], "text/html; charset=utf-8")
                return
            if self.path.startswith("/ui/"):
                f = files.get(self.path[4:].split("?")[0] or "index.html")
                if f is not None:
                    self._send(200, f.body, f.content_type)
                    return
            auth = self.headers.get("Authorization")
            standin.calls.append((self.path, auth))
            if auth not in standin.accepted:
                body = json.dumps({"error": "unauthorized", "message": "credentials required"}).encode()
                self._send(401, body, "application/json", {"WWW-Authenticate": 'Basic realm="ackbus"'})
            elif self.path == "/overview":
                overview = {
                    "version": "9.9.9", "uptime_s": 1.0, "stats": {},
                    "totals": {"messages_ready": 0, "messages_unacked": 0},
                    "storage": {"enabled": False},
                }
                self._send(200, json.dumps(overview).encode(), "application/json")
            elif self.path in standin.answers:
                self._send(200, json.dumps(standin.answers[self.path]).encode(), "application/json")
            else:
                self._send(404, b'{"error":"not_found","message":"no"}', "application/json")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    standin = StandIn(server)
    Handler.standin = standin
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield standin
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
