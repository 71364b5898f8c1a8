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
from broker.core import MAX_DELAY_S, InvalidArgument, NotFound, check_username

#: Longest token lifetime a request may ask for (``expires_in_s``); longer-lived
#: credentials are users' passwords. The delay ceiling is as long as the broker plans.
MAX_TOKEN_LIFETIME_S = MAX_DELAY_S
_MAX_PASSWORD_CHARS = 1024


def add_routes(ctx: RestContext) -> None:
    """Register this family's endpoints."""
    runtime, core, auth = ctx.runtime, ctx.core, ctx.auth
    limiter = auth.hashing if auth is not None else None

    def enforce() -> None:
        """Apply the change just made to what users hold open (in the same step)."""
        if auth is not None:
            auth.enforce_revocations()

    def self_or_admin(request: Any, name: str) -> None:
        access = access_for(request)
        if access.username != name or not access.username:
            access.require("administer")

    async def hashed(password: Any) -> str:
        if not isinstance(password, str) or not password or len(password) > _MAX_PASSWORD_CHARS:
            raise InvalidArgument(f"password must be a non-empty string of at most {_MAX_PASSWORD_CHARS} characters")
        return await trio.to_thread.run_sync(hash_password, password, limiter=limiter)

    @ctx.route("GET", "/whoami")
    async def whoami(request: Any, response: Any) -> None:
        access = access_for(request)
        user = core.users.get(access.username) if access.username else None
        if user is None:  # no users exist: nobody had to authenticate
            await response.send_json(200, {"name": None, "tags": [], "authenticated": False})
            return
        await response.send_json(200, {**user.info(), "authenticated": True})

    @ctx.route("GET", "/users")
    async def list_users(request: Any, response: Any) -> None:
        access_for(request).require("administer")
        await response.send_json(200, {"users": [u.info() for u in core.users.users.values()]})

    @ctx.route("GET", "/users/{name}")
    async def get_user(request: Any, response: Any) -> None:
        name = request.path_params["name"]
        self_or_admin(request, name)
        user = core.users.get(name)
        if user is None:
            raise NotFound(f"no user {name!r}")
        await response.send_json(200, user.info())

    @ctx.route("PUT", "/users/{name}")
    async def put_user(request: Any, response: Any) -> None:
        runtime.check_ready()
        access_for(request).require("administer")
        name = check_username(request.path_params["name"])
        f = await body_fields(request, {"password", "tags", "permissions"})
        tags = f.obj.get("tags", [])
        permissions = f.dict("permissions") if "permissions" in f.obj else None
        exists = core.users.get(name) is not None
        if "password" not in f.obj and not exists:
            raise InvalidArgument("a new user needs a password (tokens can be added later)")
        if permissions is None and exists:
            permissions = dict(core.users.users[name].permissions)
        password = await hashed(f.obj["password"]) if "password" in f.obj else None
        created = core.put_user(name, password=password, tags=tags, permissions=permissions, keep_password=True)
        enforce()
        await runtime.wait_durable()
        await response.send_json(201 if created else 200, core.users.users[name].info())

    @ctx.route("PUT", "/users/{name}/permissions")
    async def put_permissions(request: Any, response: Any) -> None:
        runtime.check_ready()
        access_for(request).require("administer")
        name = request.path_params["name"]
        f = await body_fields(request, {"configure", "write", "read"})
        core.set_permissions(name, dict(f.obj))
        enforce()
        await runtime.wait_durable()
        await response.send_json(200, core.users.users[name].info())

    @ctx.route("DELETE", "/users/{name}")
    async def delete_user(request: Any, response: Any) -> None:
        runtime.check_ready()
        access_for(request).require("administer")
        name = request.path_params["name"]
        core.delete_user(name)
        enforce()
        await runtime.wait_durable()
        await response.send_json(200, {"deleted": name})

    @ctx.route("POST", "/users/{name}/tokens")
    async def create_token(request: Any, response: Any) -> None:
        runtime.check_ready()
        name = request.path_params["name"]
        self_or_admin(request, name)
        f = await body_fields(request, {"expires_in_s", "description"})
        lifetime = f.number("expires_in_s", None, minimum=1)
        if lifetime is not None and lifetime > MAX_TOKEN_LIFETIME_S:
            raise InvalidArgument(f"expires_in_s must be at most {MAX_TOKEN_LIFETIME_S:g}")
        token_id, digest, text = new_token()
        expires_s = core.wall_clock() + lifetime if lifetime is not None else None
        token = core.add_token(token_id, name, digest, expires_s=expires_s, description=f.str("description", ""))
        await runtime.wait_durable()
        await response.send_json(201, {**token.info(), "token": text})

    @ctx.route("GET", "/users/{name}/tokens")
    async def list_tokens(request: Any, response: Any) -> None:
        name = request.path_params["name"]
        self_or_admin(request, name)
        if core.users.get(name) is None:
            raise NotFound(f"no user {name!r}")
        await response.send_json(200, {"tokens": [t.info() for t in core.users.tokens_of(name)]})

    @ctx.route("DELETE", "/tokens/{id}")
    async def revoke_token(request: Any, response: Any) -> None:
        runtime.check_ready()
        token_id = request.path_params["id"]
        token = core.users.tokens.get(token_id)
        if token is None:
            access_for(request).require("administer")  # no hint to others of what exists
            raise NotFound(f"no token {token_id[:32]!r}")
        self_or_admin(request, token.user)
        core.revoke_token(token_id)
        enforce()
        await runtime.wait_durable()
        await response.send_json(200, {"revoked": token_id})
