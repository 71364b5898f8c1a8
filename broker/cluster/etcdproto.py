"""etcd's JSON gateway, sans IO: the requests as (path, body) pairs and the answers as
typed values.

etcd 3.4 serves its gRPC API as JSON under ``/v3/...`` (grpc-gateway): keys and values
are base64, 64-bit numbers arrive as strings, fields at their zero value are left out
(a txn that failed has no ``succeeded``; a lease keepalive for a lease that is gone
has no ``TTL``). Everything here is a pure function of bytes and values, so the
encoding and every answer's shape are tested without a server; ``broker.cluster.etcd``
does the IO.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

__all__ = [
    "CompareCreate",
    "CompareMod",
    "CompareValue",
    "EtcdError",
    "EtcdUnavailable",
    "KeyValue",
    "OpDelete",
    "OpGet",
    "OpPut",
    "TxnResult",
    "WatchBatch",
    "b64",
    "decode_json_line",
    "parse_error",
    "parse_keepalive",
    "parse_kvs",
    "parse_txn",
    "parse_watch",
    "prefix_end",
    "range_body",
    "txn_body",
    "unb64",
]

#: gRPC status codes that mean "not now, try elsewhere or later", not "you asked wrong".
_UNAVAILABLE_CODES: Final = frozenset({4, 8, 14})  # DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAVAILABLE


class EtcdError(Exception):
    """etcd refused a request (a malformed one, a lease that does not exist)."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class EtcdUnavailable(EtcdError):
    """No etcd endpoint answered (refused, timed out, or said it is unavailable). The
    message names every endpoint tried and what happened there."""


