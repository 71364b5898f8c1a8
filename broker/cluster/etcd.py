"""An etcd client on trio and h11: the JSON gateway's kv, lease and watch calls, over
several endpoints with failover.

Each unary call (range, put, txn, delete, lease) is one POST on a kept-alive
connection to the endpoint that answered last; when it cannot connect there, it moves
on to the next endpoint. A call that was sent but got no answer is not repeated
elsewhere (a txn may have been applied): it raises :class:`EtcdUnavailable` and the
caller decides, and the *next* call starts at the next endpoint (the one that did not
answer may be cut off, hung, or a member partitioned from etcd's majority).

A watch holds a connection of its own and yields the stream's messages as they
arrive. A watch cannot tell a quiet stream from a dead one (a cut-off member sends
nothing, not even a close), so it follows the unary calls: once they move to another
endpoint than the watch's, its read ends with :class:`WatchMoved` and the caller
watches again from its last revision, there. Requests and answers are built and read
by the pure functions of ``broker.cluster.etcdproto``; one connection's request and
answer are ``broker.cluster.etcdconn``.

Endpoints are all ``http://`` or all ``https://``. Over https every connection (watches
too) is TLS, verified by the client's ``ssl_context`` (``broker.cluster.etcdaccess``);
a handshake that fails, either side refusing the other's certificate, counts as an
endpoint that cannot be reached. With etcd's users, every request carries a token,
renewed once when etcd refuses it (``broker.cluster.etcdaccess``).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import h11
import orjson
import trio

from broker.cluster.etcdaccess import (
    EtcdCredentials,
    EtcdTLSRefused,
    EtcdTokens,
    Token,
    refused_by_tls,
    tls_reason,
    token_refused,
)
from broker.cluster.etcdconn import (
    MAX_ANSWER_BYTES,
    Endpoint,
    EtcdConnection,
    NoResponse,
    connect,
    parse_endpoints,
    read_answer,
)
from broker.cluster.etcdproto import (
    Compare,
    EtcdError,
    EtcdUnavailable,
    KeyValue,
    Op,
    TxnResult,
    WatchBatch,
    b64,
    decode_json_line,
    header_revision,
    parse_error,
    parse_keepalive,
    parse_kvs,
    parse_txn,
    parse_watch,
    prefix_end,
    range_body,
    txn_body,
)

__all__ = ["Endpoint", "EtcdClient", "WatchMoved", "WatchStream", "parse_endpoints"]

log = logging.getLogger("ackbus.cluster")


class EtcdClient:
    """kv, lease and watch calls to an etcd cluster (see the module docstring).

    Every method raises :class:`EtcdUnavailable` when no endpoint answered within
    ``timeout_s`` and :class:`EtcdError` when etcd refused the request.
    """

    def __init__(
        self,
        endpoints: list[Endpoint],
        *,
        timeout_s: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        credentials: EtcdCredentials | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.timeout_s = timeout_s
        #: verifies https endpoints (None: the system's CAs, no client certificate)
        self.ssl_context = ssl_context
        #: etcd's users: the token requests carry (None: no user configured)
        self.tokens = EtcdTokens(credentials) if credentials is not None else None
        self._preferred = 0
        self._idle: dict[str, EtcdConnection] = {}
        #: the cancel scope of each watch read in progress, with the endpoint it reads
        #: from: cancelled when the calls move to another endpoint
        self._watch_reads: dict[trio.CancelScope, Endpoint] = {}

    @property
    def preferred(self) -> Endpoint:
        """The endpoint the next call starts at (the one that answered last)."""
        return self.endpoints[self._preferred]

    def _prefer(self, index: int) -> None:
        self._preferred = index
        endpoint = self.endpoints[index]
        for scope, watched in self._watch_reads.items():
            if watched is not endpoint:
                scope.cancel()

    # ----------------------------------------------------------------- unary calls

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path`` on the first endpoint that takes it, with the
        user's token; sent once more with a new token when etcd refused the token (it
        applied none of the request then)."""
        payload = orjson.dumps(body)
        if self.tokens is None:
            return await self._call_anywhere(path, payload, None)
        token = await self.tokens.current(self._authenticate)
        try:
            return await self._call_anywhere(path, payload, token.value)
        except EtcdError as exc:
            if isinstance(exc, EtcdUnavailable) or not token_refused(exc):
                raise
            log_reason = exc.message
        token = await self.tokens.renew(token.generation, self._authenticate)
        log.info("etcd token renewed", extra={"fields": {"why": log_reason}})
        return await self._call_anywhere(path, payload, token.value)

    async def _authenticate(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call_anywhere("/v3/auth/authenticate", orjson.dumps(body), None)

    async def current_token(self) -> Token | None:
        """The token a request carries now (None: no etcd user); authenticates first
        when there is none yet."""
        return await self.tokens.current(self._authenticate) if self.tokens is not None else None

    async def _call_anywhere(self, path: str, payload: bytes, token: str | None) -> dict[str, Any]:
        """One POST on the first endpoint that takes it (see the module docstring)."""
        failures = []
        count = len(self.endpoints)
        for step in range(count):
            index = (self._preferred + step) % count
            endpoint = self.endpoints[index]
            try:
                answer = await self._call_one(endpoint, path, payload, token)
            except _NotSent as exc:
                endpoint.mark(str(exc))
                failures.append(f"{endpoint.url}: {exc}")
                continue
            except EtcdUnavailable as exc:
                endpoint.mark(exc.message)
                self._prefer((index + 1) % count)  # the next call tries another one first
                raise EtcdUnavailable(f"{endpoint.url}: {exc.message}", code=exc.code) from None
            endpoint.mark(None)
            self._prefer(index)
            return answer
        raise EtcdUnavailable("etcd unreachable: " + "; ".join(failures))

    async def _call_one(self, endpoint: Endpoint, path: str, payload: bytes, token: str | None) -> dict[str, Any]:
        conn = self._idle.pop(endpoint.url, None)
        if conn is not None:
            try:
                return await self._call_on(endpoint, conn, path, payload, token)
            except _Stale:
                pass  # the kept-alive connection had died (etcd restarted): a new one
        return await self._call_on(endpoint, None, path, payload, token)

    async def _call_on(
        self, endpoint: Endpoint, conn: EtcdConnection | None, path: str, payload: bytes, token: str | None
    ) -> dict[str, Any]:
        reused = conn is not None
        sent = False
        try:
            with trio.fail_after(self.timeout_s):
                if conn is None:
                    try:
                        conn = await connect(endpoint, self.ssl_context)
                    except EtcdTLSRefused as exc:
                        raise _NotSent(str(exc)) from None
                    except OSError as exc:
                        raise _NotSent(f"cannot connect: {exc.strerror or exc}") from None
                try:
                    await conn.send_request("POST", path, payload, token)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    # A kept-alive connection the server closed meanwhile: nothing
                    # reached it, so another try is safe.
                    raise _NotSent(f"connection lost before sending: {exc}") from None
                sent = True
                try:
                    status, body = await read_answer(conn)
                except (NoResponse, trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.ProtocolError) as exc:
                    if not reused and refused_by_tls(exc):
                        await conn.aclose()
                        raise _NotSent(
                            "etcd refused the TLS connection (no client certificate, or one it does not trust?): "
                            + tls_reason(exc)
                        ) from None
                    if not reused:
                        raise EtcdUnavailable("connection lost before an answer") from None
                    # Nothing came back on a connection that had been idle: it was
                    # dead before the request (a live server answers or times out).
                    await conn.aclose()
                    raise _Stale() from None
        except trio.TooSlowError:
            if conn is not None:
                await conn.aclose()
            if not sent:
                raise _NotSent(f"no connection within {self.timeout_s:g} s") from None
            raise EtcdUnavailable(f"no answer within {self.timeout_s:g} s", code=4) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.ProtocolError) as exc:
            if conn is not None:
                await conn.aclose()
            raise EtcdUnavailable(f"connection lost: {exc}") from None
        except BaseException:
            if conn is not None:
                await conn.aclose()
            raise
        if conn.reusable():
            old = self._idle.pop(endpoint.url, None)
            self._idle[endpoint.url] = conn
            if old is not None:
                await old.aclose()
        else:
            await conn.aclose()
        answer = decode_json_line(body) if body.strip() else {}
        if status >= 400:
            raise parse_error(answer)
        return answer

    async def aclose(self) -> None:
        conns, self._idle = list(self._idle.values()), {}
        for conn in conns:
            await conn.aclose()

    # ------------------------------------------------------------------------- kv

    async def get(self, key: bytes) -> tuple[int, KeyValue | None]:
        """The store's revision and ``key`` (None when absent)."""
        revision, kvs = parse_kvs(await self.call("/v3/kv/range", range_body(key)))
        return revision, (kvs[0] if kvs else None)

    async def get_prefix(self, prefix: bytes) -> tuple[int, list[KeyValue]]:
        """The store's revision and every key under ``prefix``, read at that revision."""
        return parse_kvs(await self.call("/v3/kv/range", range_body(prefix, prefix=True)))

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        return header_revision(await self.call("/v3/kv/put", body))

    async def delete(self, key: bytes, *, prefix: bool = False) -> int:
        body: dict[str, Any] = {"key": b64(key)}
        if prefix:
            body["range_end"] = b64(prefix_end(key))
        return header_revision(await self.call("/v3/kv/deleterange", body))

    async def txn(self, compare: list[Compare], success: list[Op], failure: list[Op] | None = None) -> TxnResult:
        return parse_txn(await self.call("/v3/kv/txn", txn_body(compare, success, failure or [])))

    # --------------------------------------------------------------------- leases

    async def lease_grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id."""
        answer = await self.call("/v3/lease/grant", {"TTL": str(ttl_s)})
        if answer.get("error"):
            raise EtcdError(f"etcd: lease not granted: {answer['error']}")
        return int(answer["ID"])

    async def lease_keepalive(self, lease: int) -> int:
        """Renew ``lease``; the TTL it now has, 0 when it no longer exists."""
        return parse_keepalive(await self.call("/v3/lease/keepalive", {"ID": str(lease)}))

    async def lease_revoke(self, lease: int) -> None:
        try:
            await self.call("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as exc:
            if isinstance(exc, EtcdUnavailable) or "not found" not in exc.message:
                raise

    # ---------------------------------------------------------------------- watch

    @asynccontextmanager
    async def watch(self, prefix: bytes, start_revision: int) -> AsyncIterator[WatchStream]:
        """Watch every key under ``prefix`` from ``start_revision``; yields an iterator
        of the stream's messages. The stream ends with EtcdUnavailable when the
        connection does; a message with ``compacted`` set means the history asked for
        is gone (the caller reads afresh and watches again)."""
        request = {
            "create_request": {
                **range_body(prefix, prefix=True),
                "start_revision": str(start_revision),
                "progress_notify": True,
            }
        }
        token = await self.current_token()
        conn = await self._open_watch(orjson.dumps(request), token.value if token is not None else None)
        try:
            yield WatchStream(conn, self, token)
        finally:
            await conn.aclose()

    async def _open_watch(self, payload: bytes, token: str | None) -> EtcdConnection:
        failures = []
        count = len(self.endpoints)
        for step in range(count):
            index = (self._preferred + step) % count
            endpoint = self.endpoints[index]
            conn = None
            try:
                with trio.fail_after(self.timeout_s):
                    conn = await connect(endpoint, self.ssl_context)
                    await conn.send_request("POST", "/v3/watch", payload, token)
                    event = await conn.next_event()
            except (OSError, trio.TooSlowError, trio.BrokenResourceError, h11.ProtocolError) as exc:
                if conn is not None:
                    await conn.aclose()
                reason = f"etcd refused the TLS connection: {tls_reason(exc)}" if refused_by_tls(exc) else str(exc) or type(exc).__name__
                endpoint.mark(reason)
                failures.append(f"{endpoint.url}: {reason}")
                continue
            if not isinstance(event, h11.Response) or event.status_code != 200:
                await conn.aclose()
                status = getattr(event, "status_code", "?")
                endpoint.mark(f"watch answered {status}")
                failures.append(f"{endpoint.url}: watch answered {status}")
                continue
            endpoint.mark(None)
            self._prefer(index)
            return conn
        raise EtcdUnavailable("etcd unreachable for a watch: " + "; ".join(failures))

    async def read_watch(self, conn: EtcdConnection) -> Any:
        """The next h11 event of watch connection ``conn``. Raises WatchMoved when the
        calls go (or move while it waits) to another endpoint than the watch's."""
        scope = trio.CancelScope()
        if self.preferred is conn.endpoint:
            self._watch_reads[scope] = conn.endpoint
            try:
                with scope:
                    return await conn.next_event()
            finally:
                del self._watch_reads[scope]
        raise WatchMoved(f"etcd calls moved from {conn.endpoint.url} to {self.preferred.url}")


