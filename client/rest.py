"""The broker's REST API (docs/http-api.md) as typed async methods.

One-shot administration and polling: declare, bind, delete, stats, and the lease-based
``get``. Declarations made here are *not* replayed after reconnects (that is what the
channel's declare methods are for); they are plain idempotent calls.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from .codec import Properties, decode_body
from .consumer import Death, parse_death
from .errors import ProtocolError
from .transport import Response, RestClient, error_from_response

__all__ = ["BrokerAPI", "QueueInfo", "LeasedMessage"]


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _exchange_path(name: str) -> str:
    return "/exchanges/" + _quote(name or "amq.default")


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """Statistics of one queue, from ``GET /queues``. ``raw`` holds every field the
    broker sent, including ones this client does not know."""

    name: str
    durable: bool
    messages_ready: int
    messages_unacked: int
    consumers: int
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def messages(self) -> int:
        return self.messages_ready + self.messages_unacked

    @classmethod
    def from_json(cls, obj: Any) -> QueueInfo:
        """Raises: ProtocolError."""
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ProtocolError(f"not a queue description: {obj!r}")

        def count(key: str) -> int:
            value = obj.get(key, 0)
            return value if isinstance(value, int) else 0

        return cls(
            name=obj["name"],
            durable=bool(obj.get("durable", True)),
            messages_ready=count("messages_ready"),
            messages_unacked=count("messages_unacked"),
            consumers=count("consumers"),
            raw=obj,
        )


@dataclass(slots=True)
class LeasedMessage:
    """A message fetched with :meth:`BrokerAPI.get`, held under a lease until acked,
    nacked, or the lease expires (then it returns to the queue)."""

    api: BrokerAPI = field(repr=False)
    queue: str
    lease_id: str
    body: bytes
    properties: Properties
    exchange: str
    routing_key: str
    redelivered: bool
    delivery_count: int = 0

    @property
    def death(self) -> list[Death]:
        """Its dead-letter history (``x-death``), newest first."""
        return parse_death(self.properties.headers)

    async def ack(self) -> None:
        """Raises: BrokerRequestError (e.g. the lease expired), ConnectionLost."""
        await self.api.ack_leases(self.queue, [self.lease_id])

    async def nack(self, *, requeue: bool = True, delay_s: float | None = None) -> None:
        """Back to the queue (after ``delay_s``), or dead-lettered without ``requeue``.
        Raises: BrokerRequestError, ConnectionLost."""
        await self.api.nack_leases(self.queue, [self.lease_id], requeue=requeue, delay_s=delay_s)


class BrokerAPI:
    """REST calls over ``rest``; the base of :class:`~client.connection.Connection`.

    Every method raises :class:`~client.errors.BrokerRequestError` on a non-2xx answer,
    :class:`~client.errors.ConnectionLost` when the broker cannot be reached, and
    :class:`~client.errors.ProtocolError` on an answer it cannot parse.
    """

    def __init__(self, rest: RestClient) -> None:
        self._rest = rest

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        query: Mapping[str, Any] | None = None,
        body: bytes = b"",
        headers: Sequence[tuple[str, str]] = (),
    ) -> Any:
        if json is not None:
            body = orjson.dumps(json)
            headers = [*headers, ("Content-Type", "application/json")]
        response: Response = await self._rest.request(
            method, path, query=query, body=body, headers=headers
        )
        if not 200 <= response.status < 300:
            raise error_from_response(response)
        return response.json()

    async def healthy(self) -> bool:
        """``GET /healthz`` answered 200 (the broker is up and recovered).

        Raises: ConnectionLost.
        """
        response = await self._rest.request("GET", "/healthz")
        return response.status == 200

    async def overview(self) -> dict[str, Any]:
        """``GET /overview``: version, uptime, totals."""
        result = await self._call("GET", "/overview")
        return result if isinstance(result, dict) else {}

    async def cluster(self) -> dict[str, Any]:
        """``GET /cluster``: the nodes, etcd's health, this node's view
        (``{"enabled": false}`` on a single node)."""
        result = await self._call("GET", "/cluster")
        return result if isinstance(result, dict) else {}

    async def queue_replication(self, name: str) -> dict[str, Any] | None:
        """A quorum queue's ``replication`` of ``GET /queues/{name}`` in a cluster: its
        replicas, leader, in-sync set and lags (None: not a quorum queue)."""
        result = await self._call("GET", f"/queues/{_quote(name)}")
        found = result.get("replication") if isinstance(result, dict) else None
        return found if isinstance(found, dict) else None

    async def change_replicas(self, queue: str, *, add: str | None = None, remove: str | None = None) -> dict[str, Any]:
        """``POST /queues/{queue}/replicas``: add node ``add`` to, or remove node
        ``remove`` from, a quorum queue's replicas (exactly one); the new replica and
        in-sync sets."""
        if (add is None) == (remove is None):
            raise ValueError("give exactly one of add and remove")
        body = {"add": add} if add is not None else {"remove": remove}
        result = await self._call("POST", f"/queues/{_quote(queue)}/replicas", json=body)
        return result if isinstance(result, dict) else {}

    async def declare_exchange(
        self,
        name: str,
        type: str = "direct",
        *,
        durable: bool = True,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """``PUT /exchanges/{name}``: idempotent if equal, error if different."""
        await self._call("PUT", _exchange_path(name), json={
            "type": type, "durable": durable, "auto_delete": auto_delete,
            "arguments": dict(arguments or {}),
        })

    async def delete_exchange(self, name: str) -> None:
        await self._call("DELETE", _exchange_path(name))

    async def list_exchanges(self) -> list[dict[str, Any]]:
        result = await self._call("GET", "/exchanges")
        return _list_field(result, "exchanges")

    async def declare_queue(
        self,
        name: str,
        *,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """``PUT /queues/{name}``."""
        await self._call("PUT", "/queues/" + _quote(name), json={
            "durable": durable, "exclusive": exclusive, "auto_delete": auto_delete,
            "arguments": dict(arguments or {}),
        })

    async def delete_queue(self, name: str) -> None:
        await self._call("DELETE", "/queues/" + _quote(name))

    async def purge_queue(self, name: str) -> int:
        """Remove the ready messages; return how many (when the broker says)."""
        result = await self._call("POST", f"/queues/{_quote(name)}/purge")
        if isinstance(result, dict):
            for key in ("purged", "messages"):
                if isinstance(result.get(key), int):
                    return int(result[key])
        return 0

    async def list_queues(self) -> list[QueueInfo]:
        """``GET /queues``, sorted by name."""
        result = await self._call("GET", "/queues")
        queues = [QueueInfo.from_json(q) for q in _list_field(result, "queues")]
        return sorted(queues, key=lambda q: q.name)

    async def queue_info(self, name: str) -> QueueInfo:
        """``GET /queues/{name}``."""
        result = await self._call("GET", "/queues/" + _quote(name))
        if isinstance(result, dict) and isinstance(result.get("queue"), dict):
            result = result["queue"]
        return QueueInfo.from_json(result)

    async def bind(
        self,
        exchange: str,
        queue: str | None = None,
        *,
        to_exchange: str | None = None,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """``POST /bindings``: bind ``queue`` (or exchange ``to_exchange``) to
        ``exchange``."""
        await self._call("POST", "/bindings", json=_binding(exchange, queue, to_exchange, routing_key, arguments))

    async def unbind(
        self,
        exchange: str,
        queue: str | None = None,
        *,
        to_exchange: str | None = None,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """``DELETE /bindings``."""
        await self._call("DELETE", "/bindings", json=_binding(exchange, queue, to_exchange, routing_key, arguments))

    async def list_bindings(self) -> list[dict[str, Any]]:
        result = await self._call("GET", "/bindings")
        return _list_field(result, "bindings")

    async def list_channels(self) -> list[dict[str, Any]]:
        """``GET /channels``: the open channels and streaming consumes (id, kind,
        remote, user_agent, published, unacked, consumers, ...)."""
        result = await self._call("GET", "/channels")
        return _list_field(result, "channels")

    async def close_channel(self, channel_id: int, reason: str | None = None) -> dict[str, Any]:
        """``DELETE /channels/{id}``: close another client's channel or stream, as an
        operator (its unacked deliveries go back; its client is told why)."""
        result = await self._call(
            "DELETE", f"/channels/{int(channel_id)}", json={"reason": reason} if reason else None
        )
        return result if isinstance(result, dict) else {}

    async def get(
        self,
        queue: str,
        *,
        max_messages: int = 1,
        wait_s: float = 0,
        lease_s: float = 30,
    ) -> list[LeasedMessage]:
        """``POST /queues/{name}/get``: up to ``max_messages``, waiting up to ``wait_s``
        for the first (a long poll, not a busy loop), each leased for ``lease_s``."""
        query = {"max": max_messages, "wait": _num(wait_s), "lease": _num(lease_s)}
        result = await self._call("POST", f"/queues/{_quote(queue)}/get", query=query)
        return self._leased(result, queue)

    async def get_any(
        self,
        queues: Sequence[str],
        *,
        max_messages: int = 1,
        wait_s: float = 0,
        lease_s: float = 30,
        weights: Sequence[int] | None = None,
    ) -> list[LeasedMessage]:
        """``POST /get``: up to ``max_messages`` from the first of ``queues`` (in order
        of preference) that has any — or, with ``weights``, from those that have any
        in proportion to their weights — waiting up to ``wait_s`` on all of them at
        once; each message's ``queue`` says which."""
        body: dict[str, Any] = {"queues": list(queues), "max": max_messages, "wait": _num(wait_s), "lease": _num(lease_s)}
        if weights is not None:
            body["weights"] = list(weights)
        result = await self._call("POST", "/get", json=body)
        return self._leased(result, None)

    def _leased(self, result: Any, queue: str | None) -> list[LeasedMessage]:
        messages = []
        for obj in _list_field(result, "messages"):
            lease_id = obj.get("lease_id")
            if not isinstance(lease_id, str):
                raise ProtocolError(f"leased message without a lease_id: {obj!r}")
            messages.append(LeasedMessage(
                api=self,
                queue=queue if queue is not None else str(obj.get("queue", "")),
                lease_id=lease_id,
                body=decode_body(obj),
                properties=Properties.from_json(obj.get("properties")),
                exchange=str(obj.get("exchange", "")),
                routing_key=str(obj.get("routing_key", "")),
                redelivered=bool(obj.get("redelivered", False)),
                delivery_count=int(obj.get("delivery_count", 0) or 0),
            ))
        return messages

    async def ack_leases(self, queue: str, lease_ids: Sequence[str]) -> None:
        await self._call("POST", f"/queues/{_quote(queue)}/ack", json={"lease_ids": list(lease_ids)})

    async def nack_leases(
        self, queue: str, lease_ids: Sequence[str], *, requeue: bool = True, delay_s: float | None = None
    ) -> None:
        body: dict[str, Any] = {"lease_ids": list(lease_ids), "requeue": requeue}
        if delay_s is not None:
            body["delay_s"] = _num(delay_s)
        await self._call("POST", f"/queues/{_quote(queue)}/nack", json=body)

    async def browse(self, queue: str, *, limit: int = 100, after: int = 0) -> dict[str, Any]:
        """Look at a queue's messages without consuming them (oldest first, from the
        sequence number ``after``): ``{"messages": [...], "next_after": n}``."""
        reply = await self._call(
            "GET", f"/queues/{_quote(queue)}/messages", query={"limit": int(limit), "after": int(after)}
        )
        return dict(reply)

    async def redrive(
        self, queue: str, *, count: int = 100_000, exchange: str | None = None, routing_key: str | None = None
    ) -> dict[str, Any]:
        """Move up to ``count`` messages out of a dead-letter queue: back to the queue
        each came from, or to ``exchange`` (with ``routing_key``). ``{"moved": n}``,
        with ``"stopped"`` saying why when it stopped early."""
        body: dict[str, Any] = {"count": count}
        if exchange is not None:
            body["exchange"] = exchange
        if routing_key is not None:
            body["routing_key"] = routing_key
        reply = await self._call("POST", f"/queues/{_quote(queue)}/redrive", json=body)
        return dict(reply)

    async def extend_leases(self, queue: str, lease_ids: Sequence[str], *, lease_s: float) -> None:
        await self._call("POST", f"/queues/{_quote(queue)}/extend",
                         json={"lease_ids": list(lease_ids), "lease": _num(lease_s)})


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _binding(
    exchange: str,
    queue: str | None,
    to_exchange: str | None,
    routing_key: str,
    arguments: Mapping[str, Any] | None,
) -> dict[str, Any]:
    if (queue is None) == (to_exchange is None):
        raise ValueError("give exactly one of queue and to_exchange")
    body: dict[str, Any] = {"exchange": exchange, "routing_key": routing_key,
                            "arguments": dict(arguments or {})}
    if queue is not None:
        body["queue"] = queue
    else:
        body["to_exchange"] = to_exchange
    return body


def _list_field(result: Any, key: str) -> list[dict[str, Any]]:
    if isinstance(result, dict):
        result = result.get(key)
    if not isinstance(result, list) or not all(isinstance(x, dict) for x in result):
        raise ProtocolError(f"expected a list of {key}")
    return result
