"""TLS for the HTTP server: the server's ``ssl.SSLContext`` from PEM files.

The server wraps each accepted connection in ``trio.SSLStream`` with the context it
holds *at accept time*; :meth:`~broker.http.HTTPServer.set_ssl_context` swaps it, so a
reloaded certificate (SIGHUP) serves new connections while open ones keep theirs.

Defaults: TLS 1.2 or later (RFC 8996 retired 1.0 and 1.1), Python's default cipher
choice, ALPN ``http/1.1``. With a client CA the server asks every client for a
certificate and refuses the handshake without one signed by that CA (mutual TLS).
"""

from __future__ import annotations

import ssl
from pathlib import Path

__all__ = ["server_ssl_context"]


def server_ssl_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """A server context serving ``cert`` (a PEM chain, leaf first) with ``key``.

    Raises: ``OSError`` for a file that cannot be read, ``ssl.SSLError`` for one that
    is not a certificate or key, or a key that does not match the certificate.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    if client_ca is not None:
        context.load_verify_locations(cafile=str(client_ca))
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["http/1.1"])
    return context
