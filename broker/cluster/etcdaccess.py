"""How a node gets into etcd: TLS to its endpoints, and etcd's users.

TLS (``https://`` endpoints): :func:`etcd_ssl_context` verifies etcd's certificate
against a CA bundle (or the system's CAs) and presents a client certificate when one
is given, for an etcd started with ``--client-cert-auth``.

Users (``etcd auth enable``): the JSON gateway wants, in each request's
``Authorization`` header, a token that ``/v3/auth/authenticate`` hands out for a user
name and password. :class:`EtcdTokens` holds the current one. etcd forgets a token
when it restarts and, for its default "simple" tokens, when it goes unused for
``--auth-token-ttl`` seconds; a request carrying a token etcd no longer accepts is
refused before anything of it is applied (etcd checks the token first, and a
permission check against an outdated auth revision also refuses the whole request),
so the client gets a new token and sends that request once more
(:func:`token_refused` tells such a refusal).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import trio

from broker.cluster.etcdproto import EtcdError, EtcdUnavailable
from broker.cluster.tlsfiles import client_tls_context

__all__ = [
    "EtcdAuthFailed",
    "EtcdCredentials",
    "EtcdTokens",
    "EtcdTLSRefused",
    "Token",
    "etcd_ssl_context",
    "read_password_file",
    "refused_by_tls",
    "start_tls",
    "tls_reason",
    "token_refused",
]

log = logging.getLogger("ackbus.cluster")

#: etcd's words for a request refused because of its token, none of it applied: a
#: token it does not know (expired, or etcd restarted), a permission check against an
#: auth store that changed since the token was issued, no token where auth is now on.
_TOKEN_REFUSALS: Final = ("invalid auth token", "revision of auth store is old", "user name is empty")

#: etcd's answer to an authentication while its auth is off.
_AUTH_NOT_ENABLED: Final = "authentication is not enabled"


class EtcdAuthFailed(EtcdUnavailable):
    """etcd refused this node's user name and password: etcd cannot be used (at start,
    the node refuses to start, as for an unreachable etcd)."""


@dataclass(frozen=True)
class EtcdCredentials:
    """An etcd user's name and password (the password never shown)."""

    user: str
    password: str = field(repr=False)


