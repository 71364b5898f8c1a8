"""Who may do what: the one place REST, channels and streams ask (RabbitMQ's model).

``OPERATIONS`` is the table: each operation names the permissions it needs, on which
of its resources. Every entry point calls :meth:`Access.require` with the operation
and its resource names *before* it calls the core, so a refused operation changes
nothing. The rules are RabbitMQ's (its "how permissions work" table):

* declaring or deleting an exchange or a queue needs ``configure`` on it;
* publishing needs ``write`` on the exchange (the default exchange is ``amq.default``);
* binding or unbinding needs ``write`` on the destination (queue or exchange) and
  ``read`` on the source exchange (any exchange type, ``x-consistent-hash`` included);
* an argument that makes the broker publish on the declarer's behalf needs ``write``
  on the exchange it names and ``read`` on the entity declared, in addition to
  ``configure`` (RabbitMQ's ``rabbit_channel`` checks): ``x-dead-letter-exchange`` on a
  queue, ``alternate-exchange`` on an exchange (``PUBLISHING_ARGUMENTS``);
* getting, consuming, purging, settling leases and browsing need ``read`` on the queue;
* taking, refreshing or releasing a lock needs ``write`` on the lock's name;
* putting a schedule needs ``configure`` on its name and ``write`` on the exchange its
  ticks publish to; deleting, pausing or resuming one needs ``configure`` on it;
* operator calls (users, tokens, metrics, redrive) need the ``administrator`` tag; a
  redrive also needs ``read`` on the queue it empties and ``write`` on the exchange it
  publishes to (the default exchange when it returns messages to their queues).

A refusal is :class:`~broker.core.AccessRefused` (``403 access_refused``; an ``error``
event with that code on a channel). An access caches its answers per name until the
user store changes (its ``generation``), so the check on a channel's publish path is a
dict lookup; a change of permissions takes effect on open channels at their next
operation, and a deleted user's channels are refused everything (``broker.api.auth``
also ends them, and the consumers whose ``read`` was revoked: see ``Authenticator.
enforce_revocations``).
"""

from __future__ import annotations

from typing import Final

from broker.core import AccessRefused, User, UserStore

__all__ = ["ALLOW_ALL", "DEFAULT_EXCHANGE_NAME", "PUBLISHING_ARGUMENTS", "Access", "OPERATIONS", "access_for"]

#: The name the default exchange ("") is checked as (RabbitMQ's ``amq.default``; the
#: same name REST paths give it, ``broker.api.rest.DEFAULT_EXCHANGE_ALIAS``).
DEFAULT_EXCHANGE_NAME: Final = "amq.default"

#: operation -> ((permission, which resource), ...); "name" is the operation's main
#: resource, "source" the source exchange of a binding (and the exchange a schedule
#: publishes to), "target" the exchange the broker publishes to on the user's behalf
#: (a dead-letter or alternate exchange, a redrive's destination).
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
    "redrive": (("administrator", ""), ("read", "name"), ("write", "target")),
    # declaring with an argument of PUBLISHING_ARGUMENTS is also one of these
    "dead_letter_exchange": (("read", "name"), ("write", "target")),
    "alternate_exchange": (("read", "name"), ("write", "target")),
    # locks and schedules (docs/coordination.md) are names in the same space: taking,
    # refreshing or releasing a lock writes it; a schedule is configured like a queue
    # and publishes to its exchange, so it needs write there as a publish does
    "lock": (("write", "name"),),
    "declare_schedule": (("configure", "name"), ("write", "source")),
    "delete_schedule": (("configure", "name"),),
    "administer": (("administrator", ""),),
}
#: declare operation -> ((argument, the operation declaring with it also is), ...):
#: the arguments naming an exchange the broker will publish to for the declarer.
PUBLISHING_ARGUMENTS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "declare_queue": (("x-dead-letter-exchange", "dead_letter_exchange"),),
    "declare_exchange": (("alternate-exchange", "alternate_exchange"),),
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

    def require(self, operation: str, name: str = "", *, source: str = "", target: str = "") -> None:
        """Raises AccessRefused unless the user may do ``operation`` on ``name`` (and
        ``source``, for a binding; ``target``, the exchange it makes the broker publish
        to). An unknown operation is a bug: KeyError."""
        for permission, which in OPERATIONS[operation]:
            resource = name if which == "name" else source if which == "source" else target
            if not self.allows(permission, resource):
                if permission == "administrator":
                    raise AccessRefused(f"{operation} needs the administrator tag; user {self.username!r} has not")
                raise AccessRefused(
                    f"{operation} refused: user {self.username!r} has no {permission} permission on {resource!r}"
                )

    def require_declare(self, operation: str, name: str, arguments: object) -> None:
        """``require(operation, name)`` for a declare, and for each argument of
        ``PUBLISHING_ARGUMENTS`` it carries, the operation that argument implies on the
        exchange it names ("" is the default exchange, ``amq.default``). Arguments of
        the wrong type are left to the core to refuse."""
        self.require(operation, name)
        if not isinstance(arguments, dict):
            return
        for argument, implied in PUBLISHING_ARGUMENTS.get(operation, ()):
            exchange = arguments.get(argument)
            if isinstance(exchange, str):
                self.require(implied, name, target=exchange or DEFAULT_EXCHANGE_NAME)


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

    def require(self, operation: str, name: str = "", *, source: str = "", target: str = "") -> None:
        OPERATIONS[operation]  # noqa: B018 - an unknown operation is a bug everywhere


ALLOW_ALL: Final[Access] = _AllowAll()


def access_for(request: object) -> Access:
    """The access of the request's principal (``ALLOW_ALL`` when nobody needed to
    authenticate: no guard, or no users)."""
    principal = getattr(request, "principal", None)
    return ALLOW_ALL if principal is None else principal.access
