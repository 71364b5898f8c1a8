"""Assembles one broker: settings -> runtime (core + log) -> API routes -> HTTP server,
and runs the serve/shutdown sequence."""

from __future__ import annotations

import ipaddress
import logging
import math
import ssl
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from broker.api import (
    Authenticator,
    BrokerMetrics,
    Listeners,
    api_error_bodies,
    build_router,
    cluster_routes,
    dispatch_cluster_first,
    http_error,
    protect,
)
from broker.config import Settings
from broker.http import HTTPServer, Limits, server_ssl_context
from broker.runtime import BrokerRuntime, RuntimeOptions

if TYPE_CHECKING:
    # Imported where they are used: a broker loads the AMQP listener only with an AMQP
    # port, and cluster mode only with --etcd (each ~15 ms of every start's CPU).
    from broker.amqp import AMQPServer
    from broker.cluster import ClusterConfig, ClusterNode, EtcdCredentials

__all__ = [
    "BrokerApp",
    "StartRefused",
    "TLSFiles",
    "build_app",
    "build_router",
    "http_limits",
    "is_loopback",
    "runtime_options",
]

log = logging.getLogger("ackbus.app")

#: How long past the shutdown deadline the final checkpoint may still take.
FINAL_CHECKPOINT_GRACE_S = 30.0


class StartRefused(Exception):
    """The broker will not serve as configured (no users, and not on loopback)."""


