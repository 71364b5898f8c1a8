"""A generic HTTP/1.1 server on trio and h11: connections, routing, limits, errors.

It knows nothing of the broker: handlers are plain async functions of a request and a
response, registered on a :class:`Router` by the API layer."""

from broker.http.connection import (
    LIMIT,
    BodyIterator,
    ErrorTranslator,
    Handler,
    HeaderInput,
    Request,
    Response,
)
from broker.http.errors import (
    BadRequest,
    ClientDisconnected,
    HeaderFieldsTooLarge,
    HTTPError,
    InvalidRequest,
    MethodNotAllowed,
    NoSuchEndpoint,
    NotImplementedByServer,
    PayloadTooLarge,
    RequestTimeout,
    ServiceUnavailable,
)
from broker.http.headers import Headers
from broker.http.limits import Limits
from broker.http.query import QueryParams
from broker.http.router import Guard, RouteInfo, RouteMatch, Router, split_path
from broker.http.server import HTTPServer, ServerStatistics, serve_http
from broker.http.tls import server_ssl_context

__all__ = [
    "HTTPServer",
    "ServerStatistics",
    "serve_http",
    "server_ssl_context",
    "Request",
    "Response",
    "BodyIterator",
    "HeaderInput",
    "LIMIT",
    "Router",
    "Handler",
    "RouteMatch",
    "RouteInfo",
    "Guard",
    "split_path",
    "Limits",
    "QueryParams",
    "Headers",
    "ClientDisconnected",
    "HTTPError",
    "BadRequest",
    "MethodNotAllowed",
    "RequestTimeout",
    "HeaderFieldsTooLarge",
    "NotImplementedByServer",
    "InvalidRequest",
    "NoSuchEndpoint",
    "PayloadTooLarge",
    "ServiceUnavailable",
    "ErrorTranslator",
]
