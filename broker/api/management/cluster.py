"""The management API in a cluster (``--etcd``): every node answers for the whole
cluster, as RabbitMQ's nodes do (docs/management-api.md, "In a cluster").

Tools that read this API (KEDA's scaler, monitors) ask whichever node their URL
names; a node's core holds only the queues it serves, so its own view would show
another node's queue nowhere, or with a follower replica's counts. Here:

* a call about one queue (``GET /api/queues/%2F/{name}`` and its ``/bindings``, the
  purge ``DELETE .../contents``, ``POST .../get``, and the bindings between an
  exchange and the queue) made on a node that does not serve the queue is relayed to
  the node that does (its owner; a quorum queue's leader) through ackbus's REST relay
  (``broker/api/rest/cluster_relay.py``): the client's credentials with it, the
  answer streamed back, and while that node is down ``503`` in RabbitMQ's error shape;
* a list (``/api/queues``, ``/api/overview``'s queue totals, ``/api/consumers``,
  ``/api/connections``, ``/api/channels`` and their per-object forms,
  ``/api/bindings``, ``/api/nodes``, ``/api/vhosts``' queue numbers) is asked of
  every live member at once, the same path relayed with the cluster's forwarding
  marker (``X-Ackbus-Forwarded``), which makes a member answer its own part only
  (``ownpart.py``); the parts are merged, each queue once, and paging, sorting and
  ``columns`` apply to the merged list. A member that does not answer in time is
  left out: its queues are listed from the cluster's metadata (etcd) with
  ``state: "down"`` and no counts, its node with ``running: false``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import orjson
import trio

from broker.api.management.context import VHOST
from broker.api.management.errors import ObjectNotFound, rabbit_error
from broker.api.management.node import member_node_name
from broker.api.management.paging import listed, shown
from broker.api.rest.cluster_relay import relay_to_owner
from broker.cluster import FORWARDED_HEADER, PeerUnreachable, relay
from broker.http import (
    ClientDisconnected,
    HTTPError,
    Request,
    Response,
    Router,
    split_path,
)

if TYPE_CHECKING:
    from broker.cluster import ClusterNode

__all__ = ["add_cluster_management_routes", "dispatch_management"]

#: The largest part a member may answer (a list of many queues' JSON).
MAX_PART_BYTES: Final = 64 << 20
#: The one vhost in a path.
_VHOST_PATH: Final = "%2F"
#: The state of a queue whose node did not answer (RabbitMQ shows a stopped node's
#: queues so, without counts).
DOWN_STATE: Final = "down"

Handler = Callable[[Request, Response], Awaitable[None]]


def _relayed_queue_name(segments: list[str], method: str) -> str | None:
    """The queue a per-queue management call (path ``segments``) is about; None for
    any other call."""
    if len(segments) < 4 or segments[0] != "api" or segments[2] != VHOST:
        return None
    if segments[1] == "queues" and segments[3]:
        tail = segments[4:]
        if (
            (not tail and method in ("GET", "HEAD"))
            or (tail == ["bindings"] and method in ("GET", "HEAD"))
            or (tail == ["contents"] and method == "DELETE")
            or (tail == ["get"] and method == "POST")
        ):
            return segments[3]
        return None
    # /api/bindings/%2F/e/{exchange}/q/{queue}[/{props}]: listed and deleted where
    # the queue's bindings are
    if segments[1] == "bindings" and len(segments) in (7, 8) and segments[3] == "e" and segments[5] == "q":
        if (len(segments) == 7 and method in ("GET", "HEAD")) or (len(segments) == 8 and method == "DELETE"):
            return segments[6] or None
    return None


def relayed_management_queue(node: ClusterNode, request: Request) -> str | None:
    """The queue a management call is about when another node serves it and the call
    must go there; None otherwise (a call already relayed is served here)."""
    if not request.path.startswith("/api/") or FORWARDED_HEADER in request.headers:
        return None
    try:
        segments = split_path(request.path)
    except HTTPError:
        return None
    name = _relayed_queue_name(segments, request.method)
    if name is None:
        return None
    located = node.owner_of(name)
    if located is None or located[0] == node.name:
        return None
    return name


async def _answer_error(response: Response, exc: Exception) -> None:
    """Answer ``exc`` in RabbitMQ's error shape (re-raise what is not an answer)."""
    answer = rabbit_error(exc)
    if answer is None or response.started:
        raise exc
    status, body, headers = answer
    await response.send_json(status, body, headers=headers)


