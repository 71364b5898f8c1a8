"""Who may do what: the one place REST, channels and streams ask (RabbitMQ's model).

``OPERATIONS`` is the table: each operation names the permissions it needs, on which
of its resources. Every entry point calls :meth:`Access.require` with the operation
and its resource names *before* it calls the core, so a refused operation changes
nothing. The rules are RabbitMQ's (its "how permissions work" table):

* declaring or deleting an exchange or a queue needs ``configure`` on it;
* publishing needs ``write`` on the exchange (the default exchange is ``amq.default``);
* binding or unbinding needs ``write`` on the destination (queue or exchange) and
  ``read`` on the source exchange;
* getting, consuming, purging, settling leases and browsing need ``read`` on the queue;
* taking, refreshing or releasing a lock needs ``write`` on the lock's name;
* putting a schedule needs ``configure`` on its name and ``write`` on the exchange its
  ticks publish to; deleting, pausing or resuming one needs ``configure`` on it;
* operator calls (users, tokens, metrics, redrive) need the ``administrator`` tag.

A refusal is :class:`~broker.core.AccessRefused` (``403 access_refused``; an ``error``
event with that code on a channel). An access caches its answers per name until the
user store changes (its ``generation``), so the check on a channel's publish path is a
dict lookup; a change of permissions takes effect on open channels at their next
operation, and a deleted user's channels are refused everything.
"""

from __future__ import annotations

from typing import Final

from broker.core import AccessRefused, User, UserStore

__all__ = ["ALLOW_ALL", "Access", "OPERATIONS", "access_for"]

#: operation -> ((permission, which resource), ...); "name" is the operation's main
#: resource, "source" the source exchange of a binding.
OPERATIONS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "declare_exchange": (("configure", "name"),),
    "delete_exchange": (("configure", "name"),),
    "declare_queue": (("configure", "name"),),
    "delete_queue": (("configure", "name"),),
    "publish": (("write", "name"),),
    "bind": (("write", "name"), ("read", "source")),
    "unbind": (("write", "name"), ("read", "source")),
    "get": (("read", "name"),),
    "consume": (("read", "name"),),
    "purge": (("read", "name"),),
    "settle": (("read", "name"),),
    "browse": (("read", "name"),),
    "redrive": (("administrator", ""), ("read", "name")),
    # locks and schedules (docs/coordination.md) are names in the same space: taking,
    # refreshing or releasing a lock writes it; a schedule is configured like a queue
    # and publishes to its exchange, so it needs write there as a publish does
    "lock": (("write", "name"),),
    "declare_schedule": (("configure", "name"), ("write", "source")),
    "delete_schedule": (("configure", "name"),),
    "administer": (("administrator", ""),),
}
#: Answers cached per access and permission before the cache starts over (a client
#: naming endless distinct queues must not grow it without bound).
_CACHE_MAX = 4096


class Access:
    """What one user may do. Built by the authenticator for each request (or channel);
    answers from a per-name cache that is dropped when the user store changes."""

    __slots__ = ("_cache", "_generation", "_store", "_user", "username")

    def __init__(self, store: UserStore, username: str) -> None:
        self._store = store
        self.username = username
        self._generation = -1
        self._user: User | None = None
        self._cache: dict[str, dict[str, bool]] = {}

    @property
    def administrator(self) -> bool:
        self._refresh()
        return self._user is not None and self._user.administrator

    def _refresh(self) -> None:
        if self._generation != self._store.generation:
            self._generation = self._store.generation
            self._user = self._store.get(self.username)
            self._cache = {}

    def allows(self, permission: str, name: str) -> bool:
        """Whether the user holds ``permission`` on ``name`` (or the administrator tag)."""
        self._refresh()
        user = self._user
        if user is None:
            return False
        if permission == "administrator":
            return user.administrator
        cache = self._cache.get(permission)
        if cache is None:
            cache = self._cache[permission] = {}
        answer = cache.get(name)
        if answer is None:
            if len(cache) >= _CACHE_MAX:
                cache.clear()
            answer = cache[name] = user.allows(permission, name)
        return answer

    def require(self, operation: str, name: str = "", *, source: str = "") -> None:
        """Raises AccessRefused unless the user may do ``operation`` on ``name`` (and
        ``source``, for a binding). An unknown operation is a bug: KeyError."""
        for permission, which in OPERATIONS[operation]:
            resource = source if which == "source" else name
            if not self.allows(permission, resource):
                if permission == "administrator":
                    raise AccessRefused(f"{operation} needs the administrator tag; user {self.username!r} has not")
                raise AccessRefused(
                    f"{operation} refused: user {self.username!r} has no {permission} permission on {resource!r}"
                )


class _AllowAll(Access):
    """The access of a request when no users exist (a loopback-only broker)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(UserStore(), "")

    @property
    def administrator(self) -> bool:
        return True

    def allows(self, permission: str, name: str) -> bool:
        return True

    def require(self, operation: str, name: str = "", *, source: str = "") -> None:
        OPERATIONS[operation]  # noqa: B018 - an unknown operation is a bug everywhere


ALLOW_ALL: Final[Access] = _AllowAll()


def access_for(request: object) -> Access:
    """The access of the request's principal (``ALLOW_ALL`` when nobody needed to
    authenticate: no guard, or no users)."""
    principal = getattr(request, "principal", None)
    return ALLOW_ALL if principal is None else principal.access
