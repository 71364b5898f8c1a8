"""One node of a cluster: membership, the view of etcd, the mirror into the core, and
the writer of metadata changes, run together.

``serve`` registers the node (refusing to start when its name is taken or etcd cannot
be reached), then, once the runtime has recovered, reads the whole cluster prefix,
reconciles the core with it, and follows a watch from that revision + 1. A watch that
breaks is reopened from the last revision applied; one whose history was compacted
away is replaced by a fresh range read (a resync). While etcd cannot be reached the
node keeps serving what it has and refuses metadata changes (:meth:`check_writable`:
``503``), and it recovers by itself when etcd answers again.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import trio

from broker.cluster.auto_deleted import AutoDeletedQueues
from broker.cluster.dead_letters import DeadLetterForwarding
from broker.cluster.etcd import EtcdClient, WatchMoved, WatchStream, parse_endpoints
from broker.cluster.etcdaccess import (
    EtcdCredentials,
    etcd_ssl_context,
    read_password_file,
)
from broker.cluster.etcdproto import EtcdError, EtcdUnavailable
from broker.cluster.forget import forget_node, report_depths
from broker.cluster.forward import Forwarder
from broker.cluster.leader import NO_LEADER
from broker.cluster.locks import ClusterLocks
from broker.cluster.membership import Membership, NodeNameTaken
from broker.cluster.mirror import CoreMirror
from broker.cluster.port import ClusterGatewayPort
from broker.cluster.replica_leader import COMPACT_AFTER_ENTRIES, CommitWatch
from broker.cluster.replica_set import change_replicas
from broker.cluster.replication import Replication
from broker.cluster.schedules import ClusterSchedules
from broker.cluster.tlsfiles import peer_ssl_context, reload_tls_files
from broker.cluster.users import UserWriter, seed_users
from broker.cluster.view import ClusterKeys, ClusterView, is_replicated
from broker.cluster.writes import MetadataWriter
from broker.core import DeadLetterHeld, ErrorReply, Unavailable
from broker.runtime import (
    BrokerRuntime,
    CommandGateway,
    take_held_dead_letters,
    tap_auto_deleted_queues,
)

__all__ = ["ClusterConfig", "ClusterNode", "NodeNameTaken"]

log = logging.getLogger("ackbus.cluster")

#: How long a change waits for this node's view to catch up with it before answering.
SEEN_TIMEOUT_S = 10.0
RETRY_MIN_S, RETRY_MAX_S = 0.1, 2.0


class ClusterConfig:
    """The cluster settings of one node."""

    def __init__(
        self,
        etcd: str,
        node_name: str,
        advertise_url: str,
        cluster_name: str,
        lease_ttl_s: int,
        secret: str | None = None,
        ca_file: Path | None = None,
        replica_compact_entries: int = COMPACT_AFTER_ENTRIES,
        *,
        etcd_ca_file: Path | None = None,
        etcd_cert: Path | None = None,
        etcd_key: Path | None = None,
        etcd_credentials: EtcdCredentials | None = None,
        etcd_password_file: Path | None = None,
        cluster_cert: Path | None = None,
        cluster_key: Path | None = None,
    ) -> None:
        self.endpoints = parse_endpoints(etcd)
        #: the files read again on SIGHUP (:meth:`ClusterNode.reload_credentials`)
        self.etcd_ca_file, self.etcd_cert, self.etcd_key = etcd_ca_file, etcd_cert, etcd_key
        self.ca_file, self.cluster_cert, self.cluster_key = ca_file, cluster_cert, cluster_key
        self.etcd_password_file = etcd_password_file
        #: verifies https etcd endpoints and holds the client certificate (None: plain http)
        self.etcd_ssl = etcd_ssl_context(etcd_ca_file, etcd_cert, etcd_key) if self.endpoints[0].tls else None
        #: the etcd user the node authenticates as (None: etcd's auth is off)
        self.etcd_credentials = etcd_credentials
        #: how nodes verify one another's https certificates (None: the system's CAs)
        #: and the client certificate a node presents to another (mutual TLS)
        self.peer_ssl = peer_ssl_context(ca_file, cluster_cert, cluster_key)
        #: authenticates the nodes to one another (``--cluster-secret``)
        self.secret = secret or None
        self.node_name = node_name
        self.advertise_url = advertise_url.rstrip("/")
        self.cluster_name = cluster_name
        self.lease_ttl_s = lease_ttl_s
        #: a quorum queue's replica compacts its log past this many entries
        self.replica_compact_entries = replica_compact_entries


class ClusterNode:
    """This node's part in the cluster (see the module docstring)."""

    def __init__(self, config: ClusterConfig, runtime: BrokerRuntime) -> None:
        self.config = config
        self.runtime = runtime
        self.name = config.node_name
        self.client = EtcdClient(
            config.endpoints, timeout_s=max(1.0, min(5.0, config.lease_ttl_s / 3)), ssl_context=config.etcd_ssl,
            credentials=config.etcd_credentials,
        )
        self.keys = ClusterKeys(config.cluster_name)
        self.view = ClusterView(self.keys)
        self.mirror = CoreMirror(runtime.core, self.name)
        self.membership = Membership(self.client, self.keys, self.name, config.advertise_url, config.lease_ttl_s)
        self.writer = MetadataWriter(self.client, self.keys, self.view, self.name, self.wait_seen)
        self.user_writer = UserWriter(self.client, self.keys, self.view, self.wait_seen)
        self.forwarder = Forwarder(
            self.name, self.view, secret=config.secret, answer_timeout_s=max(2.0, float(config.lease_ttl_s)),
            ssl_context=config.peer_ssl,
        )
        self.dead_letters = DeadLetterForwarding(
            self.forwarder, self._settle_dead_letter, self._copy_dead_letter, self._watch_commit
        )
        #: queues the core deleted by itself, deleted from etcd too (auto_deleted.py)
        self.auto_deleted = AutoDeletedQueues(
            self.writer, lambda queue: self.view.get("queues", queue),
            lambda queue, d: self.serving_node(queue, d) == self.name, lambda queue: queue in runtime.core.queues,
        )
        self.locks = ClusterLocks(self.client, self.keys)
        self.schedules = ClusterSchedules(self.client, self.keys, self.view, self.name)
        runtime.cluster = ClusterGatewayPort(
            self.forwarder, self.writer, runtime.core.views, self.name, self.check_writable, self.note_etcd, self.owner_of,
            lambda queue: is_replicated(self.view.get("queues", queue)), lambda: self.membership.lease,
            lambda queue: self.auto_deleted.forget(queue), self.locks, config.secret, config.peer_ssl,
        )
        #: None while etcd answers; else why it does not
        self.etcd_error: str | None = None
        self.synced = False
        self.resyncs = 0
        #: name -> wall-clock time this node saw the node's key vanish
        self.died_at: dict[str, float] = {}
        self._seen = trio.Condition()
        data_dir = runtime.options.data_dir
        #: quorum queues (docs/cluster.md, replication); None without a data directory
        self.replication = Replication(self, data_dir) if data_dir is not None else None
        if self.replication is not None:
            self.mirror.holds = self.replication.holds
            self.forwarder.leads = self.replication.holds
        self.forwarder.serving = self.serving_node

    def reload_credentials(self) -> None:
        """SIGHUP: read again the files that get this node into etcd and into its peers
        (``etcd_cert``/``etcd_key`` with ``etcd_ca_file``, ``cluster_cert``/``cluster_key``
        with ``cluster_ca_file``, ``etcd_password_file``), for certificates and
        passwords rotated while it runs. New connections use them; open ones keep
        theirs. A file that cannot be loaded leaves the old one in use (logged)."""
        config = self.config
        if config.etcd_ssl is not None:
            reload_tls_files(config.etcd_ssl, config.etcd_ca_file, config.etcd_cert, config.etcd_key, "etcd_cert")
        if config.peer_ssl is not None:
            reload_tls_files(config.peer_ssl, config.ca_file, config.cluster_cert, config.cluster_key, "cluster_cert")
        tokens = self.client.tokens
        if tokens is not None and config.etcd_password_file is not None:
            try:
                password = read_password_file(config.etcd_password_file)
            except OSError as exc:
                log.error("etcd_password_file not reloaded; the old password stays in use", extra={"fields": {"error": str(exc)}})
                return
            if password != tokens.credentials.password:
                # (the current token stays until etcd refuses it: then the new password)
                tokens.credentials = EtcdCredentials(tokens.credentials.user, password)
                log.info("etcd password reloaded")

    # ---------------------------------------------------------------------- running

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register (raising NodeNameTaken or EtcdUnavailable), report started, then
        keep the lease and the view current until cancelled; leaves on the way out."""
        self._hold_dead_letters()  # (before the runtime recovers: one dead at start is held too)
        tap_auto_deleted_queues(self.runtime, self.auto_deleted.take)
        self.membership.on_rejoined = lambda: self.auto_deleted.run_soon(self._put_back_local_queues)
        self.runtime.core.auto_delete_exchanges_here(False)  # etcd decides (writes.py)
        await self.membership.register()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.membership.keep_alive, self.note_etcd)
                nursery.start_soon(self.forwarder.serve)
                task_status.started()
                await self.runtime.ready_event.wait()
                await nursery.start(self.dead_letters.serve)
                await nursery.start(self.auto_deleted.serve)
                nursery.start_soon(report_depths, self.client, self.keys, self.name, self.runtime.core.views)
                nursery.start_soon(self.schedules.run, self._lease, self._publish_tick)
                if self.replication is not None:
                    nursery.start_soon(self.replication.serve)
                await self._follow()
        finally:
            self.runtime.cluster = None
            with trio.move_on_after(2) as scope:
                scope.shield = True
                await self.membership.leave()
                await self.client.aclose()

    def _hold_dead_letters(self) -> None:
        """Dead letters that reach queues of other nodes stay in their source queues,
        held by a core channel of the node's own, until those nodes took them
        (``dead_letters.py``); the forwarder's cluster-wide routes say which do."""
        gateway = CommandGateway(self.runtime)
        channel_id = gateway.open_channel()
        take_held_dead_letters(self.runtime, channel_id, self.dead_letters.take, self.forwarder)

    async def _put_back_local_queues(self) -> None:
        """This node joined again with a new lease: put its connections' own queues
        (exclusive, server-named) and the bindings to them in etcd again. The old
        lease took them away, and with them every other node's routing to them."""
        core, lease = self.runtime.core, self.membership.lease
        names = {name for name in core.views.queue_names() if core.views.is_local_queue(name)}
        for name in sorted(names):
            queue = core.queues.get(name)
            if queue is None:
                continue
            try:
                await self.writer.register_local_queue(
                    name, durable=queue.durable, auto_delete=queue.auto_delete,
                    exclusive=queue.exclusive_owner is not None, arguments=dict(queue.arguments), lease=lease,
                )
            except (ErrorReply, EtcdError) as exc:
                names.discard(name)
                log.warning("a connection's own queue is not routed to from other nodes any more",
                            extra={"fields": {"queue": name, "error": str(exc)}})
        for b in core.list_bindings():
            if b.get("queue") in names and b["exchange"]:
                try:
                    await self.writer.bind(b["exchange"], b["queue"], b["routing_key"], b["arguments"],
                                           to_exchange=False, lease=lease)
                except (ErrorReply, EtcdError) as exc:
                    log.warning("a binding to a connection's own queue is not in etcd any more",
                                extra={"fields": {"queue": b["queue"], "exchange": b["exchange"], "error": str(exc)}})

    def _settle_dead_letter(self, held: DeadLetterHeld) -> None:
        """``held`` was taken (or, a refused publish's, given up on): settled in its
        source queue, or its publish's confirm (a nack) released."""
        channel_id, tag = held.channel_id, held.delivery_tag
        if held.refused:
            CommandGateway(self.runtime).run(lambda core: core.settle_held_confirm(channel_id, tag, True, None))
        else:
            CommandGateway(self.runtime).run(lambda core: core.settle_held_dead_letter(channel_id, tag))

    def _copy_dead_letter(self, held: DeadLetterHeld, queues: list[str]) -> list[tuple[str, int]]:
        """A held dead letter's copy in quorum queues this node leads (``dead_letters.py``)."""
        return CommandGateway(self.runtime).run(
            lambda core: core.copy_held_dead_letter(queues, held.exchange, held.routing_key, held.body, held.properties)
        )

    def _watch_commit(self, queue: str, lsn: int) -> CommitWatch | None:
        replication = self.replication
        return replication.watch_commit(queue, lsn) if replication is not None else None

    def note_etcd(self, error: str | None) -> None:
        """Record whether etcd answered the last call (None) or why not."""
        if error != self.etcd_error:
            if error is None:
                log.info("etcd reachable again", extra={"fields": {"node": self.name}})
            else:
                log.warning("etcd unreachable", extra={"fields": {"node": self.name, "error": error}})
        self.etcd_error = error

    async def _follow(self) -> None:
        """Resync, then watch; after any failure, wait (backing off) and go again."""
        delay = RETRY_MIN_S
        needs_resync = True
        while True:
            try:
                if needs_resync:
                    await self._resync()
                    needs_resync = False
                needs_resync = await self._watch()
                delay = RETRY_MIN_S
            except EtcdError as exc:
                self.note_etcd(exc.message)
                await trio.sleep(delay)
                delay = min(RETRY_MAX_S, delay * 2)

    async def _resync(self) -> None:
        revision, kvs = await self.client.get_prefix(self.keys.root)
        changes = self.view.reset(revision, kvs)
        if await seed_users(self.client, self.keys, self.view, self.runtime.core):
            revision, kvs = await self.client.get_prefix(self.keys.root)
            changes = self.view.reset(revision, kvs)
        self._note_deaths(changes)
        self.mirror.reconcile(self.view)
        self.forwarder.routes.reconcile(self.view)
        self.runtime.pump()
        self.resyncs += 1
        self.synced = True
        self.note_etcd(None)
        if self.replication is not None:
            self.replication.changed()
        await self._notify_seen()

    async def _watch(self) -> bool:
        """Follow the watch until it fails (raises), its history is gone (returns
        True: resync), or etcd calls moved to another endpoint than the watch's
        (returns False: watch there; a cut-off member's watch is silent, not closed,
        and would leave the view stale, without a sign, until the cut heals)."""
        async with self.client.watch(self.keys.root, self.view.revision + 1) as stream:
            try:
                return await self._follow_watch(stream)
            except WatchMoved as exc:
                log.info("watching etcd elsewhere", extra={"fields": {"node": self.name, "why": str(exc)}})
                return False

    async def _follow_watch(self, stream: WatchStream) -> bool:
        """Apply the watch's messages; True when its history is gone (resync)."""
        async for batch in stream:
            if batch.compacted:
                log.info("watch history compacted: resyncing", extra={"fields": {"revision": batch.compacted}})
                return True
            if batch.canceled:
                raise EtcdUnavailable(f"etcd cancelled the watch: {batch.reason or 'no reason given'}")
            self.note_etcd(None)
            changes = self.view.apply(batch)
            self._note_deaths(changes)
            if changes:
                self.mirror.apply(changes, self.view)
                self.forwarder.routes.apply(changes, self.view)
                self.runtime.pump()
                if self.replication is not None:
                    self.replication.changed()
            await self._notify_seen()
        return False

    def _note_deaths(self, changes: list[Any]) -> None:
        for change in changes:
            if change.kind == "nodes":
                if change.new is None:
                    self.died_at[change.name] = time.time()
                else:
                    self.died_at.pop(change.name, None)

    async def _notify_seen(self) -> None:
        async with self._seen:
            self._seen.notify_all()

    async def wait_seen(self, revision: int) -> None:
        """Return once the view has applied ``revision`` (read-your-writes)."""
        with trio.move_on_after(SEEN_TIMEOUT_S):
            async with self._seen:
                while self.view.revision < revision:
                    await self._seen.wait()
                return
        raise Unavailable(
            f"etcd accepted the change (revision {revision}) but this node has not seen it within "
            f"{SEEN_TIMEOUT_S:g} s; it will apply it when its watch catches up",
            code="cluster_lagging",
        )

    def _lease(self) -> int:
        """This node's membership lease while it holds one (0: not a member now)."""
        return self.membership.lease if self.membership.registered and self.synced else 0

    async def _publish_tick(self, exchange: str, routing_key: str, body: bytes, properties: dict[str, Any]) -> str | None:
        """A schedule's tick, published through the gateway (forwarded to the queues'
        owners); None once acked, else why not."""
        try:
            outcome = await CommandGateway(self.runtime).publish_and_confirm(exchange, routing_key, body, properties)
        except ErrorReply as exc:
            return f"{exc.code}: {exc.message}"
        return None if outcome.ack else outcome.reason or "nacked"

    async def forget(self, name: str, *, rehome: bool) -> dict[str, Any]:
        """``DELETE /cluster/nodes/{name}`` (``broker.cluster.forget``)."""
        self.check_writable()
        return await forget_node(self.client, self.keys, self.view, name, rehome=rehome, wait_seen=self.wait_seen)

    async def change_replicas(self, queue: str, *, add: str | None, remove: str | None) -> dict[str, Any]:
        """``POST /queues/{queue}/replicas`` (``broker.cluster.replica_set``)."""
        self.check_writable()
        return await change_replicas(self.client, self.keys, self.view, queue, add=add, remove=remove, wait_seen=self.wait_seen)

    # --------------------------------------------------------------------- questions

    def check_writable(self) -> None:
        """Raise ``Unavailable`` (503) while metadata cannot be changed."""
        if self.etcd_error is not None:
            raise Unavailable(f"etcd is unreachable, so metadata cannot change now: {self.etcd_error}", code="etcd_unavailable")
        if not self.synced:
            raise Unavailable("this node has not read the cluster's metadata yet", code="etcd_unavailable")

    def owner_of(self, queue: str) -> tuple[str, str | None] | None:
        """The seam for forwarding: (owner node, its URL, None when it is not alive)
        of ``queue``, or None when the cluster has no such queue."""
        d = self.view.get("queues", queue)
        if d is None:
            return None
        owner = self.serving_node(queue, d)  # a quorum queue: its leader
        if owner is None:
            return NO_LEADER, None
        live = self.view.live_nodes().get(owner)
        return owner, (str(live["url"]) if live else None)

    def serving_node(self, queue: str, d: dict[str, Any]) -> str | None:
        """The node serving ``queue`` (definition ``d``) as far as this node can tell:
        its owner; a quorum queue's leader, None while it has none. None too when the
        leader key names this node but this node does not lead the queue: the key is
        stale. This node's lease was counted lost (cut off from etcd, whose watch then
        no longer updates the view, it stepped down), an earlier process of this node
        wrote it, or the election was won a moment ago and the queue is not in the core
        yet. Answering as a node that knows no leader (``queue_unavailable``, a
        retryable ``503``) sends clients to another node, where the queue may already
        have a new leader; routing the queue here would find no queue (``no_route``,
        or an ack of a publish routed nowhere)."""
        owner = self.view.serving_node(queue, d)
        if owner == self.name and is_replicated(d) and (self.replication is None or not self.replication.holds(queue)):
            return None
        return owner

    def health(self) -> dict[str, Any]:
        """This node's cluster state, for /healthz."""
        return {
            "node": self.name,
            "etcd": "ok" if self.etcd_error is None else "unavailable",
            **({"etcd_error": self.etcd_error} if self.etcd_error else {}),
            "member": self.membership.registered,
            "synced": self.synced,
        }

    def status(self) -> dict[str, Any]:
        """``GET /cluster``."""
        live = self.view.live_nodes()
        owned: dict[str, list[str]] = {}
        for name, (d, _rev) in sorted(self.view.entries["queues"].items()):
            owned.setdefault(str(d.get("owner")), []).append(name)
        names = sorted(set(self.view.entries["known"]) | set(live))
        nodes = []
        for name in names:
            record = live.get(name) or self.view.get("known", name) or {}
            nodes.append(
                {
                    "name": name,
                    "url": record.get("url"),
                    "alive": name in live,
                    "since": record.get("since") if name in live else self.died_at.get(name),
                    "queues": owned.get(name, []),
                    "this_node": name == self.name,
                }
            )
        return {
            "enabled": True,
            "cluster_name": self.config.cluster_name,
            "node": self.name,
            "url": self.config.advertise_url,
            "revision": self.view.revision,
            "synced": self.synced,
            "member": self.membership.registered,
            "lease_ttl_s": self.config.lease_ttl_s,
            "etcd": {
                "ok": self.etcd_error is None,
                "error": self.etcd_error,
                "endpoints": [e.info() for e in self.client.endpoints],
            },
            "nodes": nodes,
            "forwarding": {**self.forwarder.info(), "dead_letters": self.dead_letters.info()},
            "schedules_runner": self.schedules.running,
            "replicated_queues": self.replicated_queues(),
            "apply_errors": list(self.mirror.errors),
        }

    def replicated_queues(self) -> dict[str, Any]:
        """Each quorum queue's leader, followers, in-sync set, epoch and lags."""
        if self.replication is None:
            return {}
        return {
            name: self.replication.status(name, d)
            for name, (d, _rev) in sorted(self.view.entries["queues"].items())
            if is_replicated(d)
        }
