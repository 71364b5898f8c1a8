"""Authentication: passwords, API tokens, the router's guard, failed-login limits.

Rules (docs/security.md):

* **No users, loopback only.** While the user store is empty every request is served
  without credentials, as before users existed -- which the broker allows only when it
  listens on loopback (``broker.app`` refuses to start otherwise). If the last user is
  deleted while the broker listens on another address, every guarded request is
  refused, never served openly. Once a user exists, every route not registered as
  public needs credentials.
* **Credentials.** ``Authorization: Basic`` (RFC 7617: user name and password) or
  ``Authorization: Bearer <token>`` (RFC 6750: an API token). Anything else, or none,
  is ``401 unauthorized`` with a ``WWW-Authenticate`` challenge for both schemes.
* **Passwords** are kept as scrypt hashes (``hashlib.scrypt``: the standard library's
  memory-hard KDF, so no native dependency; N=2^15, r=8, p=1 -- 32 MiB and tens of
  milliseconds a try -- with a 16-byte random salt, parameters stored in the hash so
  they can be raised later). Hashing runs in worker threads, at most
  ``HASH_THREADS`` at a time (each takes 32 MiB), never on the event loop. A
  verified ``Authorization`` value is remembered for ``CACHE_TTL_S`` (keyed by its
  SHA-256, never kept in clear), so a REST client pays the hash once a minute, and a
  channel once per HTTP exchange. A user name that does not exist costs a hash too, so
  timing does not tell which names exist.
* **Tokens** are ``ackbus_<id>_<secret>``: 16 hex digits of id (to find the token)
  and 32 random bytes of secret. The secret is shown once, at creation; only its
  SHA-256 is kept (a fast hash is enough for 256 random bits, as for GitHub's and
  Stripe's tokens). Digests are compared with ``hmac.compare_digest``.
* **Failed logins** are counted over ``auth_failure_window_s`` per client address and
  login name (the user name of Basic credentials, the id of a token), and per client
  address alone. Past ``auth_failure_limit`` failures for one address and name, that
  address's attempts with that name, not already verified, are answered ``429
  too_many_failures`` with ``Retry-After`` without checking them, until the oldest
  failure leaves the window; other names from the same address (everyone behind one
  proxy or NAT) are still checked, until the address itself has
  ``ADDRESS_FAILURE_FACTOR`` times that many failures. Each failure is logged with
  the address and the user name, never the secret.
* **Revocation.** Every open channel, streaming consume and long-poll get registers
  with its user's :class:`Principal` (with the token it authenticated with, if any).
  After every change of users or tokens, :meth:`Authenticator.enforce_revocations`
  ends those of a deleted user or a revoked token at once (``401
  credentials_revoked``), and cancels each consumer, stream or long poll whose queue
  the user may no longer read (``access_refused``). Every other operation asks the
  permissions at its own time (``broker.api.permissions``), so a change applies from
  the next operation of every open channel, with no new login.
* **Per-user caps.** The guard counts each user's requests in progress (an HTTP/1.1
  connection serves one at a time, so this is the user's busy connections) against
  ``max_connections_per_user``; channels and consumers are counted by their handlers
  (:class:`Usage`). Over a cap: ``429 resource_limit`` (an ``error`` event on a
  channel).
"""

from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import trio

from broker.api.permissions import Access
from broker.core import Broker, BrokerError
from broker.http import HTTPError
from broker.runtime import RuntimeOptions

__all__ = [
    "Authenticator",
    "CredentialsRevoked",
    "Principal",
    "ResourceLimit",
    "Revocable",
    "Usage",
    "hash_password",
    "new_token",
    "token_digest",
    "verify_password",
]

log = logging.getLogger("ackbus.auth")

