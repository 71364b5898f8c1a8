"""Users and API tokens over REST (``/users``, ``/tokens``, ``/whoami``).

Managing users needs the ``administrator`` tag. A user may also see itself, and make,
list and revoke its own tokens (a service rotating its credential needs no
administrator). Passwords arrive in the JSON body and are hashed in a worker thread
before the core sees them; a token's secret is in the answer to its creation and
nowhere else, ever.
"""

from __future__ import annotations

from typing import Any

import trio

from broker.api.auth import hash_password, new_token
from broker.api.permissions import access_for
from broker.api.rest.fields import RestContext, body_fields
from broker.core import MAX_DELAY_S, Broker, InvalidArgument, NotFound, check_username
from broker.http import Request, Response

#: Longest token lifetime a request may ask for (``expires_in_s``); longer-lived
#: credentials are users' passwords. The delay ceiling is as long as the broker plans.
MAX_TOKEN_LIFETIME_S = MAX_DELAY_S
MAX_PASSWORD_CHARS = 1024


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    ctx.add("GET", "/whoami", whoami)
    ctx.add("GET", "/users", list_users)
    ctx.add("GET", "/users/{name}", get_user)
    ctx.add("PUT", "/users/{name}", put_user)
    ctx.add("PUT", "/users/{name}/permissions", put_permissions)
    ctx.add("DELETE", "/users/{name}", delete_user)
    ctx.add("POST", "/users/{name}/tokens", create_token)
    ctx.add("GET", "/users/{name}/tokens", list_tokens)
    ctx.add("DELETE", "/tokens/{id}", revoke_token)


def _self_or_admin(request: Request, name: str) -> None:
    access = access_for(request)
    if access.username != name or not access.username:
        access.require("administer")


async def _hashed(ctx: RestContext, password: Any) -> str:
    if not isinstance(password, str) or not password or len(password) > MAX_PASSWORD_CHARS:
        raise InvalidArgument(f"password must be a non-empty string of at most {MAX_PASSWORD_CHARS} characters")
    limiter = ctx.auth.hashing if ctx.auth is not None else None
    return await trio.to_thread.run_sync(hash_password, password, limiter=limiter)


def _enforce(ctx: RestContext) -> None:
    """Apply the change just made to what users hold open, in the same step as the
    command (inside it, before the gateway carries out its effects), so no delivery
    falls between the change and this (``Authenticator.enforce_revocations``)."""
    if ctx.auth is not None:
        ctx.auth.enforce_revocations()


def _user_json(ctx: RestContext, name: str) -> dict[str, Any]:
    info = ctx.views.user_info(name)
    if info is None:
        raise NotFound(f"no user {name!r}")
    return info


async def whoami(ctx: RestContext, request: Request, response: Response) -> None:
    access = access_for(request)
    info = ctx.views.user_info(access.username) if access.username else None
    if info is None:  # no users exist: nobody had to authenticate
        await response.send_json(200, {"name": None, "tags": [], "authenticated": False})
        return
    await response.send_json(200, {**info, "authenticated": True})


async def list_users(ctx: RestContext, request: Request, response: Response) -> None:
    access_for(request).require("administer")
    await response.send_json(200, {"users": ctx.views.user_infos()})


async def get_user(ctx: RestContext, request: Request, response: Response) -> None:
    name = request.path_params["name"]
    _self_or_admin(request, name)
    await response.send_json(200, _user_json(ctx, name))


async def put_user(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    access_for(request).require("administer")
    name = check_username(request.path_params["name"])
    f = await body_fields(request, {"password", "tags", "permissions"})
    tags = f.obj.get("tags", [])
    permissions = f.dict("permissions") if "permissions" in f.obj else None
    existing = ctx.views.user_permissions(name)
    if "password" not in f.obj and existing is None:
        raise InvalidArgument("a new user needs a password (tokens can be added later)")
    if permissions is None and existing is not None:
        permissions = existing
    password = await _hashed(ctx, f.obj["password"]) if "password" in f.obj else None
    def put(core: Broker) -> bool:
        created = core.put_user(name, password=password, tags=tags, permissions=permissions, keep_password=True)
        _enforce(ctx)
        return created

    created = await ctx.gateway.run_durable(put)
    await response.send_json(201 if created else 200, _user_json(ctx, name))


async def put_permissions(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    access_for(request).require("administer")
    name = request.path_params["name"]
    f = await body_fields(request, {"configure", "write", "read"})
    permissions = dict(f.obj)
    def set_permissions(core: Broker) -> None:
        core.set_permissions(name, permissions)
        _enforce(ctx)

    await ctx.gateway.run_durable(set_permissions)
    await response.send_json(200, _user_json(ctx, name))


async def delete_user(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    access_for(request).require("administer")
    name = request.path_params["name"]
    def delete(core: Broker) -> None:
        core.delete_user(name)
        _enforce(ctx)

    await ctx.gateway.run_durable(delete)
    await response.send_json(200, {"deleted": name})


async def create_token(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    name = request.path_params["name"]
    _self_or_admin(request, name)
    f = await body_fields(request, {"expires_in_s", "description"})
    lifetime = f.number("expires_in_s", None, minimum=1)
    if lifetime is not None and lifetime > MAX_TOKEN_LIFETIME_S:
        raise InvalidArgument(f"expires_in_s must be at most {MAX_TOKEN_LIFETIME_S:g}")
    description = f.str("description", "")
    token_id, digest, text = new_token()
    token = await ctx.gateway.run_durable(
        lambda core: core.add_token(
            token_id, name, digest,
            expires_s=core.wall_clock() + lifetime if lifetime is not None else None,
            description=description,
        )
    )
    await response.send_json(201, {**token.info(), "token": text})


async def list_tokens(ctx: RestContext, request: Request, response: Response) -> None:
    name = request.path_params["name"]
    _self_or_admin(request, name)
    _user_json(ctx, name)  # (raises NotFound)
    await response.send_json(200, {"tokens": ctx.views.token_infos(name)})


async def revoke_token(ctx: RestContext, request: Request, response: Response) -> None:
    ctx.gateway.check_ready()
    token_id = request.path_params["id"]
    owner = ctx.views.token_owner(token_id)
    if owner is None:
        access_for(request).require("administer")  # no hint to others of what exists
        raise NotFound(f"no token {token_id[:32]!r}")
    _self_or_admin(request, owner)
    def revoke(core: Broker) -> None:
        core.revoke_token(token_id)
        _enforce(ctx)

    await ctx.gateway.run_durable(revoke)
    await response.send_json(200, {"revoked": token_id})
