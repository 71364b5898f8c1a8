"""Router, query-string and header parsing, without any IO."""

from __future__ import annotations

from urllib.parse import quote

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.http.errors import (
    BadRequest,
    HeaderFieldsTooLarge,
    MethodNotAllowed,
    NotImplementedByServer,
    protocol_error,
)
from broker.http.errors import InvalidRequest as InvalidArgument
from broker.http.errors import NoSuchEndpoint as NotFound
from broker.http.headers import Headers
from broker.http.limits import Limits
from broker.http.query import QueryParams
from broker.http.router import Router, split_path


async def _h(request: object, response: object) -> None:  # pragma: no cover - never run
    pass


async def _h2(request: object, response: object) -> None:  # pragma: no cover
    pass


def make_router() -> Router:
    router = Router()
    router.add("GET", "/healthz", _h)
    router.add("PUT", "/queues/{name}", _h)
    router.add("GET", "/queues/{name}", _h)
    router.add("DELETE", "/queues/{name}", _h)
    router.add("POST", "/queues/{name}/get", _h2)
    router.add("POST", "/exchanges/{name}/publish", _h)
    router.add("GET", "/queues/special", _h2)
    return router


# -- router ---------------------------------------------------------------------


def test_literal_and_param_routes() -> None:
    router = make_router()
    match = router.match("PUT", "/queues/orders")
    assert match.handler is _h
    assert match.params == {"name": "orders"}
    assert router.match("POST", "/queues/orders/get").handler is _h2
    assert router.match("POST", "/exchanges/amq.default/publish").params == {"name": "amq.default"}
    assert router.match("GET", "/healthz").params == {}


def test_percent_decoding_keeps_encoded_slash_in_segment() -> None:
    router = make_router()
    assert router.match("GET", "/queues/a%2Fb").params == {"name": "a/b"}
    assert router.match("GET", "/queues/caf%C3%A9%20x").params == {"name": "café x"}
    # "+" is literal in a path (only query strings use it for a space)
    assert router.match("GET", "/queues/a+b").params == {"name": "a+b"}


def test_invalid_utf8_in_path_is_400() -> None:
    with pytest.raises(InvalidArgument, match="percent-encoded"):
        make_router().match("GET", "/queues/%FF")


def test_literal_beats_placeholder_but_falls_back() -> None:
    router = make_router()
    assert router.match("GET", "/queues/special").handler is _h2
    # "special" exists only for GET; PUT falls back to the placeholder route
    assert router.match("PUT", "/queues/special").params == {"name": "special"}


def test_unknown_path_is_404() -> None:
    router = make_router()
    for path in ("/nope", "/queues", "/queues/", "/queues/x/y", "/healthz/"):
        with pytest.raises(NotFound):
            router.match("GET", path)


def test_wrong_method_is_405_with_allow() -> None:
    router = make_router()
    with pytest.raises(MethodNotAllowed) as info:
        router.match("POST", "/queues/x")
    assert info.value.status == 405
    assert info.value.allow == ("DELETE", "GET", "HEAD", "PUT")
    assert ("allow", "DELETE, GET, HEAD, PUT") in info.value.headers


def test_head_falls_back_to_get() -> None:
    router = make_router()
    assert router.match("HEAD", "/healthz").handler is _h


def test_bad_patterns_rejected() -> None:
    router = Router()
    with pytest.raises(ValueError):
        router.add("get", "/x", _h)
    with pytest.raises(ValueError):
        router.add("GET", "x", _h)
    with pytest.raises(ValueError):
        router.add("GET", "/a/{x}/{x}", _h)
    with pytest.raises(ValueError):
        router.add("GET", "/a/pre{x}", _h)
    router.add("GET", "/a/{x}", _h)
    with pytest.raises(ValueError):
        router.add("GET", "/a/{y}", _h)


def test_route_decorator_returns_handler() -> None:
    router = Router()

    @router.route("GET", "/x")
    async def handler(request: object, response: object) -> None:  # pragma: no cover
        pass

    assert router.match("GET", "/x").handler is handler


@settings(deadline=None)  # a loaded CI machine must not fail a pure test
@given(st.text(min_size=1, max_size=40))
def test_any_name_round_trips_through_percent_encoding(name: str) -> None:
    router = make_router()
    assert router.match("GET", "/queues/" + quote(name, safe="")).params == {"name": name}


def test_split_path() -> None:
    assert split_path("/") == [""]
    assert split_path("/a/b%2Fc") == ["a", "b/c"]
    with pytest.raises(InvalidArgument):
        split_path("*")


# -- query ----------------------------------------------------------------------


def test_query_typed_getters() -> None:
    q = QueryParams("max=10&wait=2.5&mandatory=true&ack=lease&routing_key=a.b+c&empty=")
    assert q.get_int("max", min_value=1, max_value=100) == 10
    assert q.get_float("wait") == 2.5
    assert q.get_bool("mandatory") is True
    assert q.get_str("ack", choices=("auto", "lease")) == "lease"
    assert q.get_str("routing_key") == "a.b c"
    assert q.get_str("empty") == ""
    assert q.get_int("missing", 7) == 7
    assert q.get_bool("missing", None) is None
    assert "max" in q and "nope" not in q
    assert len(q) == 6