SCRYPT_LOG2_N: Final = 15
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
_SCRYPT_MAXMEM: Final = 256 << 20
_SALT_BYTES: Final = 16
_HASH_BYTES: Final = 32
#: Concurrent password hashes (32 MiB of memory each).
HASH_THREADS: Final = 2
#: How long a verified Authorization value is remembered.
CACHE_TTL_S: Final = 60.0
_CACHE_MAX: Final = 10_000
_ADDRESSES_MAX: Final = 65_536
#: The failed logins one address may make, all names together, are this many times
#: ``auth_failure_limit`` (the cap for one address and one name).
ADDRESS_FAILURE_FACTOR: Final = 10
TOKEN_PREFIX: Final = "ackbus_"
MAX_PASSWORD_BYTES: Final = 4096
_CHALLENGE: Final = (
    ("www-authenticate", 'Basic realm="ackbus", charset="UTF-8"'),
    ("www-authenticate", 'Bearer realm="ackbus"'),
)


class ResourceLimit(BrokerError):
    """A per-user cap was reached (connections, channels, consumers)."""

    code = "resource_limit"
    status = 429


class CredentialsRevoked(BrokerError):
    """The credentials an open channel, stream or long poll authenticated with are gone
    (the user was deleted, the token revoked)."""

    code = "credentials_revoked"
    status = 401


class Revocable(Protocol):
    """Something a user holds open past its request head: a channel, a streaming
    consume, a parked long-poll get."""

    def revoke(self, error: BrokerError) -> None:
        """The user's credentials are gone: end it now, saying ``error``."""

    def recheck(self, access: Access) -> None:
        """The user's permissions changed: stop what it may no longer read."""


# -- passwords and tokens -------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def hash_password(password: str) -> str:
    """A salted scrypt hash of ``password``: ``$scrypt$ln=15,r=8,p=1$<salt>$<hash>``.
    Blocking (tens of ms): call it in a worker thread from async code."""
    salt = secrets.token_bytes(_SALT_BYTES)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=1 << SCRYPT_LOG2_N, r=SCRYPT_R, p=SCRYPT_P,
        maxmem=_SCRYPT_MAXMEM, dklen=_HASH_BYTES,
    )
    return f"$scrypt$ln={SCRYPT_LOG2_N},r={SCRYPT_R},p={SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches the hash ``stored`` (constant-time comparison).
    False for a malformed hash. Blocking, as :func:`hash_password`."""
    try:
        _empty, scheme, params, salt_text, hash_text = stored.split("$")
        if scheme != "scrypt":
            return False
        fields = dict(part.split("=", 1) for part in params.split(","))
        log2_n, r, p = int(fields["ln"]), int(fields["r"]), int(fields["p"])
        if not (1 <= log2_n <= 20 and 1 <= r <= 32 and 1 <= p <= 16):
            return False
        salt, expected = _unb64(salt_text), _unb64(hash_text)
        digest = hashlib.scrypt(
            password.encode(), salt=salt, n=1 << log2_n, r=r, p=p, maxmem=_SCRYPT_MAXMEM, dklen=len(expected)
        )
    except (ValueError, KeyError, binascii.Error, MemoryError):
        return False
    return hmac.compare_digest(digest, expected)


def token_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token() -> tuple[str, str, str]:
    """A fresh token: ``(id, digest of its secret, the token text to show once)``."""
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return token_id, token_digest(secret), f"{TOKEN_PREFIX}{token_id}_{secret}"


def _parse_token(text: str) -> tuple[str, str] | None:
    if not text.startswith(TOKEN_PREFIX):
        return None
    token_id, sep, secret = text[len(TOKEN_PREFIX) :].partition("_")
    if not sep or len(token_id) != 16 or not secret:
        return None
    return token_id, secret


# -- who is asking --------------------------------------------------------------------


@dataclass(slots=True)
class Usage:
    """What one user holds open now, against the per-user caps."""

    #: Requests in progress (each holds one HTTP/1.1 connection).
    requests: int = 0
    #: The core channel ids of the user's open channels and streaming consumes.
    channels: set[int] = field(default_factory=set)
    #: Its channels, streams and long polls -> the token id each authenticated with
    #: (None: a password), for :meth:`Authenticator.enforce_revocations`.
    sessions: dict[Revocable, str | None] = field(default_factory=dict)


class Principal:
    """An authenticated user: its name, what it may do, and what it holds open; and, for
    one request, the token it authenticated with (``token_id``; None: a password)."""

    __slots__ = ("access", "limits", "token_id", "usage", "username")

    def __init__(self, access: Access, limits: RuntimeOptions, usage: Usage | None = None) -> None:
        self.username = access.username
        self.access = access
        self.limits = limits
        self.usage = usage if usage is not None else Usage()
        self.token_id: str | None = None

    def with_token(self, token_id: str) -> Principal:
        """The same user (same access and usage), authenticated with the token ``token_id``."""
        principal = Principal(self.access, self.limits, self.usage)
        principal.token_id = token_id
        return principal

    def open_session(self, session: Revocable) -> None:
        """Register a channel, stream or long poll, to be ended if the credentials go."""
        self.usage.sessions[session] = self.token_id

    def close_session(self, session: Revocable) -> None:
        self.usage.sessions.pop(session, None)

    def open_channel(self, channel_id: int) -> None:
        """Count a channel. Raises ResourceLimit past ``max_channels_per_user``."""
        cap = self.limits.max_channels_per_user
        if len(self.usage.channels) >= cap:
            raise ResourceLimit(f"user {self.username!r} has {cap} channels open (max_channels_per_user)")
        self.usage.channels.add(channel_id)

    def close_channel(self, channel_id: int) -> None:
        self.usage.channels.discard(channel_id)

    def check_consumer(self, core: Broker) -> None:
        """Raises ResourceLimit if the user already has ``max_consumers_per_user``
        consumers (counted from the core, so consumers the broker cancelled itself
        are not counted)."""
        cap = self.limits.max_consumers_per_user
        count = 0
        for channel_id in self.usage.channels:
            ch = core.channels.get(channel_id)
            if ch is not None:
                count += len(ch.consumers)
        if count >= cap:
            raise ResourceLimit(f"user {self.username!r} has {cap} consumers (max_consumers_per_user)")


# -- failed logins --------------------------------------------------------------------


class FailureLimiter:
    """Failed authentications per key (a client address, or an address and a login
    name) in a sliding window (times are arguments, so tests drive it synchronously)."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self._failures: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()

    def _recent(self, address: str, now: float) -> collections.deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def retry_after_s(self, address: str, now: float) -> float | None:
        """None if ``address`` may try; else seconds until it may."""
        times = self._recent(address, now)
        if times is None or len(times) < self.limit:
            return None
        return times[-self.limit] + self.window_s - now

    def record(self, address: str, now: float) -> int:
        """Count a failure; return the address's failures in the window."""
        times = self._recent(address, now)
        if times is None:
            times = self._failures[address] = collections.deque()
            if len(self._failures) > _ADDRESSES_MAX:
                self._failures.popitem(last=False)
        times.append(now)
        self._failures.move_to_end(address)
        return len(times)