@dataclass(frozen=True)
class TLSFiles:
    """Where the server's certificate, key and (for mutual TLS) client CA are."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def load(self) -> ssl.SSLContext:
        """Raises OSError or ssl.SSLError (see ``broker.http.server_ssl_context``)."""
        return server_ssl_context(self.cert, self.key, self.client_ca)


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    if not host:
        return False  # every interface
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


class BrokerApp:
    """A runtime and its HTTP server, started and stopped together."""

    def __init__(
        self,
        runtime: BrokerRuntime,
        limits: Limits,
        *,
        metrics_handler: Any = None,
        tls: TLSFiles | None = None,
        amqp_port: int = 0,
        amqps_port: int = 0,
        cluster: ClusterConfig | None = None,
    ) -> None:
        """``amqp_port``/``amqps_port``: the AMQP 0-9-1 listeners (docs/amqp.md); 0 is
        off (AMQPS needs ``tls``)."""
        self.runtime = runtime
        #: Whether the server listens on loopback only (set by :meth:`serve`): then,
        #: and only then, requests are served without credentials while no user exists.
        self.loopback_only = True
        self.auth = Authenticator(runtime.core, runtime.options, open_without_users=lambda: self.loopback_only)
        #: every endpoint, behind the authenticator's guard; served behind the
        #: cross-site check (broker/api/csrf.py)
        #: the sockets this broker serves, recorded as they are bound (the management
        #: API's listeners and port checks, docs/management-api.md)
        self.listeners = Listeners()
        self.router = build_router(runtime, metrics_handler=metrics_handler, auth=self.auth, listeners=self.listeners)
        #: cluster mode (--etcd, docs/cluster.md): its routes answer first
        self.cluster: ClusterNode | None = None
        handler: Any = self.router
        if cluster is not None:
            from broker.cluster import ClusterNode

            self.cluster = ClusterNode(cluster, runtime)
            self.cluster.mirror.on_users_changed = self.auth.enforce_revocations
            if self.cluster.config.secret:
                self.auth.cluster_secret = self.cluster.config.secret.encode()
            handler = dispatch_cluster_first(
                cluster_routes(runtime, self.cluster, self.auth), self.router, self.cluster, self.auth
            )
        self.server = HTTPServer(
            # under /api/ the HTTP layer's refusals (401, 404, 405) in RabbitMQ's
            # bodies (docs/management-api.md)
            api_error_bodies(protect(handler)),
            limits=limits,
            error_translator=http_error,
        )
        self.tls = tls
        self.limits = limits
        self._scope: trio.CancelScope | None = None
        self.amqp_port = amqp_port
        self.amqps_port = amqps_port if tls is not None else 0
        #: The AMQP listeners (plain, then TLS), once serving.
        self.amqp_servers: list[AMQPServer] = []
        #: The TLS context new connections get (the HTTP server holds the same one).
        self._ssl_context: ssl.SSLContext | None = None

    def reload_tls(self) -> bool:
        """Read the TLS files again (SIGHUP): new connections get the new certificate,
        open ones keep theirs; in cluster mode the files that get the node into etcd
        and into its peers too (``ClusterNode.reload_credentials``). On a failure the
        old certificate stays in use; returns whether the listener's new one was loaded."""
        if self.cluster is not None:
            self.cluster.reload_credentials()
        if self.tls is None:
            return False
        try:
            context = self.tls.load()
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS files not reloaded; the old certificate stays in use", extra={"fields": {"error": str(exc)}})
            return False
        self.server.set_ssl_context(context)
        self._ssl_context = context
        log.info("TLS certificate reloaded", extra={"fields": {"cert": str(self.tls.cert)}})
        return True

    async def serve(
        self,
        host: str,
        port: int,
        *,
        task_status: trio.TaskStatus[BrokerApp] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen, recover and serve until :meth:`shutdown` (or cancellation).

        The socket is bound first, so that a busy address fails before recovery
        begins; requests during recovery get ``503 not_ready``.

        Secure default: on an address other than loopback, a broker whose recovered
        state has no user refuses to serve (as Redis's protected mode does); until
        then every request waits for recovery (503) or is refused (401).

        Raises: ``OSError`` naming the address when it cannot be bound; ``OSError`` or
        ``ssl.SSLError`` when the TLS files cannot be loaded; ``StartRefused``; whatever
        recovery raises (``broker.storage.StorageError`` for a corrupt log).
        """
        self.loopback_only = is_loopback(host)
        if self.tls is not None:
            self._ssl_context = self.tls.load()
            self.server.set_ssl_context(self._ssl_context)
        async with trio.open_nursery() as nursery:
            self._scope = nursery.cancel_scope
            if self.cluster is not None:
                await nursery.start(self._serve_cluster)
            try:
                await nursery.start(partial(self.server.serve_tcp, port, host=host))
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
            log.info(
                "listening",
                extra={"fields": {"host": host, "port": self.server.ports[0], "tls": self.server.tls}},
            )
            self.listeners.add("https" if self.server.tls else "http", host, self.server.ports[0])
            for amqp_port, secure in ((self.amqp_port, False), (self.amqps_port, True)):
                if amqp_port:
                    await self._serve_amqp(nursery, host, amqp_port, secure)
            await nursery.start(self.runtime.serve)
            if not self.loopback_only:
                nursery.start_soon(self._refuse_without_users, host)
            task_status.started(self)

    async def _serve_amqp(self, nursery: trio.Nursery, host: str, port: int, secure: bool) -> None:
        """Start one AMQP listener (bound before recovery, like the HTTP port, so a taken
        port fails the start). Raises OSError naming the address."""
        from broker.amqp import AMQPServer

        amqp = AMQPServer(
            self.runtime,
            login=self.auth.login,
            ssl_context=(lambda: self._ssl_context) if secure else (lambda: None),
            max_connections=self.limits.max_connections,
            max_connections_per_address=self.limits.max_connections_per_address,
        )
        await nursery.start(amqp.serve, host, port)
        self.amqp_servers.append(amqp)
        self.listeners.add("amqps" if secure else "amqp", host, amqp.ports[0])
        log.info("listening", extra={"fields": {"host": host, "port": amqp.ports[0], "protocol": "amqps" if secure else "amqp"}})

    @property
    def amqp_ports(self) -> list[int]:
        """The bound AMQP ports (plain first), for tests and logs."""
        return [amqp.ports[0] for amqp in self.amqp_servers]

    async def _serve_cluster(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The node's part in the cluster; refuses to start when its name is taken or
        etcd cannot be reached at start."""
        from broker.cluster import EtcdUnavailable, NodeNameTaken

        assert self.cluster is not None
        # except*: a name taken later (after a lapse, by another process) comes out of
        # the node's nursery inside an exception group.
        try:
            await self.cluster.serve(task_status=task_status)
        except* NodeNameTaken as group:
            raise StartRefused(str(group.exceptions[0])) from None
        except* EtcdUnavailable as group:
            raise StartRefused(f"cannot join the cluster: {group.exceptions[0]}") from None

    async def _refuse_without_users(self, host: str) -> None:
        """Once recovery has said whether users exist: none, and not on loopback, ends
        the broker (until then requests get 503, or 401 from the guard)."""
        await self.runtime.ready_event.wait()
        if not len(self.runtime.core.users):
            raise StartRefused(
                f"refusing to serve on {host}: no users exist, and without users only "
                "loopback (127.0.0.1) is served. Create one first: "
                "'python -m broker users add NAME --tags administrator --data-dir DIR' "
                "with the broker stopped (docs/security.md)"
            )

    @property
    def port(self) -> int:
        return self.server.ports[0]

    async def shutdown(self, timeout_s: float) -> bool:
        """Graceful shutdown: stop accepting, send ``closing`` to every channel, let
        in-flight publishes reach disk and get their confirms, end every channel
        (unacked deliveries go back to their queues), write a final checkpoint, close
        the log. Returns whether the clients were drained within ``timeout_s``.

        ``timeout_s`` bounds the wait for clients: 80 % of it for the log to sync what
        was received, the rest for connections to finish their responses; then they
        are cut. The final checkpoint follows (it is not cut short before
        ``FINAL_CHECKPOINT_GRACE_S`` more: skipping it would lose nothing, as the log
        holds everything, but makes the next start replay the whole log).

        Before recovery has finished there is nothing to drain or checkpoint: the
        broker stops at once (recovery itself runs to its end in its worker thread).
        """
        deadline = trio.current_time() + timeout_s
        self.server.stop_accepting()
        for amqp in self.amqp_servers:
            amqp.stop_accepting()
        if not self.runtime.ready:
            log.info("recovery still running: stopping once it has finished")
            await self.server.shutdown(grace_s=0)
            if self._scope is not None:
                self._scope.cancel()
            return True
        # Parked long-poll gets answer (empty) now rather than after the drain.
        self.runtime.shutting_down = True
        self.runtime.wake_getters()
        drained = await self.runtime.drain(timeout_s * 0.8)
        self.runtime.wake_getters()  # any that parked again meanwhile
        await self.server.shutdown(grace_s=max(0.0, deadline - trio.current_time()))
        with trio.move_on_at(deadline + FINAL_CHECKPOINT_GRACE_S if math.isfinite(deadline) else math.inf):
            await self.runtime.aclose(checkpoint=True)
        if self._scope is not None:
            self._scope.cancel()
        return drained


def runtime_options(settings: Settings) -> RuntimeOptions:
    """The runtime's (and the core's) options from ``settings``."""
    return settings.section(RuntimeOptions)


def http_limits(settings: Settings) -> Limits:
    """The HTTP server's limits from ``settings``."""
    return settings.section(Limits)


def tls_files(settings: Settings) -> TLSFiles | None:
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return TLSFiles(settings.tls_cert, settings.tls_key, settings.tls_client_ca)


def cluster_config(settings: Settings) -> ClusterConfig | None:
    """The cluster settings, or None for a single node (no ``etcd``)."""
    if not settings.etcd:
        return None
    from broker.cluster import ClusterConfig

    return ClusterConfig(
        settings.etcd, settings.node_name, settings.advertise_url, settings.cluster_name, settings.cluster_lease_ttl_s,
        settings.cluster_secret, settings.cluster_ca_file, settings.replica_compact_entries,
        etcd_ca_file=settings.etcd_ca_file, etcd_cert=settings.etcd_cert, etcd_key=settings.etcd_key,
        etcd_credentials=etcd_credentials(settings), etcd_password_file=settings.etcd_password_file,
        cluster_cert=settings.cluster_cert, cluster_key=settings.cluster_key,
    )


def etcd_credentials(settings: Settings) -> EtcdCredentials | None:
    """The etcd user and password (read from etcd_password_file when given), or None.
    Raises OSError naming a password file that cannot be read or is empty."""
    if not settings.etcd_user:
        return None
    from broker.cluster import EtcdCredentials, read_password_file

    if settings.etcd_password_file is not None:
        return EtcdCredentials(settings.etcd_user, read_password_file(settings.etcd_password_file))
    return EtcdCredentials(settings.etcd_user, settings.etcd_password)


def build_app(settings: Settings) -> BrokerApp:
    """A broker with metrics, built from ``settings`` (not started)."""
    metrics = BrokerMetrics()
    runtime = BrokerRuntime(runtime_options(settings), metrics=metrics)
    app = BrokerApp(
        runtime,
        http_limits(settings),
        metrics_handler=metrics.handler(runtime),
        tls=tls_files(settings),
        cluster=cluster_config(settings),
        amqp_port=settings.amqp_port,
        amqps_port=settings.amqps_port,
    )
    metrics.bind(runtime, app.server, app.auth)
    return app
