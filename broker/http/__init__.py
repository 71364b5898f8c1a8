"""The trio + h11 layer: HTTP server plumbing, REST handlers, channels, streams,
and the runtime that carries out the core's effects."""

from broker.http.app import BrokerApp, build_router
from broker.http.connection import LIMIT, BodyIterator, HeaderInput, Request, Response
from broker.http.errors import (
    BadRequest,
    ClientDisconnected,
    HeaderFieldsTooLarge,
    HTTPError,
    MethodNotAllowed,
    NotImplementedByServer,
    RequestTimeout,
)
from broker.http.headers import Headers
from broker.http.limits import Limits
from broker.http.query import QueryParams
from broker.http.router import Handler, RouteMatch, Router, split_path
from broker.http.runtime import BrokerRuntime, ChannelSink, RuntimeOptions
from broker.http.server import HTTPServer, ServerStatistics, serve_http

__all__ = [
    "BrokerApp",
    "build_router",
    "BrokerRuntime",
    "ChannelSink",
    "RuntimeOptions",
    "HTTPServer",
    "ServerStatistics",
    "serve_http",
    "Request",
    "Response",
    "BodyIterator",
    "HeaderInput",
    "LIMIT",
    "Router",
    "Handler",
    "RouteMatch",
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
]