async def dispatch_management(node: ClusterNode, auth: Any, request: Request, response: Response, node_router: Handler) -> bool:
    """Serve ``request`` if it is a management call cluster mode routes itself: a
    per-queue call for another node (relayed there), or a member's own part of a list
    (asked by another node: served by this node's own routes). False: not such a call."""
    if not request.path.startswith("/api/"):
        return False
    if FORWARDED_HEADER in request.headers:
        await node_router(request, response)  # this node's own part (ownpart.py)
        return True
    queue = relayed_management_queue(node, request)
    if queue is None:
        return False
    try:
        await relay_to_owner(node, auth, queue, request, response)
    except ClientDisconnected:
        raise
    except Exception as exc:
        await _answer_error(response, exc)
    return True


class MemberParts:
    """The answers of the cluster's members to one list request, by member name
    (only those that answered 200 with JSON in time)."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.answers: dict[str, Any] = {}
        #: this node's own answer when it was not a 200 (a refusal to pass on)
        self.own_refusal: tuple[int, Any] | None = None

    def members(self) -> dict[str, str]:
        """Every live member's URL, this node's among them."""
        urls = {name: str(record["url"]) for name, record in self.node.view.live_nodes().items()}
        urls[self.node.name] = self.node.config.advertise_url
        return urls

    async def gather(self, request: Request, path: str) -> None:
        """Ask every live member for its part of ``path`` (no query: paging and
        columns apply to the merged list), each within the time a node is given to
        answer."""
        headers = list(request.headers.items())
        timeout = self.node.forwarder.answer_timeout_s
        async with trio.open_nursery() as nursery:
            for name, url in self.members().items():
                nursery.start_soon(self._ask, name, url, path, headers, timeout)

    async def _ask(self, name: str, url: str, path: str, headers: list[tuple[str, str]], timeout: float) -> None:
        node = self.node
        with trio.move_on_after(timeout):
            try:
                async with relay(
                    url, "GET", path, headers, b"", origin=node.name, ssl_context=node.config.peer_ssl,
                    answer_timeout_s=timeout,
                ) as answer:
                    body = bytearray()
                    async for chunk in answer.chunks():
                        body += chunk
                        if len(body) > MAX_PART_BYTES:
                            return
                    value = orjson.loads(body) if body else None
                    if answer.status == 200:
                        self.answers[name] = value
                    elif name == node.name:
                        self.own_refusal = (answer.status, value)
            except (PeerUnreachable, ValueError):
                return

    def own(self) -> Any:
        """This node's own part; raises its refusal, or 503 when it did not answer."""
        if self.own_refusal is not None:
            raise _Refusal(*self.own_refusal)
        if self.node.name not in self.answers:
            raise HTTPError("this node did not answer its own part of the list in time", code="unavailable", status=503)
        return self.answers[self.node.name]

    def ordered(self) -> list[tuple[str, Any]]:
        """The parts, this node's first, then by member name."""
        own = self.node.name
        return sorted(self.answers.items(), key=lambda item: (item[0] != own, item[0]))

    def list_items(self) -> list[tuple[str, dict[str, Any]]]:
        """(member, item) of every part that is a JSON list, in :meth:`ordered` order."""
        return [(member, item) for member, part in self.ordered() if isinstance(part, list) for item in part if isinstance(item, dict)]

    def unanswered_queues(self) -> dict[str, tuple[dict[str, Any], str | None]]:
        """The cluster's queues (definition, serving node) whose serving node did not
        answer (down, cut off, slow), or that have none (a quorum queue between
        leaders)."""
        out = {}
        view = self.node.view
        for name, (d, _rev) in view.entries["queues"].items():
            serving = view.serving_node(name, d)
            if serving is None or serving not in self.answers:
                out[name] = (d, serving)
        return out