def b64(data: bytes | str) -> str:
    """``data`` (UTF-8 when text) as the gateway's base64."""
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``
    (the prefix with its last byte below 0xff incremented)."""
    raw = bytearray(prefix)
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"  # every key


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd holds it. ``create_revision`` 0 never appears here: an absent key
    is simply not returned."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    def json(self) -> Any:
        return orjson.loads(self.value)


def _kv(obj: dict[str, Any]) -> KeyValue:
    return KeyValue(
        unb64(obj.get("key")),
        unb64(obj.get("value")),
        _int(obj.get("create_revision")),
        _int(obj.get("mod_revision")),
        _int(obj.get("version")),
        _int(obj.get("lease")),
    )


def header_revision(answer: dict[str, Any]) -> int:
    return _int((answer.get("header") or {}).get("revision"))


def range_body(key: bytes, *, prefix: bool = False, revision: int = 0) -> dict[str, Any]:
    """The body of ``/v3/kv/range`` (and of a txn's ``request_range``)."""
    body: dict[str, Any] = {"key": b64(key)}
    if prefix:
        body["range_end"] = b64(prefix_end(key))
    if revision:
        body["revision"] = str(revision)
    return body


def parse_kvs(answer: dict[str, Any]) -> tuple[int, list[KeyValue]]:
    """A range answer: the store's revision and the keys found."""
    return header_revision(answer), [_kv(obj) for obj in answer.get("kvs") or ()]


# ----------------------------------------------------------------------------- txn


@dataclass(frozen=True)
class CompareCreate:
    """``create_revision(key) == revision`` (0: the key is absent)."""

    key: bytes
    revision: int = 0

    def body(self) -> dict[str, Any]:
        return {"key": b64(self.key), "target": "CREATE", "result": "EQUAL", "create_revision": str(self.revision)}


@dataclass(frozen=True)
class CompareMod:
    """``mod_revision(key) == revision``: nobody changed the key since it was read."""

    key: bytes
    revision: int

    def body(self) -> dict[str, Any]:
        return {"key": b64(self.key), "target": "MOD", "result": "EQUAL", "mod_revision": str(self.revision)}


@dataclass(frozen=True)
class CompareValue:
    """``value(key) == value``."""

    key: bytes
    value: bytes

    def body(self) -> dict[str, Any]:
        return {"key": b64(self.key), "target": "VALUE", "result": "EQUAL", "value": b64(self.value)}


@dataclass(frozen=True)
class OpPut:
    key: bytes
    value: bytes
    lease: int = 0

    def body(self) -> dict[str, Any]:
        put: dict[str, Any] = {"key": b64(self.key), "value": b64(self.value)}
        if self.lease:
            put["lease"] = str(self.lease)
        return {"request_put": put}


@dataclass(frozen=True)
class OpGet:
    key: bytes
    prefix: bool = False

    def body(self) -> dict[str, Any]:
        return {"request_range": range_body(self.key, prefix=self.prefix)}


@dataclass(frozen=True)
class OpDelete:
    key: bytes
    prefix: bool = False

    def body(self) -> dict[str, Any]:
        request: dict[str, Any] = {"key": b64(self.key)}
        if self.prefix:
            request["range_end"] = b64(prefix_end(self.key))
        return {"request_delete_range": request}


Compare = CompareCreate | CompareMod | CompareValue
Op = OpPut | OpGet | OpDelete


def txn_body(compare: list[Compare], success: list[Op], failure: list[Op]) -> dict[str, Any]:
    return {
        "compare": [c.body() for c in compare],
        "success": [op.body() for op in success],
        "failure": [op.body() for op in failure],
    }


@dataclass(frozen=True)
class TxnResult:
    """Whether every compare held, the revision after the txn, and the keys each
    ``OpGet`` of the branch taken returned (one list per op, in order; an empty list
    for a put or delete)."""

    succeeded: bool
    revision: int
    ranges: list[list[KeyValue]] = field(default_factory=list)


def parse_txn(answer: dict[str, Any]) -> TxnResult:
    ranges = []
    for response in answer.get("responses") or ():
        found = response.get("response_range")
        ranges.append([_kv(obj) for obj in (found or {}).get("kvs") or ()])
    return TxnResult(bool(answer.get("succeeded")), header_revision(answer), ranges)


# ---------------------------------------------------------------------- leases, watch


def parse_keepalive(answer: dict[str, Any]) -> int:
    """The TTL a keepalive renewed the lease for; 0 when the lease no longer exists
    (etcd answers such a keepalive without a TTL rather than with an error)."""
    result = answer.get("result", answer)
    return _int(result.get("TTL"))


@dataclass(frozen=True)
class WatchEvent:
    """A put (``deleted`` False) or delete of one key, at ``kv.mod_revision``."""

    deleted: bool
    kv: KeyValue


@dataclass(frozen=True)
class WatchBatch:
    """One message of a watch stream. ``compacted`` (nonzero): the revision asked for
    is gone, the watch was cancelled, and the watcher must read afresh."""

    revision: int
    events: list[WatchEvent]
    created: bool = False
    canceled: bool = False
    compacted: int = 0
    reason: str = ""


def parse_watch(message: dict[str, Any]) -> WatchBatch:
    """One JSON object of ``/v3/watch``'s stream. Raises EtcdError for an error
    object (the gateway's ``{"error": ...}``)."""
    if "error" in message:
        raise parse_error(message)
    result = message.get("result") or {}
    events = [WatchEvent(e.get("type") == "DELETE", _kv(e.get("kv") or {})) for e in result.get("events") or ()]
    return WatchBatch(
        header_revision(result),
        events,
        created=bool(result.get("created")),
        canceled=bool(result.get("canceled")),
        compacted=_int(result.get("compact_revision")),
        reason=str(result.get("cancel_reason") or ""),
    )


def parse_error(answer: Any) -> EtcdError:
    """The exception an error answer (``{"error","message","code"}``) means."""
    if not isinstance(answer, dict):
        return EtcdError(f"unexpected answer from etcd: {answer!r:.200}")
    error = answer.get("error")
    message = error.get("message") if isinstance(error, dict) else answer.get("message") or error
    code = error.get("http_code") if isinstance(error, dict) else answer.get("code")
    code = int(code) if isinstance(code, (int, str)) and str(code).isdigit() else None
    text = f"etcd: {message}"
    if code in _UNAVAILABLE_CODES:
        return EtcdUnavailable(text, code=code)
    return EtcdError(text, code=code)


def decode_json_line(line: bytes) -> dict[str, Any]:
    """One object of a gateway answer. Raises EtcdError when it is not a JSON object."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise EtcdError(f"etcd sent malformed JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise EtcdError(f"etcd sent {type(obj).__name__}, not an object")
    return obj