class WatchMoved(Exception):
    """The client's calls moved to another endpoint than the watch's (which may be cut
    off without a sign): watch again from the last revision, there."""


class _NotSent(Exception):
    """The request never reached the endpoint: safe to try the next one."""


class _Stale(Exception):
    """A kept-alive connection turned out dead before any answer: try a new one."""


class WatchStream:
    """The watch stream's messages (newline-separated JSON objects, in chunks) as an
    async iterator. A class rather than an async generator, so that leaving a loop
    early leaves nothing to finalize."""

    def __init__(self, conn: EtcdConnection, client: EtcdClient, token: Token | None = None) -> None:
        self._conn = conn
        self._client = client
        self._token = token
        self._buffer = b""
        self._ready: list[WatchBatch] = []

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchBatch:
        """The next message. Raises EtcdUnavailable when the stream ends, WatchMoved
        when the client's calls moved to another endpoint."""
        conn = self._conn
        while not self._ready:
            try:
                event = await self._client.read_watch(conn)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.ProtocolError) as exc:
                conn.endpoint.mark(f"watch lost: {exc}")
                raise EtcdUnavailable(f"{conn.endpoint.url}: watch lost: {exc}") from None
            if isinstance(event, h11.Data):
                self._buffer += bytes(event.data)
                if len(self._buffer) > MAX_ANSWER_BYTES:
                    raise EtcdError(f"etcd watch message over {MAX_ANSWER_BYTES} bytes")
                *lines, self._buffer = self._buffer.split(b"\n")
                self._ready.extend(parse_watch(decode_json_line(line)) for line in lines if line.strip())
                self._note_refused_token()
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                conn.endpoint.mark("watch stream ended")
                raise EtcdUnavailable(f"{conn.endpoint.url}: the watch stream ended")
        return self._ready.pop(0)

    def _note_refused_token(self) -> None:
        """etcd cancels a watch whose token it does not accept (the stream says so, it
        does not fail): the client's next call or watch gets a new token."""
        tokens = self._client.tokens
        if tokens is not None and self._token is not None:
            refused = [batch.reason for batch in self._ready if batch.canceled and token_refused(batch.reason)]
            if refused:
                tokens.forget(self._token, f"a watch cancelled for its token: {refused[0]}")
