"""The client TLS contexts a node makes from its settings' files, to reach etcd
(``--etcd-ca-file``, ``--etcd-cert``, ``--etcd-key``) and its peers
(``--cluster-ca-file``, ``--cluster-cert``, ``--cluster-key``), and their reload on
SIGHUP: the contexts are changed in place, so that every holder (forwarding
channels, relayed calls, quorum followers, the etcd client) gets the new certificate
with its next connection.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

__all__ = ["client_tls_context", "peer_ssl_context", "reload_tls_files"]

log = logging.getLogger("ackbus.cluster")


def client_tls_context(ca_file: Path | None, cert: Path | None, key: Path | None, settings: tuple[str, str, str]) -> ssl.SSLContext:
    """A client's TLS context: the server's certificate verified against ``ca_file``
    (None: the system's CAs), ``cert`` and ``key`` presented when given. Raises
    OSError naming the file that cannot be loaded by its setting (``settings``: the
    names of the three)."""
    ca_setting, cert_setting, key_setting = settings
    try:
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot load {ca_setting} {ca_file}: {exc.strerror or exc}") from None
    if cert is not None and key is not None:
        try:
            context.load_cert_chain(str(cert), str(key))
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot load {cert_setting} {cert} with {key_setting} {key}: {exc.strerror or exc}"
            ) from None
    return context


def peer_ssl_context(ca_file: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """The TLS context a node calls another's ``https://`` URL with: the peer's
    certificate verified against ``ca_file`` (None: the system's CAs), ``cert`` and
    ``key`` presented when given (for nodes that require client certificates,
    ``--tls-client-ca``). None when neither is given (the system's defaults). Raises
    OSError naming a file that cannot be loaded."""
    if ca_file is None and cert is None:
        return None
    return client_tls_context(ca_file, cert, key, ("cluster_ca_file", "cluster_cert", "cluster_key"))


def reload_tls_files(context: ssl.SSLContext, ca_file: Path | None, cert: Path | None, key: Path | None, name: str) -> bool:
    """Load ``cert``/``key`` into ``context`` again, in place, and add the CAs of
    ``ca_file`` (CAs trusted before stay trusted: a CA is rotated by adding the new one
    first): every object holding ``context`` uses them for its next connection, open
    ones keep theirs. The files are tried in a scratch context first, so a broken or
    half-written one leaves the old certificate in use (logged); returns whether the
    files were loaded. ``name``: the setting, for the log."""
    try:
        if cert is not None and key is not None:
            ssl.create_default_context().load_cert_chain(str(cert), str(key))
        if ca_file is not None:
            ssl.create_default_context(cafile=str(ca_file))
            context.load_verify_locations(cafile=str(ca_file))
        if cert is not None and key is not None:
            context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        log.error(f"{name} not reloaded; the old one stays in use", extra={"fields": {"error": str(exc)}})
        return False
    log.info(f"{name} reloaded", extra={"fields": {"cert": str(cert) if cert is not None else None}})
    return True