def _address(remote: str | None) -> str:
    """The client's address without its port ("local" for a non-socket stream)."""
    if remote is None:
        return "local"
    host, _sep, _port = remote.rpartition(":")
    return host or remote


# -- the guard ------------------------------------------------------------------------


class Authenticator:
    """The router's guard (see the module docstring)."""

    def __init__(self, core: Broker, limits: RuntimeOptions, *, open_without_users: Callable[[], bool]) -> None:
        """``open_without_users()`` says whether the server listens on loopback only,
        where requests are served without credentials while no user exists."""
        self.core = core
        self.limits = limits
        self.open_without_users = open_without_users
        #: Failed logins per (address, login name): a user name, or a token's id.
        self.failures = FailureLimiter(limits.auth_failure_limit, limits.auth_failure_window_s)
        #: Failed logins per address, whatever the name (one client trying many names).
        self.address_failures = FailureLimiter(
            limits.auth_failure_limit * ADDRESS_FAILURE_FACTOR, limits.auth_failure_window_s
        )
        self.hashing = trio.CapacityLimiter(HASH_THREADS)
        # sha256(Authorization value) -> (user name, store generation, valid until)
        self._cache: dict[bytes, tuple[str, int, float]] = {}
        self._principals: dict[str, Principal] = {}
        self._dummy_hash: str | None = None
        #: Counters for metrics and tests.
        self.failed = 0
        self.refused = 0

    def principal(self, username: str) -> Principal:
        principal = self._principals.get(username)
        if principal is None:
            if len(self._principals) > 2 * max(len(self.core.users), 64):
                # forget principals of deleted users that hold nothing open
                for name, p in list(self._principals.items()):
                    if self.core.users.get(name) is None and not (p.usage.requests or p.usage.channels or p.usage.sessions):
                        del self._principals[name]
            principal = self._principals[username] = Principal(Access(self.core.users, username), self.limits)
        return principal

    def enforce_revocations(self) -> None:
        """Apply a change of users or tokens to what users hold open: end every channel,
        stream and long poll of a deleted user or a revoked token
        (:class:`CredentialsRevoked`), and let the others stop reading the queues their
        user may no longer read. Called after each change (``broker/api/rest/users.py``),
        in the same step, so no delivery falls between the change and this."""
        store = self.core.users
        for username, principal in list(self._principals.items()):
            sessions = principal.usage.sessions
            if not sessions:
                continue
            user_gone = store.get(username) is None
            for session, token_id in list(sessions.items()):
                if user_gone:
                    session.revoke(CredentialsRevoked(f"user {username!r} was deleted"))
                elif token_id is not None and token_id not in store.tokens:
                    session.revoke(CredentialsRevoked(f"token {token_id} of user {username!r} was revoked"))
                else:
                    session.recheck(principal.access)

    async def guard(self, request: Any) -> Callable[[], None] | None:
        """Authenticate ``request`` (sets ``request.principal``); returns what to call
        when its handler ends. Raises HTTPError: 401, or 429 (failure limit, per-user
        connection cap)."""
        store = self.core.users
        if not len(store):
            if self.open_without_users():
                return None
            raise HTTPError(
                "no users exist and the broker listens beyond loopback: create one with "
                "'python -m broker users add NAME'",
                code="unauthorized", status=401, headers=_CHALLENGE,
            )
        header = request.headers.get("authorization")
        if header is None:
            raise HTTPError("authentication required", code="unauthorized", status=401, headers=_CHALLENGE)
        key = hashlib.sha256(header.encode("utf-8", "surrogateescape")).digest()
        now = trio.current_time()
        hit = self._cache.get(key)
        token_id: str | None = None
        if hit is not None and hit[1] == store.generation and hit[2] > now:
            username = hit[0]
        else:
            username, token_id = await self._verify(request, header, key, now)
        principal = self.principal(username)
        if token_id is not None:
            principal = principal.with_token(token_id)
        usage = principal.usage
        if usage.requests >= self.limits.max_connections_per_user:
            raise HTTPError(
                f"user {username!r} has {self.limits.max_connections_per_user} requests in progress "
                "(max_connections_per_user)",
                code="resource_limit", status=429, headers=(("retry-after", "1"),),
            )
        usage.requests += 1
        request.principal = principal

        def release() -> None:
            usage.requests -= 1

        return release

    async def login(
        self, username: str, password: str, remote: str | None
    ) -> tuple[Principal, Callable[[], None]] | str | None:
        """Check a user name and password for a listener other than HTTP (AMQP's PLAIN
        and AMQPLAIN; the password may be one of the user's API tokens, and the name
        then may be empty), with the guard's failure limiters and per-user connection cap:
        (the principal, what to call when the connection ends), a refusal's reason
        (a cap, a limiter), or None for wrong credentials."""
        address = _address(remote)
        now = trio.current_time()
        login_key = f"{address} {username}"
        if (
            self.failures.retry_after_s(login_key, now) is not None
            or self.address_failures.retry_after_s(address, now) is not None
        ):
            self.refused += 1
            return "too many failed authentications for this user name, or from this address; try again later"
        token_id: str | None = None
        parsed = _parse_token(password)
        if parsed is not None:  # an API token in the password field (RabbitMQ's OAuth style)
            found = self._check_token(*parsed)
            token_id = parsed[0]
            if found is not None and username and username != found:
                found = None
        else:
            found = await self._check_password(username, password) if username else None
        if found is None:
            self.failed += 1
            count = self.failures.record(login_key, now)
            from_address = self.address_failures.record(address, now)
            log.warning(
                "authentication failed",
                extra={"fields": {
                    "remote": address, "scheme": "amqp", "user": username[:64],
                    "failures": count, "address_failures": from_address,
                }},
            )
            return None
        principal = self.principal(found)
        if token_id is not None:
            principal = principal.with_token(token_id)
        usage = principal.usage
        if usage.requests >= self.limits.max_connections_per_user:
            return f"user {found!r} has {self.limits.max_connections_per_user} connections (max_connections_per_user)"
        usage.requests += 1

        def release() -> None:
            usage.requests -= 1

        return principal, release

    async def _verify(self, request: Any, header: str, key: bytes, now: float) -> tuple[str, str | None]:
        """Check credentials not verified recently: (user name, token id or None).
        Raises HTTPError 401, or 429 while this address and login name, or this
        address, are over their failure limits (checked before any hash is spent)."""
        address = _address(request.remote)
        scheme, _sep, value = header.strip().partition(" ")
        scheme = scheme.lower()
        value = value.strip()
        name: str | None = None
        password = ""
        parsed: tuple[str, str] | None = None
        if scheme == "basic":
            name, password = _basic(value)
            login = name or ""
        elif scheme == "bearer":
            parsed = _parse_token(value)
            login = f"token {parsed[0]}" if parsed is not None else "token"
        else:
            login = ""
        login_key = f"{address} {login}"
        waits = [
            w for w in (self.failures.retry_after_s(login_key, now), self.address_failures.retry_after_s(address, now))
            if w is not None
        ]
        if waits:
            self.refused += 1
            raise HTTPError(
                "too many failed authentications for this user name, or from this address; try again later",
                code="too_many_failures", status=429, headers=(("retry-after", str(max(1, round(max(waits) + 0.5)))),),
            )
        username: str | None = None
        token_id: str | None = None
        if name is not None:
            username = await self._check_password(name, password)
        elif parsed is not None:
            username = self._check_token(*parsed)
            token_id = parsed[0]
        if username is None:
            self.failed += 1
            count = self.failures.record(login_key, now)
            from_address = self.address_failures.record(address, now)
            log.warning(
                "authentication failed",
                extra={"fields": {
                    "remote": address, "scheme": scheme[:16], "user": (name or "")[:64],
                    "failures": count, "address_failures": from_address,
                }},
            )
            raise HTTPError("invalid credentials", code="unauthorized", status=401, headers=_CHALLENGE)
        if token_id is None:  # tokens are cheap to check and may expire: not cached
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[key] = (username, self.core.users.generation, now + CACHE_TTL_S)
        return username, token_id

    async def _check_password(self, username: str, password: str) -> str | None:
        user = self.core.users.get(username)
        stored = user.password if user is not None else None
        if stored is None:
            # Spend the same time on a name that does not exist (or has no password).
            if self._dummy_hash is None:
                self._dummy_hash = await trio.to_thread.run_sync(hash_password, secrets.token_hex(8), limiter=self.hashing)
            stored = self._dummy_hash
            username = ""
        ok = await trio.to_thread.run_sync(verify_password, password, stored, limiter=self.hashing)
        if not ok or not username:
            return None
        # The user may have been deleted or changed while the hash ran.
        current = self.core.users.get(username)
        if current is None or current.password != stored:
            return None
        return username

    def _check_token(self, token_id: str, secret: str) -> str | None:
        token = self.core.users.tokens.get(token_id)
        digest = token_digest(secret)
        if token is None:
            hmac.compare_digest(digest, digest)  # same work either way
            return None
        if not hmac.compare_digest(digest, token.digest) or token.expired(self.core.wall_clock()):
            return None
        if self.core.users.get(token.user) is None:
            return None
        return token.user


def _basic(value: str) -> tuple[str, str] | tuple[None, str]:
    """(user, password) from Basic credentials (RFC 7617: base64 of ``user:password``,
    UTF-8); (None, "") if malformed."""
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None, ""
    user, sep, password = decoded.partition(":")
    if not sep or not user or len(password.encode()) > MAX_PASSWORD_BYTES:
        return None, ""
    return user, password
