"""SIGHUP's reload of the certificates a node presents to etcd and to its peers
(``reload_tls_files``): the context is changed in place, so every holder's next
handshake presents the new certificate; a broken file leaves the old one; CAs added
are trusted beside the old ones (memory streams, no sockets)."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from broker.cluster.tlsfiles import peer_ssl_context, reload_tls_files

trustme = pytest.importorskip("trustme")


def _write(cert: Any, path_cert: Path, path_key: Path) -> None:
    path_cert.write_bytes(cert.cert_chain_pems[0].bytes())
    path_key.write_bytes(cert.private_key_pem.bytes())


async def _presented(client: ssl.SSLContext, server_ca: Any, server_cert: Any) -> list[str]:
    """The DNS names of the client certificate ``client`` presents to a server that
    requires one signed by ``server_ca`` (a handshake over memory streams)."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.verify_mode = ssl.CERT_REQUIRED
    server_ca.configure_trust(server)
    server_cert.configure_cert(server)
    left, right = trio.testing.memory_stream_pair()
    client_stream = trio.SSLStream(left, client, server_hostname="node.example")
    server_stream = trio.SSLStream(right, server, server_side=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client_stream.do_handshake)
        await server_stream.do_handshake()
    peer = server_stream.getpeercert()
    assert peer is not None
    return [value for kind, value in peer.get("subjectAltName", ()) if kind == "DNS"]


async def test_a_reload_presents_the_new_certificate_and_a_broken_file_keeps_the_old(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = trustme.CA()
    server_cert = ca.issue_cert("node.example")
    cert, key, ca_file = tmp_path / "client.pem", tmp_path / "client.key", tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    _write(ca.issue_cert("first.example"), cert, key)
    context = peer_ssl_context(ca_file, cert, key)
    assert context is not None
    assert await _presented(context, ca, server_cert) == ["first.example"]

    _write(ca.issue_cert("second.example"), cert, key)  # rotated on disk: not used yet
    assert await _presented(context, ca, server_cert) == ["first.example"]
    with caplog.at_level(logging.INFO, logger="ackbus.cluster"):
        assert reload_tls_files(context, ca_file, cert, key, "cluster_cert")
    assert "cluster_cert reloaded" in caplog.text
    assert await _presented(context, ca, server_cert) == ["second.example"]

    cert.write_text("-----BEGIN CERTIFICATE-----\nhalf written")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ackbus.cluster"):
        assert not reload_tls_files(context, ca_file, cert, key, "cluster_cert")
    assert "cluster_cert not reloaded; the old one stays in use" in caplog.text
    assert await _presented(context, ca, server_cert) == ["second.example"]


async def test_a_ca_added_on_reload_is_trusted_beside_the_old_one(tmp_path: Path) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(old_ca.cert_pem.bytes())
    context = peer_ssl_context(ca_file, None, None)
    assert context is not None

    async def verifies(ca: Any) -> bool:
        """Whether ``context`` trusts a peer whose certificate ``ca`` signed."""
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("node.example").configure_cert(server)
        left, right = trio.testing.memory_stream_pair()
        client_stream = trio.SSLStream(left, context, server_hostname="node.example")
        server_stream = trio.SSLStream(right, server, server_side=True)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server_stream.do_handshake)
                await client_stream.do_handshake()
        except (trio.BrokenResourceError, ssl.SSLError, BaseExceptionGroup):
            return False
        return True

    assert await verifies(old_ca) and not await verifies(new_ca)
    ca_file.write_bytes(old_ca.cert_pem.bytes() + new_ca.cert_pem.bytes())  # the new CA added first
    assert reload_tls_files(context, ca_file, None, None, "cluster_cert")
    assert await verifies(new_ca) and await verifies(old_ca)
