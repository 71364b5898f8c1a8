"""The chunked transfer coding of a channel's body (RFC 9112 §7.1), both directions.

Pure: bytes in, bytes out. h11 writes the request head and reads the response head of
the ``POST /channel`` exchange; :class:`~client.duplex.DuplexExchange` then frames
the request body's chunks with :func:`encode_chunk` and decodes a chunked response
body with :class:`ChunkedDecoder`, because h11's general event machinery was the
largest single cost of receiving a confirm: 9 µs per one-line chunk in a tight loop
against 1.7 µs here, and in the client's receive path (traced one-at-a-time
publishes, caches cold after each wait) 25 µs from the socket read to the chunk's
payload against 7.

Rules of :class:`ChunkedDecoder`:

- ``chunk = chunk-size [ chunk-ext ] CRLF chunk-data CRLF``; the body ends with a
  zero-size chunk and an optional trailer section, then an empty line. Chunk
  extensions and trailer fields are read and ignored (§7.1.1, §7.1.2).
- A line (size line or trailer field) may end in a bare LF (§2.2 allows a recipient
  to accept it); the CRLF after chunk data must be exactly CRLF, as h11 requires.
- Size lines and trailer sections are bounded (``MAX_LINE_BYTES``,
  ``MAX_TRAILER_BYTES``) before they are buffered, so a broken peer cannot make the
  client buffer without bound; chunk data is passed on as it arrives, never buffered.
- Anything malformed raises :class:`~client.errors.ProtocolError`.
"""

from __future__ import annotations

from .errors import ProtocolError

__all__ = ["ChunkedDecoder", "encode_chunk", "LAST_CHUNK", "MAX_LINE_BYTES", "MAX_TRAILER_BYTES"]

#: A chunk-size line with its extensions; h11 allows 16 KiB for a whole incomplete event.
MAX_LINE_BYTES = 16 * 1024
#: The trailer section after the last chunk.
MAX_TRAILER_BYTES = 64 * 1024
#: The end of a chunked body: the zero-size chunk and an empty trailer section.
LAST_CHUNK = b"0\r\n\r\n"

_HEX = frozenset(b"0123456789abcdefABCDEF")

# Decoder states.
_SIZE = 0  # reading a chunk-size line
_DATA = 1  # inside chunk data, ``_remaining`` bytes to go
_DATA_END = 2  # expecting the CRLF after chunk data
_TRAILER = 3  # reading trailer lines after the last chunk
_DONE = 4


def encode_chunk(data: bytes) -> bytes:
    """``data`` as one chunk (empty ``data`` would end the body, so it is refused).

    Raises:
        ValueError: ``data`` is empty.
    """
    if not data:
        raise ValueError("an empty chunk would end the body")
    return b"%x\r\n%b\r\n" % (len(data), data)


class ChunkedDecoder:
    """Incremental decoder of a chunked body: :meth:`feed` it the bytes read from the
    connection; it returns the payload they carry. :attr:`done` once the last chunk
    and the trailer section were read; bytes after that are ignored."""

    __slots__ = ("_state", "_remaining", "_buf", "_trailer_bytes")

    def __init__(self) -> None:
        self._state = _SIZE
        self._remaining = 0
        self._buf = b""
        self._trailer_bytes = 0

    @property
    def done(self) -> bool:
        """The whole body was read."""
        return self._state == _DONE

    def feed(self, data: bytes) -> bytes:
        """Add ``data`` read from the connection; return the chunk payload in it
        (``b""`` when it held only framing).

        Raises:
            ProtocolError: the framing is malformed or a line is too long.
        """
        if self._buf:
            data = self._buf + data
            self._buf = b""
        if self._state == _SIZE:
            # The common case on a channel: whole chunks, often exactly one.
            end = data.find(b"\n")
            if end > 0:
                size = self._parse_size(data, end)
                start = end + 1
                stop = start + size
                if size and data[stop:stop + 2] == b"\r\n" and stop + 2 == len(data):
                    return data[start:stop]
                self._state, self._remaining = (_DATA, size) if size else (_TRAILER, 0)
                return self._feed_slow(data, start)
        return self._feed_slow(data, 0)

    def _feed_slow(self, data: bytes, pos: int) -> bytes:
        out: list[bytes] = []
        n = len(data)
        while pos < n:
            state = self._state
            if state == _DATA:
                take = min(self._remaining, n - pos)
                out.append(data[pos:pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _DATA_END
            elif state == _DATA_END:
                if n - pos < 2:
                    if data[pos:] != b"\r":
                        raise ProtocolError("chunk data not followed by CRLF")
                    self._buf = data[pos:]
                    break
                if data[pos:pos + 2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                pos += 2
                self._state = _SIZE
            elif state == _SIZE:
                end = data.find(b"\n", pos)
                if end < 0:
                    self._keep(data, pos, MAX_LINE_BYTES, "chunk-size line")
                    break
                size = self._parse_size(data, end, pos)
                pos = end + 1
                self._state, self._remaining = (_DATA, size) if size else (_TRAILER, 0)
            elif state == _TRAILER:
                end = data.find(b"\n", pos)
                if end < 0:
                    self._keep(data, pos, MAX_TRAILER_BYTES - self._trailer_bytes, "trailer section")
                    break
                self._trailer_bytes += end + 1 - pos
                if self._trailer_bytes > MAX_TRAILER_BYTES:
                    raise ProtocolError(f"trailer section longer than {MAX_TRAILER_BYTES} bytes")
                line = data[pos:end]
                pos = end + 1
                if line in (b"", b"\r"):
                    self._state = _DONE
            else:  # _DONE: the exchange is not reused, what follows is ignored
                break
        return out[0] if len(out) == 1 else b"".join(out)

    def _keep(self, data: bytes, pos: int, limit: int, what: str) -> None:
        if len(data) - pos > limit:
            raise ProtocolError(f"{what} longer than {limit} bytes")
        self._buf = data[pos:]

    @staticmethod
    def _parse_size(data: bytes, end: int, pos: int = 0) -> int:
        """The chunk size on the line ``data[pos:end]`` (``end`` is its LF)."""
        if end - pos > MAX_LINE_BYTES:
            raise ProtocolError(f"chunk-size line longer than {MAX_LINE_BYTES} bytes")
        line = data[pos:end]
        digits = line.split(b";", 1)[0].rstrip(b"\r \t")
        if not digits or len(digits) > 16 or not _HEX.issuperset(digits):
            raise ProtocolError(f"bad chunk-size line {bytes(line[:40])!r}")
        return int(digits, 16)
