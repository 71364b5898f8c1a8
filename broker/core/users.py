"""The broker's user and token commands (see ``userstore.py`` for the model).

Each command validates everything before it changes anything, then applies one record
to the :class:`~broker.core.userstore.UserStore` and logs the same record, so that a
live change and its replay run the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from . import records as rec
from .errors import InvalidArgument, NotFound
from .records import RecordType
from .userstore import (
    _TOKEN_ID_RE,
    MAX_DESCRIPTION_CHARS,
    MAX_TOKENS_PER_USER,
    MAX_USERS,
    Token,
    User,
    UserStore,
    _check_tags,
    _permissions,
    check_username,
)

__all__ = ["Users"]


class Users:
    """The broker's user and token commands (see the module docstring). Each validates
    everything before it changes anything, then applies and logs one record.

    Owns the :class:`UserStore` (``store``), which the API reads to authenticate."""

    def __init__(
        self, *, append: Callable[[int, bytes], int], wall_clock: Callable[[], float]
    ) -> None:
        self.store = UserStore()
        self._append = append
        self._wall_clock = wall_clock

    def _user_change(self, rtype: int, obj: dict[str, Any]) -> None:
        self.store.apply(rtype, obj)
        self._append(rtype, rec.encode_json(obj))

    def replay(self, rtype: int, payload: bytes) -> None:
        """Apply one user or token record during recovery."""
        self.store.apply(rtype, rec.decode_json(payload))

    def put_user(
        self,
        name: str,
        *,
        password: str | None,
        tags: Iterable[str] = (),
        permissions: dict[str, str] | None = None,
        keep_password: bool = False,
    ) -> bool:
        """Create or replace the user ``name``; return whether it was created.

        ``password`` is the hash string to keep; with ``keep_password`` an existing
        user's hash is kept when ``password`` is None (a change of tags or
        permissions only). Raises InvalidArgument for a bad name, tag or pattern, or
        past ``MAX_USERS``."""
        check_username(name)
        tag_tuple = _check_tags(list(tags))
        texts, _compiled = _permissions(permissions)
        existing = self.store.get(name)
        if existing is None and len(self.store) >= MAX_USERS:
            raise InvalidArgument(f"too many users (at most {MAX_USERS})", code="resource_limit")
        if password is None and keep_password and existing is not None:
            password = existing.password
        self._user_change(
            RecordType.USER, {"name": name, "password": password, "tags": list(tag_tuple), "permissions": texts}
        )
        return existing is None

    def set_permissions(self, name: str, permissions: dict[str, str]) -> None:
        """Replace the permissions of the user ``name``. Raises NotFound, InvalidArgument."""
        user = self._user(name)
        self.put_user(name, password=user.password, tags=user.tags, permissions=permissions)

    def delete_user(self, name: str) -> None:
        """Delete the user ``name`` and its tokens. Raises NotFound."""
        self._user(name)
        self._user_change(RecordType.USER_DELETE, {"name": name})

    def add_token(
        self, token_id: str, user: str, digest: str, *, expires_s: float | None, description: str = ""
    ) -> Token:
        """Keep a new token of ``user`` (its id and the digest of its secret, made by the
        API layer); ``expires_s`` is a wall-clock time or None (no expiry).

        Raises NotFound (no such user), InvalidArgument (a bad id, expiry or
        description, an id in use, or past ``MAX_TOKENS_PER_USER``)."""
        self._user(user)
        if not isinstance(token_id, str) or _TOKEN_ID_RE.fullmatch(token_id) is None or token_id in self.store.tokens:
            raise InvalidArgument("token id must be 16 hex digits, not in use")
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS:
            raise InvalidArgument(f"description must be a string of at most {MAX_DESCRIPTION_CHARS} characters")
        now = self._wall_clock()
        if expires_s is not None and not expires_s > now:
            raise InvalidArgument("a token's expiry must be in the future")
        if len(self.store.tokens_of(user)) >= MAX_TOKENS_PER_USER:
            raise InvalidArgument(f"user {user!r} has {MAX_TOKENS_PER_USER} tokens already", code="resource_limit")
        token = Token(token_id, user, digest, now, expires_s, description)
        self._user_change(RecordType.TOKEN, token.record())
        return self.store.tokens[token_id]

    def revoke_token(self, token_id: str) -> Token:
        """Forget a token at once. Raises NotFound."""
        token = self.store.tokens.get(token_id)
        if token is None:
            raise NotFound(f"no token {token_id[:32]!r}")
        self._user_change(RecordType.TOKEN_DELETE, {"id": token_id})
        return token

    def _user(self, name: str) -> User:
        user = self.store.get(name)
        if user is None:
            raise NotFound(f"no user {name[:64]!r}")
        return user


