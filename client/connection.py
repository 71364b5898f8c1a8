"""``connect()``: the broker URL, the settings, the REST pool, and the channels opened
from them.

A :class:`Connection` holds no socket of its own beyond idle REST keep-alive
connections: each channel is its own TCP connection (HTTP/1.1 carries one exchange at
a time), opened by :meth:`Connection.channel` and closed when its block ends.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from ._nursery import open_service_nursery
from .backoff import ReconnectPolicy
from .channel import Channel
from .endpoint import Endpoint, StreamOpener, open_tcp
from .errors import ClientClosed
from .locks import HeldLock, hold_lock
from .rest import BrokerAPI
from .schedules import Schedules
from .settings import Settings
from .transport import RestClient

__all__ = ["Connection", "connect", "DEFAULT_URL"]

DEFAULT_URL = "http://127.0.0.1:8080"


class Connection(BrokerAPI):
    """A broker to talk to. Made by :func:`connect`.

    REST methods (declare, bind, get, stats) are inherited from
    :class:`~client.rest.BrokerAPI`; channels come from :meth:`channel`.
    """

    def __init__(self, endpoint: Endpoint, settings: Settings, opener: StreamOpener) -> None:
        self.endpoint = endpoint
        self.settings = settings
        self._opener = opener
        super().__init__(RestClient(endpoint, opener, timeout_s=settings.request_timeout_s))
        self._channels: list[Channel] = []
        self._closed = False
        self._stopped_consuming = False

    @property
    def channels(self) -> list[Channel]:
        """The channels open right now."""
        return list(self._channels)

    @asynccontextmanager
    async def channel(
        self,
        *,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
        publish_timeout_s: float | None = None,
        close_timeout_s: float | None = None,
        reconnect: ReconnectPolicy | None = None,
    ) -> AsyncIterator[Channel]:
        """Open a channel for the duration of the block.

        Waits for the first session (retrying per the reconnect policy). Leaving the
        block normally closes the channel gracefully (:meth:`Channel.aclose`: stop
        consumers, wait up to ``close_timeout_s`` for pending confirms, close);
        leaving it with an exception or a cancellation drops it at once
        (:meth:`Channel.abort`). Keyword arguments override the connection's settings.

        Raises:
            ConnectionLost: the channel could not be opened within the policy.
            ClientClosed: the connection is closed.
        """
        if self._closed:
            raise ClientClosed("the connection is closed")
        settings = self.settings.replace(
            max_pending=max_pending,
            max_pending_bytes=max_pending_bytes,
            publish_timeout_s=publish_timeout_s,
            close_timeout_s=close_timeout_s,
            reconnect=reconnect,
        )
        async with open_service_nursery() as nursery:
            channel = Channel(
                self.endpoint, self._opener, settings,
                consuming_stopped=lambda: self._stopped_consuming,
            )
            self._channels.append(channel)
            nursery.start_soon(channel._serve)
            try:
                await channel._wait_opened()
                try:
                    yield channel
                except BaseException:
                    channel.abort()
                    raise
                await channel.aclose()
            finally:
                channel.abort()
                self._channels.remove(channel)

    def lock(
        self, name: str, *, ttl_s: float = 30.0, wait_s: float = 0.0, owner: str | None = None
    ) -> AbstractAsyncContextManager[HeldLock]:
        """``async with conn.lock(name, ttl_s=30) as lock:`` - run the block holding
        lock ``name`` (refreshed in the background; the block is cancelled and
        :class:`~client.locks.LockLost` raised if it is lost). ``lock.token`` is its
        fencing token. See :mod:`client.locks`."""
        return hold_lock(
            self.endpoint, self._opener, name, ttl_s=ttl_s, wait_s=wait_s, owner=owner,
            request_timeout_s=self.settings.request_timeout_s,
        )

    async def list_locks(self) -> list[dict[str, Any]]:
        """``GET /locks``: every held (or waited for) lock: owner, token, expiry, waiters."""
        result = await self._call("GET", "/locks")
        return list(result.get("locks", [])) if isinstance(result, dict) else []

    @property
    def schedules(self) -> Schedules:
        """Schedules on the broker: put, get, list, delete, pause, resume
        (:class:`~client.schedules.Schedules`)."""
        return Schedules(self._call)

    def stop_consuming(self) -> None:
        """Stop every consumer of every channel of this connection, and any started
        later (see :meth:`Channel.stop_consuming`). Used by graceful shutdown."""
        self._stopped_consuming = True
        for channel in self._channels:
            channel.stop_consuming()

    async def aclose(self) -> None:
        """Close every open channel at once and the idle REST connections."""
        self._closed = True
        for channel in list(self._channels):
            channel.abort()
        await self._rest.aclose()


@asynccontextmanager
async def connect(
    url: str = DEFAULT_URL,
    *,
    settings: Settings | None = None,
    open_stream: StreamOpener | None = None,
    username: str | None = None,
    password: str | None = None,
    token: str | None = None,
    ca_file: str | os.PathLike[str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    **overrides: Any,
) -> AsyncIterator[Connection]:
    """Connect to the broker at ``url`` for the duration of the block.

    Credentials, first found wins: ``username``/``password`` or ``token``; the URL's
    ``user:password@``; the environment (``ACKBUS_TOKEN``, or ``ACKBUS_USERNAME`` and
    ``ACKBUS_PASSWORD``). None: no ``Authorization`` header (a broker without users).
    They are sent on every request and never logged. An ``https`` URL is always
    verified: against the system's CAs, the PEM bundle ``ca_file`` (a private CA),
    or ``ssl_context`` (e.g. with a client certificate for mutual TLS).

    Nothing is opened yet: REST calls open keep-alive connections on demand and
    :meth:`Connection.channel` opens channels. ``settings`` (or keyword overrides of
    its fields, e.g. ``max_pending=500``, ``reconnect=ReconnectPolicy(...)``) tune
    timeouts, the pending buffer and reconnects. ``open_stream`` replaces the TCP
    connector (tests use in-memory streams).

    Raises:
        ValueError: a bad URL or setting, or credentials given twice.
        OSError, ssl.SSLError: ``ca_file`` cannot be read.
    """
    endpoint = Endpoint.parse(url)
    if username is not None or token is not None:
        if endpoint.authorization is not None:
            raise ValueError("credentials given both in the URL and as arguments")
        endpoint = endpoint.with_credentials(username=username, password=password, token=token)
    elif endpoint.authorization is None:
        env_token = os.environ.get("ACKBUS_TOKEN")
        env_user = os.environ.get("ACKBUS_USERNAME")
        if env_token:
            endpoint = endpoint.with_credentials(token=env_token)
        elif env_user:
            endpoint = endpoint.with_credentials(username=env_user, password=os.environ.get("ACKBUS_PASSWORD", ""))
    if ca_file is not None and ssl_context is not None:
        raise ValueError("give ca_file or ssl_context, not both")
    if ca_file is not None:
        ssl_context = ssl.create_default_context(cafile=os.fspath(ca_file))
    if ssl_context is not None:
        endpoint = _with_ssl_context(endpoint, ssl_context)
    settings = (settings or Settings()).replace(**overrides)
    conn = Connection(endpoint, settings, open_stream or open_tcp)
    try:
        yield conn
    finally:
        await conn.aclose()


def _with_ssl_context(endpoint: Endpoint, context: ssl.SSLContext) -> Endpoint:
    if context.verify_mode != ssl.CERT_REQUIRED or not context.check_hostname:
        # never silently unverified: a context that does not check is refused
        raise ValueError("ssl_context must verify the broker's certificate and host name")
    return Endpoint(
        endpoint.scheme, endpoint.host, endpoint.port, endpoint.prefix, endpoint.authorization, context
    )