class _Refusal(Exception):
    """This node's own part was refused (authentication, permission): passed on."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


def down_queue_json(name: str, d: dict[str, Any], serving: str | None) -> dict[str, Any]:
    """A queue whose node did not answer, from the cluster's metadata: no counts."""
    arguments = d.get("arguments") or {}
    owner = serving if serving is not None else str(d.get("owner"))
    return {
        "name": name,
        "vhost": VHOST,
        "node": member_node_name(owner),
        "durable": bool(d.get("durable", True)),
        "auto_delete": bool(d.get("auto_delete", False)),
        "exclusive": bool(d.get("exclusive", False)),
        "arguments": arguments,
        "type": str(arguments.get("x-queue-type", "classic")),
        "state": DOWN_STATE,
        "policy": None,
        "operator_policy": None,
        "effective_policy_definition": {},
    }


def merged_queues(parts: MemberParts) -> list[dict[str, Any]]:
    """Each queue once, from the node that serves it (another member's copy only
    while the view names no server that answered), then the unanswered ones from the
    metadata; by name."""
    view = parts.node.view
    merged: dict[str, dict[str, Any]] = {}
    for member, item in parts.list_items():
        name = str(item.get("name", ""))
        d = view.get("queues", name)
        if name not in merged or (d is not None and view.serving_node(name, d) == member):
            merged[name] = item
    for name, (d, serving) in parts.unanswered_queues().items():
        if name not in merged:
            merged[name] = down_queue_json(name, d, serving)
    return [merged[name] for name in sorted(merged)]


def _add_totals(into: dict[str, Any], part: dict[str, Any]) -> None:
    """Sum ``part``'s queue totals (counts and their rates) into ``into``."""
    for key, value in part.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            into[key] = into.get(key, 0) + value
        elif isinstance(value, dict) and isinstance(value.get("rate"), (int, float)):
            current = into.get(key)
            total = (current.get("rate", 0.0) if isinstance(current, dict) else 0.0) + value["rate"]
            into[key] = {"rate": round(total, 1)}


def merged_overview(parts: MemberParts) -> dict[str, Any]:
    """This node's overview with the cluster's queue totals and queue count."""
    own = parts.own()
    answer = dict(own)
    totals: dict[str, Any] = {}
    queues = 0
    for _member, part in parts.ordered():
        if not isinstance(part, dict):
            continue
        _add_totals(totals, part.get("queue_totals") or {})
        queues += int((part.get("object_totals") or {}).get("queues", 0))
    answer["queue_totals"] = totals
    object_totals = dict(own.get("object_totals") or {})
    object_totals["queues"] = queues + len(parts.unanswered_queues())
    answer["object_totals"] = object_totals
    return answer


#: The queue numbers of a vhost (and their ``_details``), summed over the members.
_VHOST_TOTALS: Final = ("messages", "messages_ready", "messages_unacknowledged")


def merged_vhost(parts: MemberParts) -> dict[str, Any]:
    """The one vhost, with the cluster's queue numbers and every member's state."""
    own = parts.own()
    answer = dict(own) if isinstance(own, dict) else {}
    totals: dict[str, Any] = {}
    for _member, part in parts.ordered():
        if isinstance(part, dict):
            _add_totals(totals, {k: v for k, v in part.items() if k.removesuffix("_details") in _VHOST_TOTALS})
    answer.update(totals)
    answer["cluster_state"] = {
        member_node_name(m): "running" if m in parts.answers else "down" for m in _members(parts.node)
    }
    return answer


def _members(node: ClusterNode) -> list[str]:
    """Every member the cluster knows (alive or not), by name."""
    return sorted(set(node.view.entries["known"]) | set(node.view.live_nodes()) | {node.name})


def _stopped_node_json(member: str) -> dict[str, Any]:
    return {"name": member_node_name(member), "type": "disc", "running": False, "partitions": []}


def merged_nodes(parts: MemberParts) -> list[dict[str, Any]]:
    """Every member: its own answer, or ``running: false`` when it gave none."""
    parts.own()
    found = {str(item.get("name")): item for _member, item in parts.list_items()}
    out = []
    for member in _members(parts.node):
        name = member_node_name(member)
        out.append(found.get(name) or _stopped_node_json(member))
    return out


