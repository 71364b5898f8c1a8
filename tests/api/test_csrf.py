"""Cross-site request forgery: a state-changing request a browser sent from another
site is refused (403 cross_site_request) before it changes anything; same-origin pages
and clients that are not browsers are served as before."""

from __future__ import annotations

import pytest

from broker.api.csrf import cross_site_reason
from broker.app import BrokerApp
from broker.http import Headers
from tests.support.http import HTTPClient, assert_error

HOST = "localhost:8080"


def reason(method: str, **headers: str) -> str | None:
    pairs = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return cross_site_reason(method, Headers(pairs))


@pytest.mark.parametrize(
    "headers",
    [
        {},  # curl, the client library
        {"host": HOST, "origin": "http://localhost:8080"},
        {"host": "LOCALHOST:8080", "origin": "http://localhost:8080"},
        {"host": "broker.example", "origin": "http://broker.example:80"},
        {"host": "broker.example:443", "origin": "https://broker.example"},
        # the browser's own word wins (a proxy may have rewritten Host)
        {"host": "10.0.0.5:8080", "origin": "https://mq.example", "sec_fetch_site": "same-origin"},
        {"sec_fetch_site": "none"},
    ],
)
def test_served(headers: dict[str, str]) -> None:
    assert reason("POST", **headers) is None


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        ({"host": HOST, "origin": "https://evil.example"}, "is not this server"),
        ({"host": HOST, "origin": "http://localhost:9999"}, "is not this server"),
        ({"host": HOST, "origin": "http://ui.localhost:8080"}, "is not this server"),
        ({"host": HOST, "origin": "null"}, "Origin: null"),
        ({"host": HOST, "origin": "file://"}, "not an http(s) origin"),
        ({"origin": "http://localhost:8080"}, "no Host header"),
        ({"host": HOST, "sec_fetch_site": "cross-site"}, "Sec-Fetch-Site: cross-site"),
        ({"host": HOST, "origin": "http://localhost:8080", "sec_fetch_site": "same-site"}, "same-site"),
    ],
)
def test_refused(headers: dict[str, str], words: str) -> None:
    why = reason("PUT", **headers)
    assert why is not None and words in why


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS"])
def test_safe_methods_are_never_refused(method: str) -> None:
    assert reason(method, host=HOST, origin="https://evil.example", sec_fetch_site="cross-site") is None


async def test_refused_before_anything_changes(app: BrokerApp, client: HTTPClient) -> None:
    evil = [("Origin", "https://evil.example")]
    body = assert_error(await client.put("/queues/q", json={}, headers=evil), 403, "cross_site_request")
    assert "evil.example" in body["message"]
    assert "q" not in app.runtime.core.queues
    assert (await client.put("/queues/q", json={})).status == 201
    publish = "/exchanges/amq.default/publish?routing_key=q"
    for method, target, headers in [
        ("POST", publish, [("Sec-Fetch-Site", "cross-site")]),
        ("POST", "/queues/q/purge", evil),
        ("DELETE", "/queues/q", evil),
        ("POST", "/channel", evil),  # a form can post NDJSON-looking text
        ("DELETE", "/channels/1", evil),
    ]:
        assert_error(await client.request(method, target, body=b"x", headers=headers), 403, "cross_site_request")
    assert app.runtime.core.queues["q"].published == 0
    # Reading stays open to any page (a GET changes nothing here).
    assert (await client.get("/queues/q", headers=evil)).status == 200


async def test_a_same_origin_page_is_served(client: HTTPClient) -> None:
    port_host = [("Sec-Fetch-Site", "same-origin"), ("Origin", "http://127.0.0.1:1")]
    assert (await client.put("/queues/from-the-ui", json={}, headers=port_host)).status == 201
