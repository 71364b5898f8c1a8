"""The ``POST /channel`` exchange: :class:`DuplexExchange`, a full-duplex HTTP/1.1
exchange over its own connection (RFC 9112).

The request body is chunked (§7.1) and written by one task while another reads the
chunked response, which the broker starts before the request body ends. h11 writes
the request head and reads the response head; the chunked bodies are then framed by
:mod:`client.chunked`, which costs a fraction of h11's per-event overhead on this
latency-critical path (a response that is not chunked is still read through h11). One
exchange per TCP connection, never reused. A lone op may leave without a schedule
point by a direct ``write(2)`` (:meth:`DuplexExchange.write_nowait`, plain TCP under
trio only).

Network failures surface as :class:`~client.errors.ConnectionLost` with the cause
chained; a non-2xx answer to the channel request as
:class:`~client.errors.BrokerRequestError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import anyio
import anyio.abc
import h11

from ._backend import running_trio
from .chunked import ChunkedDecoder, encode_chunk
from .diagnosis import network_error_text, tls_refused
from .endpoint import Endpoint
from .errors import ConnectionLost
from .transport import (
    MAX_RESPONSE_BYTES,
    NETWORK_ERRORS,
    RECEIVE_BYTES,
    USER_AGENT,
    Response,
    aclose_quietly,
    error_from_response,
    receive_some,
)

__all__ = ["DuplexExchange"]


def _is_chunked(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """The response body is chunked (h11 has checked that a ``Transfer-Encoding``
    of a response it accepted is exactly ``chunked``)."""
    return any(name == b"transfer-encoding" for name, _ in headers)


class DuplexExchange:
    """A full-duplex HTTP/1.1 exchange: chunked request body out, chunked response in.

    Exactly one task may call :meth:`send`/:meth:`end` and one task
    :meth:`receive_some` at a time (byte streams allow one sender and one receiver
    concurrently).
    """

    def __init__(self, stream: anyio.abc.ByteStream, conn: h11.Connection) -> None:
        self._stream = stream
        self._h11 = conn
        # The socket :meth:`write_nowait` writes to: only a plain TCP stream has one
        # (a TLS stream must encrypt, a test's memory stream has no descriptor), only
        # on POSIX, where a socket is a file descriptor that write(2) takes, and only
        # under trio, whose socket stream sends straight to the socket: asyncio's
        # transport keeps a write buffer of its own that a direct write would overtake.
        self._socket = (
            stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
            if isinstance(stream, anyio.abc.SocketStream) and os.name == "posix" and running_trio()
            else None
        )
        # Set once a chunked 200 response head was read: the body is decoded here,
        # starting with the bytes h11 had received past the head.
        self._body: ChunkedDecoder | None = None
        self._pending = b""

    @classmethod
    async def open(
        cls,
        stream: anyio.abc.ByteStream,
        endpoint: Endpoint,
        target: str,
        *,
        method: str = "POST",
        headers: Iterable[tuple[str, str]] = (),
    ) -> DuplexExchange:
        """Send the request head on ``stream`` and wait for the response head.

        On success the exchange owns ``stream``; on failure ``stream`` is closed.

        Raises:
            BrokerRequestError: the answer is not 200 (its body is read and parsed).
            ConnectionLost: the connection broke first.
        """
        conn = h11.Connection(h11.CLIENT)
        self = cls(stream, conn)
        ok = False
        try:
            head = [
                ("Host", endpoint.host_header),
                ("User-Agent", USER_AGENT),
                ("Transfer-Encoding", "chunked"),
                *headers,
            ]
            if endpoint.authorization is not None:
                head.append(("Authorization", endpoint.authorization))
            try:
                await self._send_event(h11.Request(method=method, target=target, headers=head))
                while True:
                    event = await self._next_event()
                    if isinstance(event, h11.InformationalResponse):
                        continue  # 100 Continue
                    if isinstance(event, h11.Response):
                        break
                    raise ConnectionLost(f"the connection closed before the response ({type(event).__name__})")
            except ConnectionLost as exc:
                refused = tls_refused(stream, str(endpoint), exc.__cause__ or exc)
                if refused is not None:
                    raise refused from exc
                raise
            if event.status_code != 200:
                body = await self._read_rest()
                raise error_from_response(Response(event.status_code, list(event.headers), body))
            if _is_chunked(event.headers):
                self._body = ChunkedDecoder()
                self._pending = self._h11.trailing_data[0]
            ok = True
            return self
        finally:
            if not ok:
                await aclose_quietly(stream)

    async def _read_rest(self) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while size < MAX_RESPONSE_BYTES:
            data = await self.receive_some()
            if not data:
                break
            size += len(data)
            chunks.append(data)
        return b"".join(chunks)

    async def _send_event(self, event: Any) -> None:
        try:
            data = self._h11.send(event)
            if data:
                await self._stream.send(data)
        except NETWORK_ERRORS as exc:
            raise ConnectionLost(f"channel connection broke while sending: {network_error_text(exc)}") from exc

    async def _next_event(self) -> Any:
        try:
            while True:
                event = self._h11.next_event()
                if event is not h11.NEED_DATA:
                    return event
                self._h11.receive_data(await receive_some(self._stream, RECEIVE_BYTES))
        except NETWORK_ERRORS as exc:
            raise ConnectionLost(f"channel connection broke while receiving: {network_error_text(exc)}") from exc

    async def send(self, data: bytes) -> None:
        """Send ``data`` as one chunk of the request body.

        Raises:
            ConnectionLost: the connection broke.
        """
        if data:
            # h11 frames only the head and the last chunk: its state does not count
            # the chunks of a chunked body, so framing them here keeps it consistent.
            try:
                await self._stream.send(encode_chunk(data))
            except NETWORK_ERRORS as exc:
                raise ConnectionLost(f"channel connection broke while sending: {network_error_text(exc)}") from exc

    @property
    def can_write_nowait(self) -> bool:
        """:meth:`write_nowait` can write (the stream is a plain TCP socket)."""
        return self._socket is not None

    def write_nowait(self, data: bytes) -> bytes:
        """Frame ``data`` as one chunk and write what the socket takes right now,
        without waiting and without a schedule point; return the framed bytes it did
        not take (usually none), which must go out with :meth:`send_framed` before
        anything else. Only when :attr:`can_write_nowait`, and only while no
        :meth:`send` is in progress (the caller keeps one writer at a time).

        This is how a lone op leaves in its producer's own step: handing it to a
        writer task costs a pass of trio's run loop, and the tasks woken with the
        writer (a confirm being read, say) may run before it. The socket is already
        non-blocking (trio made it so); a plain ``write(2)`` on it is what trio's own
        send does, minus the schedule point.

        Raises:
            ConnectionLost: the connection broke (or was closed).
        """
        assert self._socket is not None, "write_nowait needs a plain TCP stream"
        framed = encode_chunk(data)
        try:
            # fileno() is -1 once the socket is closed: EBADF, never another file.
            written = os.write(self._socket.fileno(), framed)
        except BlockingIOError:
            return framed
        except OSError as exc:
            raise ConnectionLost(f"channel connection broke while sending: {network_error_text(exc)}") from exc
        return framed[written:]

    async def send_framed(self, framed: bytes) -> None:
        """Send bytes already framed (what :meth:`write_nowait` left over).

        Raises:
            ConnectionLost: the connection broke.
        """
        try:
            await self._stream.send(framed)
        except NETWORK_ERRORS as exc:
            raise ConnectionLost(f"channel connection broke while sending: {network_error_text(exc)}") from exc

    async def end(self) -> None:
        """End the request body (the response may go on).

        Raises:
            ConnectionLost: the connection broke.
        """
        if self._h11.our_state is h11.SEND_BODY:
            await self._send_event(h11.EndOfMessage())

    async def receive_some(self) -> bytes:
        """The next bytes of the response body; ``b""`` once the response has ended.

        Raises:
            ConnectionLost: the connection broke, or the response was cut short.
            ProtocolError: the chunked framing of the response is malformed.
        """
        body = self._body
        if body is not None:
            while not body.done:
                data, self._pending = self._pending, b""
                if not data:
                    try:
                        data = await receive_some(self._stream, RECEIVE_BYTES)
                    except NETWORK_ERRORS as exc:
                        raise ConnectionLost(
                            f"channel connection broke while receiving: {network_error_text(exc)}"
                        ) from exc
                    if not data:
                        raise ConnectionLost("channel connection closed inside the response body")
                payload = body.feed(data)
                if payload:
                    return payload
            return b""
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Data):
                if event.data:
                    return bytes(event.data)
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return b""
            elif event is h11.PAUSED:
                return b""

    async def aclose(self) -> None:
        """Close the connection at once."""
        await aclose_quietly(self._stream)