def etcd_ssl_context(ca_file: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    """The TLS context for ``https://`` etcd endpoints: etcd's certificate verified
    against ``ca_file`` (None: the system's CAs), and ``cert``/``key`` presented as
    the client certificate when given. Raises OSError naming the file that cannot be
    loaded."""
    return client_tls_context(ca_file, cert, key, ("etcd_ca_file", "etcd_cert", "etcd_key"))


class EtcdTLSRefused(OSError):
    """The TLS handshake with an etcd endpoint failed: we do not trust its certificate,
    or it refused ours (or wanted one)."""


async def start_tls(tcp: trio.SocketStream, host: str, ssl_context: ssl.SSLContext | None) -> trio.SSLStream[trio.SocketStream]:
    """TLS over ``tcp`` to etcd at ``host``, the handshake done (so that a refused
    certificate shows here, as an endpoint that cannot be reached). Closes ``tcp`` and
    raises EtcdTLSRefused when the handshake fails."""
    stream = trio.SSLStream(tcp, ssl_context or ssl.create_default_context(), server_hostname=host, https_compatible=True)
    try:
        await stream.do_handshake()
    except (trio.BrokenResourceError, ssl.SSLError) as exc:
        await tcp.aclose()
        raise EtcdTLSRefused(f"TLS handshake failed: {tls_reason(exc)}") from None
    except BaseException:
        await tcp.aclose()
        raise
    return stream


def tls_reason(exc: BaseException) -> str:
    """What a TLS failure (an ssl.SSLError, or trio's error wrapping one) says; for any
    other error, its text or else its type's name (trio's errors often have none)."""
    cause = exc if isinstance(exc, ssl.SSLError) else exc.__cause__ or exc.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {cause.verify_message}"
    if isinstance(cause, ssl.SSLError):
        return str(cause.reason or cause)
    return str(exc) or type(exc).__name__


def refused_by_tls(exc: BaseException) -> bool:
    """Whether a failed first read on a new TLS connection is etcd's TLS alert. With
    TLS 1.3 the server checks our certificate after our side of the handshake is done,
    so its refusal comes with the first read; it never read the request."""
    cause = exc.__cause__ or exc.__context__
    return isinstance(cause, ssl.SSLError) and "ALERT" in str(cause.reason or "").upper()


def read_password_file(path: Path) -> str:
    """The etcd password in ``path``: its text without the final line break. Raises
    OSError naming the file when it cannot be read or is empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OSError(getattr(exc, "errno", None), f"cannot read etcd_password_file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    password = text.removesuffix("\n").removesuffix("\r")
    if not password:
        raise OSError(None, f"etcd_password_file {path} is empty")
    return password


def token_refused(error: EtcdError | str) -> bool:
    """Whether etcd refused a request for its token (not applied: renew and resend)."""
    message = error if isinstance(error, str) else error.message
    return any(words in message for words in _TOKEN_REFUSALS)


@dataclass(frozen=True)
class Token:
    """The token requests carry now (None: none, etcd's auth is off), and which one it
    is, so that many requests refused for one token renew it once."""

    generation: int
    value: str | None


#: Sends an authentication request (its JSON body) to etcd; etcd's answer.
Authenticate = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class EtcdTokens:
    """The current token of one user, got on first use and renewed when etcd refuses
    it (see the module docstring); one authentication at a time."""

    def __init__(self, credentials: EtcdCredentials) -> None:
        self.credentials = credentials
        self._token: Token | None = None
        self._generation = 0
        self._lock = trio.Lock()
        #: authentications made (tests count renewals)
        self.authentications = 0
        #: authentication attempts ended (either way), and how the last one failed
        #: (None: it did not): the callers that waited on a failed one share its error
        self._attempts_ended = 0
        self._last_failure: EtcdError | None = None
        #: why the token was forgotten (:meth:`forget`), until the next one is got
        self._forgotten: str | None = None

    async def current(self, authenticate: Authenticate) -> Token:
        """The token to send, authenticating first when there is none yet."""
        if self._token is None:
            await self.renew(self._generation, authenticate)
        assert self._token is not None
        return self._token

    def forget(self, refused: Token, why: str = "a watch cancelled for its token") -> None:
        """etcd refused ``refused`` (a watch cancelled for it): the next call gets a new
        one, and the log says so (as for a call refused for its token)."""
        if self._token is refused:
            self._token = None
            self._forgotten = why

    async def renew(self, refused_generation: int, authenticate: Authenticate) -> Token:
        """A new token in place of generation ``refused_generation``; when another task
        renewed it meanwhile, that one. Raises EtcdAuthFailed for a wrong user or
        password, EtcdError/EtcdUnavailable as a call does. A caller that waited while
        an authentication failed gets that failure (a new one of its kind) rather than
        trying again in turn: many calls refused at once would otherwise each wait
        out an etcd that does not answer, one after another."""
        ended = self._attempts_ended
        async with self._lock:
            if self._token is not None and self._token.generation != refused_generation:
                return self._token
            failure = self._last_failure
            if failure is not None and self._attempts_ended != ended:
                raise type(failure)(failure.message, code=failure.code)
            try:
                return await self._authenticate(authenticate)
            except EtcdError as exc:
                self._last_failure = exc
                raise
            finally:
                self._attempts_ended += 1

    async def _authenticate(self, authenticate: Authenticate) -> Token:
        """One authentication: the new token (see :meth:`renew`)."""
        self._last_failure = None
        try:
            answer = await authenticate({"name": self.credentials.user, "password": self.credentials.password})
        except EtcdUnavailable:
            raise
        except EtcdError as exc:
            if _AUTH_NOT_ENABLED in exc.message:
                return self._set(None)
            raise EtcdAuthFailed(f"etcd refused user {self.credentials.user!r}: {exc.message}", code=exc.code) from None
        value = answer.get("token")
        if not isinstance(value, str) or not value:
            raise EtcdAuthFailed(f"etcd gave no token to user {self.credentials.user!r}")
        return self._set(value)

    def _set(self, value: str | None) -> Token:
        self.authentications += 1
        self._generation += 1
        if value is None and (self._token is None or self._token.value is not None):
            log.warning("etcd_user is set but etcd's authentication is off: calling etcd without a token",
                        extra={"fields": {"user": self.credentials.user}})
        self._token = Token(self._generation, value)
        if self._forgotten is not None:
            log.info("etcd token renewed", extra={"fields": {"why": self._forgotten}})
            self._forgotten = None
        return self._token
