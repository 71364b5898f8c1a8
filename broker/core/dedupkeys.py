"""Keys of the publish deduplication window, and its checkpoint payloads' layout.

:func:`digest` is the 64-bit key of a ``message_id`` on an exchange (see
``dedup.py`` for why BLAKE2b and 64 bits). :func:`encode_payloads` and
:func:`decode_payload` are the ``DEDUP_DIGESTS`` record's bytes, little-endian::

    count u32 | rest u32 | count x digest u64 | count x wall_ms u64

where ``rest`` counts the entries of this payload and of the payloads after it, so that
recovery sizes the table once.
"""

from __future__ import annotations

import struct
import sys
from array import array
from hashlib import blake2b

__all__ = ["decode_payload", "digest", "digest_utf8", "encode_payloads"]

# DEDUP_DIGESTS payload header: count u32 | rest u32
_HEAD = struct.Struct("<II")
_SWAP = sys.byteorder != "little"

# exchange -> BLAKE2b state after ``exchange + "\0"``: copying it is cheaper than hashing
# the exchange name again (about a third of the cost of a digest)
_PREFIXES: dict[str | bytes, blake2b] = {}
_PREFIXES_MAX = 256
_read_u64 = struct.Struct("<Q").unpack


def _prefix(exchange: str | bytes) -> blake2b:
    """The cached state for ``exchange`` (a name, or its UTF-8), made on a miss."""
    if len(_PREFIXES) >= _PREFIXES_MAX:
        _PREFIXES.clear()
    utf8 = exchange.encode() if isinstance(exchange, str) else exchange
    state = _PREFIXES[exchange] = blake2b(utf8 + b"\0", digest_size=8)
    return state


def digest(exchange: str, message_id: str) -> int:
    """The 64-bit key of ``message_id`` on ``exchange``: BLAKE2b (8-byte digest) of
    ``UTF-8(exchange) + b"\\0" + UTF-8(message_id)`` read little-endian, 0 and 1 moved to
    2 and 3. Stable across processes and versions: it is written to checkpoints.

    Raises UnicodeEncodeError for a string that is not valid Unicode (lone surrogates).
    """
    h = (_PREFIXES.get(exchange) or _prefix(exchange)).copy()
    h.update(message_id.encode())
    d: int = _read_u64(h.digest())[0]  # (faster than int.from_bytes(..., "little"))
    return d if d > 1 else d + 2


def digest_utf8(exchange: bytes, message_id: bytes) -> int:
    """:func:`digest` of an exchange name and message id given as their UTF-8 bytes (as
    ENQUEUE records hold them): recovery hashes a million without decoding them."""
    h = (_PREFIXES.get(exchange) or _prefix(exchange)).copy()
    h.update(message_id)
    d: int = _read_u64(h.digest())[0]
    return d if d > 1 else d + 2



def encode_payloads(digests: array[int], times: array[int], max_entries: int) -> list[bytes]:
    """``digests`` and their ``times`` (ms), oldest first, as payloads of at most
    ``max_entries`` entries each (consumes both arrays). Empty for no entries.

    Raises ValueError if ``max_entries < 1``."""
    if max_entries < 1:
        raise ValueError("max_entries must be at least 1")
    if _SWAP:
        digests.byteswap()
        times.byteswap()
    total = len(digests)
    payloads = []
    for start in range(0, total, max_entries):
        end = start + max_entries
        part = digests[start:end]
        payloads.append(_HEAD.pack(len(part), total - start) + part.tobytes() + times[start:end].tobytes())
    return payloads


def decode_payload(payload: bytes, max_ms: int) -> tuple[array[int], array[int], int]:
    """``(digests, times, rest)`` of one payload.

    Raises ValueError for a malformed payload: its length does not match its count, or
    it holds a reserved digest (0 or 1) or a time above ``max_ms``."""
    if len(payload) < _HEAD.size:
        raise ValueError(f"DEDUP_DIGESTS payload of {len(payload)} bytes is shorter than its header")
    n, rest = _HEAD.unpack_from(payload)
    if len(payload) != _HEAD.size + 16 * n:
        raise ValueError(f"DEDUP_DIGESTS payload of {len(payload)} bytes does not hold {n} entries")
    digests: array[int] = array("Q")
    times: array[int] = array("Q")
    if not n:
        return digests, times, rest
    digests.frombytes(payload[_HEAD.size : _HEAD.size + 8 * n])
    times.frombytes(payload[_HEAD.size + 8 * n :])
    if _SWAP:
        digests.byteswap()
        times.byteswap()
    if min(digests) < 2 or max(times) > max_ms:
        raise ValueError("DEDUP_DIGESTS payload holds a reserved digest or a time beyond 44 bits")
    return digests, times, rest