@pytest.mark.parametrize(
    ("query", "call", "message"),
    [
        ("max=abc", lambda q: q.get_int("max"), "'max' must be an integer"),
        ("max=1_000", lambda q: q.get_int("max"), "'max' must be an integer"),
        ("max=0", lambda q: q.get_int("max", min_value=1), "'max' must be at least 1"),
        ("max=101", lambda q: q.get_int("max", max_value=100), "'max' must be at most 100"),
        ("wait=nan", lambda q: q.get_float("wait"), "'wait' must be a number"),
        ("wait=inf", lambda q: q.get_float("wait"), "'wait' must be a number"),
        ("wait=-1", lambda q: q.get_float("wait", min_value=0), "'wait' must be at least 0"),
        ("m=yes", lambda q: q.get_bool("m"), "'m' must be true, false, 1 or 0"),
        ("", lambda q: q.get_int("max"), "missing required query parameter 'max'"),
        ("a=1&a=2", lambda q: q.get_int("a"), "'a' is given more than once"),
        ("ack=x", lambda q: q.get_str("ack", choices=("auto", "lease")), "one of auto, lease"),
        ("k=abcdef", lambda q: q.get_str("k", max_length=3), "longer than 3"),
        ("k=%FF", lambda q: q.get_str("k"), "not valid UTF-8"),
    ],
)
def test_query_errors_name_the_parameter(query: str, call: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as info:
        call(QueryParams(query))  # type: ignore[operator]
    assert info.value.status == 400


def test_query_bool_spellings() -> None:
    q = QueryParams("a=TRUE&b=0&c=1&d=False")
    assert [q.get_bool(n) for n in "abcd"] == [True, False, True, False]


def test_query_get_all_and_items() -> None:
    q = QueryParams("a=1&b=2&a=3")
    assert q.get_all("a") == ["1", "3"]
    assert q.items() == [("a", "1"), ("b", "2"), ("a", "3")]


# -- headers --------------------------------------------------------------------


def test_headers_case_insensitive() -> None:
    headers = Headers([(b"content-type", b"text/plain"), (b"x-a", b"1"), (b"x-a", b"2")])
    assert headers.get("Content-Type") == "text/plain"
    assert headers["CONTENT-TYPE"] == "text/plain"
    assert headers.get("x-a") == "1, 2"
    assert headers.get_all("X-A") == ["1", "2"]
    assert "X-a" in headers
    assert headers.get("missing") is None
    with pytest.raises(KeyError):
        headers["missing"]
    assert next(iter(headers.items())) == ("content-type", "text/plain")


def test_headers_latin1_never_fails() -> None:
    headers = Headers([(b"x-name", "café".encode())])
    value = headers["x-name"]
    assert value.encode("latin-1").decode("utf-8") == "café"


# -- limits and errors ------------------------------------------------------------


def test_limits_defaults_and_validation() -> None:
    limits = Limits()
    assert limits.max_header_bytes == 64 * 1024
    assert limits.max_headers == 100
    assert limits.max_body_bytes == 16 * 1024 * 1024
    assert (limits.header_timeout_s, limits.idle_timeout_s, limits.body_timeout_s) == (
        10.0,
        60.0,
        30.0,
    )
    assert limits.max_connections == 10_000
    with pytest.raises(ValueError):
        Limits(max_body_bytes=0)
    with pytest.raises(ValueError):
        Limits(header_timeout_s=0)
    with pytest.raises(ValueError):
        Limits(send_timeout_s=-1)


def test_protocol_error_mapping() -> None:
    assert isinstance(protocol_error(h11.RemoteProtocolError("x")), BadRequest)
    big = protocol_error(h11.RemoteProtocolError("x", error_status_hint=431))
    assert isinstance(big, HeaderFieldsTooLarge) and big.status == 431
    te = protocol_error(h11.RemoteProtocolError("x", error_status_hint=501))
    assert isinstance(te, NotImplementedByServer) and te.to_json()["error"] == "not_implemented"


@pytest.mark.parametrize("path", ["/queues/%", "/queues/%%", "/queues/a%2", "/queues/%zz", "/queues/x%g1"])
def test_a_percent_sign_that_is_not_an_escape_is_400(path: str) -> None:
    # before: taken literally, so PUT /queues/% declared a queue named "%"
    with pytest.raises(InvalidArgument, match="not a %XX escape"):
        make_router().match("GET", path)


def test_a_get_route_added_with_head_false_refuses_head() -> None:
    router = Router()
    router.add("GET", "/queues/{name}/stream", _h, head=False)
    with pytest.raises(MethodNotAllowed) as info:
        router.match("HEAD", "/queues/q/stream")
    assert info.value.allow == ("GET",)
    assert router.match("GET", "/queues/q/stream").handler is _h


def test_an_explicit_head_route_replaces_the_get_twin() -> None:
    router = Router()
    router.add("GET", "/x", _h)
    router.add("HEAD", "/x", _h2)
    assert router.match("HEAD", "/x").handler is _h2
    assert router.match("GET", "/x").handler is _h
