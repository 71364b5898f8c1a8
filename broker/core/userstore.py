"""Users, API tokens and their permissions: the durable part of security (sans-IO).

The store and its records; the broker's commands on it are in ``users.py``.

Theory of operation
-------------------

:class:`UserStore` holds every user (name, password hash, tags, permissions) and every
API token (id, owner, digest of its secret, expiry). It never hashes or compares a
secret: the API layer does that (``broker.api.auth``) and hands the store only the
opaque hash strings to keep. Each change is a command on the broker
(:class:`~broker.core.users.Users`: ``put_user``, ``delete_user``, ``add_token``, ``revoke_token``)
that validates everything first, then applies one JSON record to the store and logs
the same record, so that replay (:meth:`UserStore.apply`) and the live change are one
code path. Replay is idempotent: a put overwrites, a delete of something absent does
nothing.

Records (``RecordType``): ``USER`` (a whole user), ``USER_DELETE`` (a name; the user's
tokens go with it), ``TOKEN`` (a whole token), ``TOKEN_DELETE`` (an id). A checkpoint
carries the live users and tokens as ``USER`` and ``TOKEN`` records.

Permissions follow RabbitMQ's model: three regular expressions per user,
``configure``, ``write`` and ``read``, matched (``re.search``, unanchored, as
RabbitMQ's ``re:run``) against exchange and queue names; the empty string matches
nothing. A new user has none until given some. The ``administrator`` tag allows user
management, metrics and other operator calls; it grants no access to exchanges or
queues by itself (as in RabbitMQ). ``generation`` grows with every change, so an edge
cache of verified credentials or permission answers knows when to forget them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import records as rec
from .errors import InvalidArgument
from .records import RecordType

__all__ = [
    "ADMINISTRATOR",
    "MAX_USERS",
    "MAX_TOKENS_PER_USER",
    "PERMISSIONS",
    "Token",
    "User",
    "UserStore",
    "check_username",
]

ADMINISTRATOR = "administrator"
#: The three permission kinds, in RabbitMQ's order.
PERMISSIONS = ("configure", "write", "read")
MAX_USERNAME_CHARS = 255
MAX_PATTERN_CHARS = 1024
MAX_TAGS = 16
MAX_DESCRIPTION_CHARS = 255
# Bounds on what the store may hold, so that no administrator's script can grow every
# checkpoint without limit. Generous: RabbitMQ deployments rarely have more than
# hundreds of users.
MAX_USERS = 10_000
MAX_TOKENS_PER_USER = 100
_TAG_RE = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_TOKEN_ID_RE = re.compile(r"[0-9a-f]{16}")


def check_username(name: object) -> str:
    """A user name: 1..255 characters, no control characters and no ``:`` (HTTP Basic
    credentials are ``user:password``, split at the first colon, RFC 7617 section 2).

    Raises InvalidArgument."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("user name must be a non-empty string")
    if len(name) > MAX_USERNAME_CHARS:
        raise InvalidArgument(f"user name is longer than {MAX_USERNAME_CHARS} characters")
    if ":" in name or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise InvalidArgument("user name must not contain ':' or control characters")
    return name


def _check_pattern(kind: str, value: object) -> re.Pattern[str] | None:
    """Compile one permission pattern ("" = nothing: None). Raises InvalidArgument."""
    if not isinstance(value, str):
        raise InvalidArgument(f"permission {kind} must be a string (a regular expression)")
    if len(value) > MAX_PATTERN_CHARS:
        raise InvalidArgument(f"permission {kind} is longer than {MAX_PATTERN_CHARS} characters")
    if value == "":
        return None
    try:
        return re.compile(value)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InvalidArgument(f"permission {kind} is not a valid regular expression: {exc}") from None


def _check_tags(tags: object) -> tuple[str, ...]:
    if not isinstance(tags, (list, tuple)) or len(tags) > MAX_TAGS:
        raise InvalidArgument(f"tags must be a list of at most {MAX_TAGS} strings")
    for tag in tags:
        if not isinstance(tag, str) or _TAG_RE.fullmatch(tag) is None:
            raise InvalidArgument(f"tag {str(tag)[:64]!r} must be lower-case letters, digits, '_' or '-'")
    return tuple(sorted(set(tags)))


