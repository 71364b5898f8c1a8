"""The cluster: ``GET /cluster``, and in cluster mode the metadata changes that go
through etcd (docs/cluster.md).

On a single node (no ``--etcd``) ``GET /cluster`` answers ``200 {"enabled": false}``
and nothing else here runs. In cluster mode :func:`cluster_routes` builds a router
that answers before the node's own: ``GET /cluster`` and ``GET /healthz`` with the
cluster's state, and the metadata changes (declare and delete of queues and
exchanges, bind and unbind), which are decided by an etcd transaction and applied to
every node's core by its watch; and the changes of users, permissions and tokens (``broker.cluster``), never to this core directly.
Every other request falls through to the node's router.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from broker.api.auth import hash_password, new_token
from broker.api.fields import (
    LOCK_ACQUIRE_FIELDS,
    LOCK_REFRESH_FIELDS,
    LOCK_RELEASE_FIELDS,
)
from broker.api.management.cluster import (
    add_cluster_management_routes,
    dispatch_management,
)
from broker.api.permissions import access_for
from broker.api.rest.cluster_etcd import etcd_errors
from broker.api.rest.cluster_get import cluster_get_any
from broker.api.rest.cluster_relay import relay_to_owner, relayed_queue
from broker.api.rest.cluster_schedules import add_cluster_schedule_routes
from broker.api.rest.fields import (
    DEFAULT_EXCHANGE_ALIAS,
    RestContext,
    body_fields,
    check_query,
    exchange_name,
)
from broker.api.rest.health import health_answer
from broker.api.rest.replicas import add_replica_routes
from broker.api.rest.users import MAX_PASSWORD_CHARS, MAX_TOKEN_LIFETIME_S
from broker.core import (
    EXCHANGE_TYPES,
    InvalidArgument,
    LockBusy,
    NotFound,
    NotLockHolder,
    PreconditionFailed,
    Unavailable,
    check_username,
)
from broker.http import MethodNotAllowed, NoSuchEndpoint, Request, Response, Router
from broker.runtime import BrokerRuntime

if TYPE_CHECKING:
    from broker.cluster import ClusterNode

__all__ = ["add_routes", "cluster_routes", "dispatch_cluster_first"]

Handler = Callable[[Request, Response], Awaitable[None]]


def add_routes(ctx: RestContext) -> None:
    """A single node: ``GET /cluster`` says cluster mode is off; there is no node to
    forget."""
    ctx.add("GET", "/cluster", no_cluster)
    ctx.add("DELETE", "/cluster/nodes/{name}", no_node_to_forget, query=frozenset({"rehome"}))
    ctx.add("POST", "/queues/{name}/replicas", no_replicas_to_change)


async def no_cluster(ctx: RestContext, request: Request, response: Response) -> None:
    await response.send_json(
        200, {"enabled": False, "reason": "this broker is a single node: start it with --etcd to join a cluster"}
    )


async def no_replicas_to_change(ctx: RestContext, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    raise PreconditionFailed("this broker is a single node: its queues have no replicas to change", code="not_clustered")


async def no_node_to_forget(ctx: RestContext, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    raise PreconditionFailed("this broker is a single node: there is no other node to forget", code="not_clustered")


def _route(
    router: Router,
    method: str,
    pattern: str,
    handler: Handler,
    *,
    query: frozenset[str] = frozenset(),
    public: bool = False,
) -> None:
    """Serve ``METHOD pattern`` with ``handler``, refusing query parameters outside
    ``query`` (as ``RestContext.add`` does for the node's own routes)."""

    async def checked(request: Request, response: Response) -> None:
        check_query(request, query)
        await handler(request, response)

    router.add(method, pattern, checked, public=public)


def dispatch_cluster_first(cluster: Router, node_router: Router, node: ClusterNode | None = None, auth: Any = None) -> Handler:
    """A handler that serves a request from ``cluster`` when it has the route, else
    from ``node_router``; a request about a queue another node owns goes to that
    node (``cluster_relay.py``; the management API's lists and per-queue calls:
    ``broker/api/management/cluster.py``)."""

    async def dispatch(request: Request, response: Response) -> None:
        if node is not None:
            queue = relayed_queue(node, request)
            if queue is not None:
                await relay_to_owner(node, auth, queue, request, response)
                return
            if await dispatch_management(node, auth, request, response, node_router):
                return  # the management API's relays (broker/api/management/cluster.py)
        try:
            cluster.match(request.method, request.path)
        except (NoSuchEndpoint, MethodNotAllowed):
            await node_router(request, response)
            return
        await cluster(request, response)

    return dispatch


def cluster_routes(runtime: BrokerRuntime, node: ClusterNode, auth: Any) -> Router:
    """The routes cluster mode answers itself (see the module docstring); ``auth``:
    the authenticator (its guard, and its hashing threads)."""
    router = Router(guard=auth.guard)
    _add_user_routes(router, runtime, auth, node)
    views = runtime.core.views
    writer = node.writer

    async def status(request: Request, response: Response) -> None:
        await response.send_json(200, node.status())

    async def healthz(request: Request, response: Response) -> None:
        status, answer = health_answer(runtime, views)
        if status == 200:
            answer["cluster"] = node.health()
        await response.send_json(status, answer)

    def queue_answer(name: str, d: dict[str, Any]) -> dict[str, Any]:
        local = views.queue_info(name) if d.get("owner") == node.name else None
        info: dict[str, Any] = (
            local
            if local is not None
            else {"name": name, "durable": d["durable"], "exclusive": False, "auto_delete": d["auto_delete"], "arguments": d["arguments"]}
        )
        located = node.owner_of(name)
        info["owner"] = d.get("owner")
        info["owner_url"] = located[1] if located else None
        return info

    async def put_queue(request: Request, response: Response) -> None:
        name = request.path_params["name"]
        f = await body_fields(request, {"durable", "exclusive", "auto_delete", "arguments", "passive"})
        passive = f.bool("passive", False)
        if not passive:
            access_for(request).require_declare("declare_queue", name, f.obj.get("arguments"))
        if f.bool("exclusive", False):
            raise InvalidArgument("exclusive queues belong to a channel: declare them on one")
        d, created = await writer.declare_queue(
            name,
            durable=f.bool("durable", True),
            auto_delete=f.bool("auto_delete", False),
            arguments=f.dict("arguments"),
            passive=passive,
        )
        await runtime.wait_durable()
        await response.send_json(201 if created else 200, queue_answer(name, d))

    async def delete_queue(request: Request, response: Response) -> None:
        name = request.path_params["name"]
        access_for(request).require("delete_queue", name)
        if_unused = request.query.get_bool("if_unused", False)
        if_empty = request.query.get_bool("if_empty", False)
        port = runtime.cluster
        assert port is not None  # (cluster mode)
        count = await port.delete_queue(name, if_unused=if_unused, if_empty=if_empty)
        await runtime.wait_durable()
        await response.send_json(200, {"deleted": name, "messages": count})

    async def put_exchange(request: Request, response: Response) -> None:
        name = exchange_name(request.path_params["name"])
        f = await body_fields(request, {"type", "durable", "auto_delete", "internal", "arguments", "passive"})
        passive = f.bool("passive", False)
        if not passive:
            access_for(request).require_declare("declare_exchange", name or DEFAULT_EXCHANGE_ALIAS, f.obj.get("arguments"))
        etype = f.str("type", "direct")
        if etype not in EXCHANGE_TYPES:
            raise InvalidArgument(f"type must be one of {', '.join(EXCHANGE_TYPES)}")
        d, created = await writer.declare_exchange(
            name,
            etype,
            durable=f.bool("durable", True),
            auto_delete=f.bool("auto_delete", False),
            internal=f.bool("internal", False),
            arguments=f.dict("arguments"),
            passive=passive,
        )
        await runtime.wait_durable()
        await response.send_json(201 if created else 200, {"name": name, **d})

    async def delete_exchange(request: Request, response: Response) -> None:
        name = exchange_name(request.path_params["name"])
        access_for(request).require("delete_exchange", name or DEFAULT_EXCHANGE_ALIAS)
        await writer.delete_exchange(name, if_unused=request.query.get_bool("if_unused", False))
        await runtime.wait_durable()
        await response.send_json(200, {"deleted": name or DEFAULT_EXCHANGE_ALIAS})

    async def binding_args(request: Request, operation: str) -> tuple[str, str, str, dict[str, Any], bool]:
        f = await body_fields(request, {"exchange", "queue", "to_exchange", "routing_key", "arguments"})
        source = exchange_name(f.str("exchange"))
        queue = f.opt_str("queue")
        to_exchange = f.opt_str("to_exchange")
        if (queue is None) == (to_exchange is None):
            raise InvalidArgument("give exactly one of queue and to_exchange")
        dest = queue if queue is not None else exchange_name(to_exchange or "")
        to_x = to_exchange is not None
        access_for(request).require(
            operation, (dest or DEFAULT_EXCHANGE_ALIAS) if to_x else dest, source=source or DEFAULT_EXCHANGE_ALIAS
        )
        return source, dest, f.str("routing_key", ""), f.dict("arguments"), to_x

    async def bind(request: Request, response: Response) -> None:
        source, dest, key, args, to_x = await binding_args(request, "bind")
        created = await writer.bind(source, dest, key, args, to_exchange=to_x)
        await runtime.wait_durable()
        await response.send_json(201 if created else 200, {"bound": True, "created": created})

    async def unbind(request: Request, response: Response) -> None:
        source, dest, key, args, to_x = await binding_args(request, "unbind")
        await writer.unbind(source, dest, key, args, to_exchange=to_x)
        await runtime.wait_durable()
        await response.send_json(200, {"unbound": True})

    async def forget_node(request: Request, response: Response) -> None:
        access_for(request).require("administer")
        answer = await node.forget(request.path_params["name"], rehome=request.query.get_bool("rehome", False))
        await runtime.wait_durable()
        await response.send_json(200, answer)

    _add_lock_routes(router, runtime, node)

    async def get_any(request: Request, response: Response) -> None:
        await cluster_get_any(node, runtime, request, response)

    _route(router, "POST", "/get", get_any)
    add_cluster_schedule_routes(_route, router, runtime, node)
    _route(router, "GET", "/cluster", status)
    _route(router, "DELETE", "/cluster/nodes/{name}", etcd_errors(node, forget_node), query=frozenset({"rehome"}))
    _route(router, "GET", "/healthz", healthz, public=True)
    _route(router, "PUT", "/queues/{name}", etcd_errors(node, put_queue))
    _route(router, "DELETE", "/queues/{name}", etcd_errors(node, delete_queue), query=frozenset({"if_unused", "if_empty"}))
    _route(router, "PUT", "/exchanges/{name}", etcd_errors(node, put_exchange))
    _route(router, "DELETE", "/exchanges/{name}", etcd_errors(node, delete_exchange), query=frozenset({"if_unused"}))
    _route(router, "POST", "/bindings", etcd_errors(node, bind))
    _route(router, "DELETE", "/bindings", etcd_errors(node, unbind))
    add_replica_routes(router, node, views)
    add_cluster_management_routes(router, node)
    return router


def _add_lock_routes(router: Router, runtime: BrokerRuntime, node: ClusterNode) -> None:
    """Locks held in etcd for the whole cluster (``broker.cluster.locks``), with the
    single node's answers: a refusal is a 409 carrying the lock as it is."""
    # here: cluster mode's, not loaded on a single node
    from broker.cluster import EtcdUnavailable

    locks = node.locks

    async def refused(response: Response, exc: LockBusy | NotLockHolder) -> None:
        await response.send_json(exc.status, {**exc.to_json(), "lock": exc.info})

    def guarded(handler: Handler) -> Handler:
        async def run(request: Request, response: Response) -> None:
            runtime.check_ready()
            access_for(request).require("lock", request.path_params["name"])
            try:
                await handler(request, response)
            except (LockBusy, NotLockHolder) as exc:
                await refused(response, exc)
            except EtcdUnavailable as exc:
                node.note_etcd(exc.message)
                raise Unavailable(f"etcd is unreachable, so locks cannot change now: {exc.message}", code="etcd_unavailable") from None

        return run

    async def acquire(request: Request, response: Response) -> None:
        f = await body_fields(request, LOCK_ACQUIRE_FIELDS)
        info = await locks.acquire(request.path_params["name"], f.obj.get("owner"), f.obj.get("ttl_s", 30), f.obj.get("wait_s", 0))
        await response.send_json(200, info)

    async def refresh(request: Request, response: Response) -> None:
        f = await body_fields(request, LOCK_REFRESH_FIELDS)
        info = await locks.refresh(request.path_params["name"], f.obj.get("owner"), f.obj.get("token"), f.obj.get("ttl_s"))
        await response.send_json(200, info)

    async def release(request: Request, response: Response) -> None:
        f = await body_fields(request, LOCK_RELEASE_FIELDS)
        info = await locks.release(request.path_params["name"], f.obj.get("owner"), f.obj.get("token"))
        await response.send_json(200, info)

    async def get_lock(request: Request, response: Response) -> None:
        await response.send_json(200, await locks.info(request.path_params["name"]))

    async def list_locks(request: Request, response: Response) -> None:
        try:
            infos = await locks.infos()
        except EtcdUnavailable as exc:
            raise Unavailable(f"etcd is unreachable: {exc.message}", code="etcd_unavailable") from None
        await response.send_json(200, {"locks": infos})

    _route(router, "POST", "/locks/{name}/acquire", guarded(acquire))
    _route(router, "POST", "/locks/{name}/refresh", guarded(refresh))
    _route(router, "POST", "/locks/{name}/release", guarded(release))
    _route(router, "GET", "/locks/{name}", guarded(get_lock))
    _route(router, "GET", "/locks", list_locks)


def _add_user_routes(router: Router, runtime: BrokerRuntime, auth: Any, node: ClusterNode) -> None:
    """Users, permissions and tokens through etcd (the reads stay the node's own:
    every node's core holds every user)."""
    core, views, writer = runtime.core, runtime.core.views, node.user_writer
    limiter = auth.hashing if auth is not None else None

    def self_or_admin(request: Request, name: str) -> None:
        access = access_for(request)
        if access.username != name or not access.username:
            access.require("administer")

    async def hashed(password: Any) -> str:
        if not isinstance(password, str) or not password or len(password) > MAX_PASSWORD_CHARS:
            raise InvalidArgument(f"password must be a non-empty string of at most {MAX_PASSWORD_CHARS} characters")
        return await trio.to_thread.run_sync(hash_password, password, limiter=limiter)

    def info(record: dict[str, Any]) -> dict[str, Any]:
        shown = views.user_info(record["name"])
        return shown if shown is not None else {"name": record["name"], "tags": record["tags"]}

    async def put_user(request: Request, response: Response) -> None:
        access_for(request).require("administer")
        name = check_username(request.path_params["name"])
        f = await body_fields(request, {"password", "tags", "permissions"})
        tags = f.obj.get("tags", [])
        if not isinstance(tags, list):
            raise InvalidArgument("tags must be a list of strings")
        permissions = f.dict("permissions") if "permissions" in f.obj else None
        password = await hashed(f.obj["password"]) if "password" in f.obj else None
        record, created = await writer.put_user(name, password=password, tags=tags, permissions=permissions)
        await runtime.wait_durable()
        await response.send_json(201 if created else 200, info(record))

    async def put_permissions(request: Request, response: Response) -> None:
        access_for(request).require("administer")
        f = await body_fields(request, {"configure", "write", "read"})
        record = await writer.set_permissions(request.path_params["name"], dict(f.obj))
        await runtime.wait_durable()
        await response.send_json(200, info(record))

    async def delete_user(request: Request, response: Response) -> None:
        access_for(request).require("administer")
        name = request.path_params["name"]
        await writer.delete_user(name)
        await runtime.wait_durable()
        await response.send_json(200, {"deleted": name})

    async def create_token(request: Request, response: Response) -> None:
        name = request.path_params["name"]
        self_or_admin(request, name)
        f = await body_fields(request, {"expires_in_s", "description"})
        lifetime = f.number("expires_in_s", None, minimum=1)
        if lifetime is not None and lifetime > MAX_TOKEN_LIFETIME_S:
            raise InvalidArgument(f"expires_in_s must be at most {MAX_TOKEN_LIFETIME_S:g}")
        token_id, digest, text = new_token()
        now = core.wall_clock()
        await writer.add_token(
            token_id,
            name,
            digest,
            now_s=now,
            expires_s=now + lifetime if lifetime is not None else None,
            description=f.str("description", ""),
        )
        await runtime.wait_durable()
        token_info = views.token_info(token_id)
        shown = token_info if token_info is not None else {"id": token_id, "user": name}
        await response.send_json(201, {**shown, "token": text})

    async def revoke_token(request: Request, response: Response) -> None:
        token_id = request.path_params["id"]
        owner = views.token_owner(token_id)
        if owner is None:
            access_for(request).require("administer")  # no hint to others of what exists
            raise NotFound(f"no token {token_id[:32]!r}")
        self_or_admin(request, owner)
        await writer.revoke_token(token_id)
        await runtime.wait_durable()
        await response.send_json(200, {"revoked": token_id})

    _route(router, "PUT", "/users/{name}", etcd_errors(node, put_user))
    _route(router, "PUT", "/users/{name}/permissions", etcd_errors(node, put_permissions))
    _route(router, "DELETE", "/users/{name}", etcd_errors(node, delete_user))
    _route(router, "POST", "/users/{name}/tokens", etcd_errors(node, create_token))
    _route(router, "DELETE", "/tokens/{id}", etcd_errors(node, revoke_token))
