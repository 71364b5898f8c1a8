"""Helpers of the security tests: users made straight in the core (their password
hashes computed once per process: each costs ~0.1 s) and credential headers."""

from __future__ import annotations

import base64
import functools
from typing import Any

from broker.api import hash_password

ALL = {"configure": ".*", "write": ".*", "read": ".*"}
NONE = {"configure": "", "write": "", "read": ""}


@functools.cache
def password_hash(password: str) -> str:
    return hash_password(password)


def basic(user: str, password: str) -> list[tuple[str, str]]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return [("Authorization", f"Basic {token}")]


def basic_headers(user: str, password: str) -> dict[str, str]:
    """:func:`basic` as a dict, for ``BrokerProcess.request``'s ``headers``."""
    return dict(basic(user, password))


def bearer(token: str) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {token}")]


def add_user(
    core: Any, name: str, password: str = "secret", *, tags: tuple[str, ...] = (), permissions: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """Create ``name`` in the core (a record in its log); return its Basic header."""
    core.put_user(name, password=password_hash(password), tags=tags, permissions=permissions if permissions is not None else ALL)
    return basic(name, password)