@dataclass(slots=True)
class User:
    """One user. ``password`` is the hash string the API layer made (None: the user
    can only authenticate with tokens)."""

    name: str
    password: str | None
    tags: tuple[str, ...]
    permissions: dict[str, str]
    compiled: dict[str, re.Pattern[str] | None] = field(default_factory=dict)

    @property
    def administrator(self) -> bool:
        return ADMINISTRATOR in self.tags

    def allows(self, permission: str, name: str) -> bool:
        """Whether ``permission`` (configure/write/read) covers the resource ``name``."""
        pattern = self.compiled.get(permission)
        return pattern is not None and pattern.search(name) is not None

    def record(self) -> dict[str, Any]:
        return {"name": self.name, "password": self.password, "tags": list(self.tags), "permissions": self.permissions}

    def info(self) -> dict[str, Any]:
        """What the API shows (never the hash)."""
        return {
            "name": self.name,
            "tags": list(self.tags),
            "permissions": dict(self.permissions),
            "has_password": self.password is not None,
        }


@dataclass(slots=True)
class Token:
    """One API token: its secret is never kept, only ``digest`` (made by the API layer)."""

    id: str
    user: str
    digest: str
    created_s: float
    expires_s: float | None
    description: str

    def expired(self, wall_s: float) -> bool:
        return self.expires_s is not None and wall_s >= self.expires_s

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "digest": self.digest,
            "created_s": self.created_s,
            "expires_s": self.expires_s,
            "description": self.description,
        }

    def info(self) -> dict[str, Any]:
        """What the API shows (never the digest)."""
        return {
            "id": self.id,
            "user": self.user,
            "created_s": self.created_s,
            "expires_s": self.expires_s,
            "description": self.description,
        }


def _permissions(value: object) -> tuple[dict[str, str], dict[str, re.Pattern[str] | None]]:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise InvalidArgument("permissions must be an object with configure, write and read")
    unknown = set(value) - set(PERMISSIONS)
    if unknown:
        raise InvalidArgument(f"unknown permission(s): {', '.join(sorted(map(str, unknown)))}")
    texts = {kind: value.get(kind, "") for kind in PERMISSIONS}
    compiled = {kind: _check_pattern(kind, texts[kind]) for kind in PERMISSIONS}
    return texts, compiled


class UserStore:
    """Every user and token (see the module docstring). Pure state: the broker's
    commands validate and log; :meth:`apply` changes."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        self.tokens: dict[str, Token] = {}
        #: Grows with every change (edge caches compare it).
        self.generation = 0

    def __len__(self) -> int:
        return len(self.users)

    def get(self, name: str) -> User | None:
        return self.users.get(name)

    def tokens_of(self, name: str) -> list[Token]:
        return [t for t in self.tokens.values() if t.user == name]

    def apply(self, rtype: int, obj: dict[str, Any]) -> None:
        """Apply one user record (live or in replay; idempotent).

        Raises ValueError (as replay expects) for a malformed record."""
        try:
            self._apply(rtype, obj)
        except (InvalidArgument, KeyError, TypeError) as exc:
            raise ValueError(f"malformed user record (type {rtype}): {exc}") from None
        self.generation += 1

    def _apply(self, rtype: int, obj: dict[str, Any]) -> None:
        if rtype == RecordType.USER:
            texts, compiled = _permissions(obj["permissions"])
            password = obj.get("password")
            if password is not None and not isinstance(password, str):
                raise TypeError("password hash must be a string")
            name = check_username(obj["name"])
            self.users[name] = User(name, password, _check_tags(obj["tags"]), texts, compiled)
        elif rtype == RecordType.USER_DELETE:
            name = obj["name"]
            self.users.pop(name, None)
            for token in self.tokens_of(name):
                del self.tokens[token.id]
        elif rtype == RecordType.TOKEN:
            expires = obj.get("expires_s")
            token = Token(
                str(obj["id"]), str(obj["user"]), str(obj["digest"]), float(obj["created_s"]),
                None if expires is None else float(expires), str(obj.get("description", "")),
            )
            self.tokens[token.id] = token
        elif rtype == RecordType.TOKEN_DELETE:
            self.tokens.pop(obj["id"], None)
        else:
            raise KeyError(f"not a user record type: {rtype}")

    def snapshot_records(self, wall_s: float) -> Iterator[tuple[int, bytes]]:
        """The store as records for a checkpoint (expired tokens are left out)."""
        for user in self.users.values():
            yield RecordType.USER, rec.encode_json(user.record())
        for token in self.tokens.values():
            if not token.expired(wall_s) and token.user in self.users:
                yield RecordType.TOKEN, rec.encode_json(token.record())