def merged_bindings(parts: MemberParts) -> list[dict[str, Any]]:
    """Each binding once (those between exchanges every member holds), the default
    exchange's first, as RabbitMQ lists."""
    parts.own()
    seen: set[tuple[Any, ...]] = set()
    implicit: list[dict[str, Any]] = []
    explicit: list[dict[str, Any]] = []
    for _member, item in parts.list_items():
        key = (item.get("source"), item.get("destination"), item.get("destination_type"), item.get("properties_key"))
        if key in seen:
            continue
        seen.add(key)
        (implicit if item.get("source") == "" else explicit).append(item)
    return implicit + explicit


def _answering(handler: Handler) -> Handler:
    """``handler`` with the management API's error answers (RabbitMQ's shape), and
    this node's own refusal of its part (authentication, permission) passed on."""

    async def served(request: Request, response: Response) -> None:
        try:
            vhost = request.path_params.get("vhost")
            if vhost is not None and vhost != VHOST:
                raise ObjectNotFound(f"no vhost {vhost!r}")
            await handler(request, response)
        except ClientDisconnected:
            raise
        except _Refusal as refusal:
            await response.send_json(refusal.status, refusal.body)
        except Exception as exc:
            await _answer_error(response, exc)

    return served


def _own_list(parts: MemberParts) -> list[dict[str, Any]]:
    """Every member's items, this node's first (a consumer is on its queue's node)."""
    parts.own()
    return [item for _member, item in parts.list_items()]


def add_cluster_management_routes(router: Router, node: ClusterNode) -> None:
    """Register the cluster-wide lists on ``router`` (cluster mode's, which answers
    before the node's own; its guard authenticates)."""

    def route(pattern: str, merge: Callable[[MemberParts], Any], part_path: str, *, as_list: bool = True) -> None:
        async def merged(request: Request, response: Response) -> None:
            parts = MemberParts(node)
            await parts.gather(request, part_path)
            answer = merge(parts)
            await response.send_json(200, listed(answer, request.query) if as_list else shown(answer, request.query))

        router.add("GET", "/api" + pattern, _answering(merged))

    for pattern in ("/queues", "/queues/", "/queues/{vhost}"):
        route(pattern, merged_queues, "/api/queues")
    route("/overview", merged_overview, "/api/overview", as_list=False)
    for pattern in ("/consumers", "/consumers/{vhost}"):
        route(pattern, _own_list, "/api/consumers")
    for pattern in ("/bindings", "/bindings/{vhost}"):
        route(pattern, merged_bindings, "/api/bindings")
    route("/nodes", merged_nodes, "/api/nodes")
    route("/vhosts", lambda parts: [merged_vhost(parts)], f"/api/vhosts/{_VHOST_PATH}")
    route("/vhosts/{vhost}", merged_vhost, f"/api/vhosts/{_VHOST_PATH}", as_list=False)

    # every member's own clients, each item with its node (clients.py leaves out the
    # channels members open on each other for their clients)
    route("/connections", _own_list, "/api/connections")
    route("/channels", _own_list, "/api/channels")

    def one(kind: str, merge: Callable[[MemberParts], list[dict[str, Any]]], part_path: str, *, columns: bool) -> None:
        """``GET /api/{kind}s/{name}``: the item of that name in the merged list
        (``columns``: whether RabbitMQ applies them to it)."""

        async def found(request: Request, response: Response) -> None:
            wanted = request.path_params["name"]
            parts = MemberParts(node)
            await parts.gather(request, part_path)
            for item in merge(parts):
                if item.get("name") == wanted:
                    await response.send_json(200, shown(item, request.query) if columns else item)
                    return
            raise ObjectNotFound(f"no {kind} {wanted!r}")

        router.add("GET", f"/api/{kind}s/{{name}}", _answering(found))

    one("node", merged_nodes, "/api/nodes", columns=True)
    one("connection", _own_list, "/api/connections", columns=False)
    one("channel", _own_list, "/api/channels", columns=False)
