"""Any node serves any queue: where a publish goes in the cluster, and forwarding it
to the nodes that own its queues.

**Routing happens on the node the publish arrives at.** Each node keeps a second,
message-less core (:class:`ClusterRoutes`) holding the whole cluster's topology:
every exchange, every queue (whoever owns it) and every binding, mirrored from the
view like the node's own core. Routing a publish there with the core's own ``route``
(exchange-to-exchange bindings, alternate exchanges, consistent hashing, the same
code as a single node) gives every queue it reaches; grouped by owner (a quorum
queue's owner is its leader, ``ClusterView.serving_node``), that is the
:class:`~broker.runtime.ForwardPlan`:

- queues of this node: the publish is published here as on a single node;
- queues of other live nodes: the publish, addressed to the *exchange* with its
  routing key, is forwarded once to each such owner over a persistent channel
  (:class:`~broker.cluster.peers.PeerChannel`), marked as forwarded. The owner routes
  it in its own core, which holds only its own queues and the bindings to them: it
  delivers to exactly its share of the queues, never to another node's (no double
  delivery through a fanout bound on several nodes), and never forwards it again;
- queues of dead nodes, and quorum queues without a leader: the publish is nacked
  with ``queue_unavailable`` (the queues that could take it keep it, as with a full
  queue).

The publish's confirm waits for every owner's (the core's ``hold_confirm``): an ack
once all acked, else the first nack's reason.

**Direct replies** (``amq.rabbitmq.reply-to.<address>`` on the default exchange,
broker/core/directreply.py) reach no queue, and their address names the requester's
node: one for another live node is forwarded to it like a publish to its queues, and
published here too (routing nowhere: its ``mandatory`` return, as RabbitMQ always
returns one). One for this node, a node that is gone, or no node is published here
alone, where the core delivers it or drops it.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Any

import trio

from broker.cluster.mirror import CoreMirror
from broker.cluster.peers import PeerChannel
from broker.cluster.view import Change, ClusterView
from broker.core import Broker, is_reply, reply_node
from broker.runtime import ForwardPlan

__all__ = ["ClusterRoutes", "Forwarder"]

log = logging.getLogger("ackbus.cluster")

_TOPOLOGY = ("exchanges", "queues", "bindings")


class _EveryQueue(CoreMirror):
    """A mirror whose core holds every queue of the cluster, quorum queues included."""

    def keeps(self, d: dict[str, Any]) -> bool:
        return True

    def replicated(self, d: dict[str, Any] | None) -> bool:
        return False

    def connections_own(self, d: dict[str, Any] | None) -> bool:
        return False

    def made_by_gateway(self, name: str) -> bool:
        return False


class ClusterRoutes:
    """The whole cluster's topology in a message-less core, for routing only."""

    def __init__(self) -> None:
        self.core = Broker(clock=lambda: 0.0, wall_clock=lambda: 0.0)
        self.mirror = _EveryQueue(self.core, "")
        #: whether it has read the view once (until then nothing is forwarded)
        self.synced = False

    def apply(self, changes: list[Change], view: ClusterView) -> None:
        wanted = [c for c in changes if c.kind in _TOPOLOGY]
        if wanted:
            self.mirror.apply(wanted, view)
            self.core.take_effects()

    def reconcile(self, view: ClusterView) -> None:
        self.mirror.reconcile(view)
        self.core.take_effects()
        self.synced = True

    def route(self, exchange: str, routing_key: str, headers: Any) -> list[str] | None:
        """The names of every queue a publish reaches (with the keys of its ``CC``
        and ``BCC`` headers too, as the owners' cores route it); None for an unknown
        exchange."""
        x = self.core.exchanges.get(exchange)
        if x is None:
            return None
        return [q.name for q in self.core.route_publish(x, routing_key, headers if isinstance(headers, dict) else None)]


class Forwarder:
    """The gateway's :class:`~broker.runtime.PublishForwarder` for one node (see the
    module docstring). ``serve`` runs the peer channels."""

    def __init__(
        self, node_name: str, view: ClusterView, *, secret: str | None, answer_timeout_s: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.node_name = node_name
        self.ssl_context = ssl_context
        #: how long an owner may leave a forwarded publish unanswered (then it is nacked)
        self.answer_timeout_s = answer_timeout_s
        self.view = view
        #: the node serving a queue (its definition given): the view's word, which the
        #: node refines (``ClusterNode.serving_node``: not this node unless it leads)
        self.serving: Callable[[str, dict[str, Any]], str | None] = view.serving_node
        #: whether this node leads quorum queue ``name`` (``Replication.holds``, set by
        #: the node: none without a data directory)
        self.leads: Callable[[str], bool] = lambda name: False
        self.secret = secret
        self.routes = ClusterRoutes()
        #: channels opened by peers: their publishes are already forwarded
        self.peer_channels: set[int] = set()
        self._peers: dict[str, PeerChannel] = {}
        self._nursery: trio.Nursery | None = None
        self.forwarded = 0

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                for peer in list(self._peers.values()):
                    peer.fail_all("queue_unavailable: this node is shutting down")

    # ------------------------------------------------------------ PublishForwarder

    def plan(self, channel_id: int, exchange: str, routing_key: str, headers: Any) -> ForwardPlan | None:
        if channel_id in self.peer_channels or not self.routes.synced or self._nursery is None:
            return None
        names = self.routes.route(exchange, routing_key, headers)
        if not names:
            if is_reply(exchange, routing_key):
                return self._reply_plan(routing_key)
            return None
        local = False
        owners: list[str] = []
        down: list[str] = []
        live = self.view.live_nodes()
        for name in names:
            owner = self._serving(name)
            if owner == self.node_name:
                local = True
            elif owner is None:
                down.append(f"{name!r} (no leader)")
            elif owner in live:
                if owner not in owners:
                    owners.append(owner)
            else:
                down.append(f"{name!r} (node {owner!r})")
        if not owners and not down:
            return None
        refused = None
        if down:
            refused = "queue_unavailable: the owners of queue " + ", ".join(down) + " are down"
        return ForwardPlan(local=local, owners=owners, refused=refused, routed=len(names))

    def _reply_plan(self, routing_key: str) -> ForwardPlan | None:
        """Where a direct reply goes (see the module docstring): None to publish it
        here alone."""
        node = reply_node(routing_key)
        if node is None or node == self.node_name or node not in self.view.live_nodes():
            return None
        return ForwardPlan(local=True, owners=[node], refused=None, routed=0)

    def dead_letter_owners(self, exchange: str, routing_key: str, properties: dict[str, Any]) -> tuple[list[str], list[str]]:
        """Where a dead letter that reached no queue of this node goes in the cluster
        (the same cycle rule as the core's: not back to a queue it died in, unless it
        was rejected): (the other nodes owning the queues it reaches, the queues it
        reaches that have no serving node now: a quorum queue without a leader)."""
        owners: list[str] = []
        leaderless: list[str] = []
        for name in self._dead_letter_queues(exchange, routing_key, properties):
            owner = self._serving(name)
            if owner is None:
                leaderless.append(name)
            elif owner != self.node_name and owner not in owners:
                owners.append(owner)
        return owners, leaderless

    def led_here(self, exchange: str, routing_key: str, properties: dict[str, Any]) -> list[str]:
        """The quorum queues a dead letter reaches that this node leads now (one may
        have come to lead them since the dead letter was held: its copy is made here)."""
        return [name for name in self._dead_letter_queues(exchange, routing_key, properties) if self.leads(name)]

    def _dead_letter_queues(self, exchange: str, routing_key: str, properties: dict[str, Any]) -> list[str]:
        """Every queue of the cluster a dead letter reaches, by the core's cycle rule:
        not back to a queue it died in, unless it was rejected."""
        headers = properties.get("headers")
        deaths = headers.get("x-death", []) if isinstance(headers, dict) else []
        names = self.routes.route(exchange, routing_key, headers) or []
        if not any(isinstance(d, dict) and d.get("reason") == "rejected" for d in deaths):
            dead_from = {d.get("queue") for d in deaths if isinstance(d, dict)}
            names = [n for n in names if n not in dead_from]
        return names

    def reaches_other_nodes(self, exchange: str, routing_key: str, properties: dict[str, Any]) -> bool:
        """The core's :class:`~broker.core.DeadLetterRoutes`: whether a dead letter
        that reaches queues of this node also reaches queues other nodes serve (or
        quorum queues without a leader now). True while the routes are not known yet
        (before the view was read): the dead letter is held, and
        :class:`~broker.cluster.dead_letters.DeadLetterForwarding` finds out once
        they are."""
        if not self.ready:
            return True
        owners, leaderless = self.dead_letter_owners(exchange, routing_key, properties)
        return bool(owners or leaderless)

    def needs_majority(self, queue: str) -> bool:
        """The core's :class:`~broker.core.DeadLetterRoutes`: whether ``queue``, a queue
        of this node's core, is a quorum queue this node leads. A dead letter's copy
        there must be on a majority of its replicas before its source lets it go, as a
        confirmed publish is: the core holds the source, and
        :class:`~broker.cluster.dead_letters.DeadLetterForwarding` makes the copy and
        waits for that majority."""
        return self.leads(queue)

    def node_serving(self, queue: str) -> str | None:
        """The node serving ``queue`` now: its owner, a quorum queue's leader (None: it
        has none now); this node for a queue the view does not have."""
        return self._serving(queue)

    @property
    def ready(self) -> bool:
        """Whether publishes can be routed and forwarded now (the view was read once,
        and the peer channels run)."""
        return self.routes.synced and self._nursery is not None

    def forward_dead_letter(self, exchange: str, routing_key: str, body: bytes, properties: dict[str, Any]) -> bool:
        """A dead letter that reached no queue of this node, and that the core could
        not hold (see ``dead_letters.py`` for the held, at-least-once path), forwarded
        to the owners of the queues it reaches in the cluster. At most once: the
        source queue has already let it go, so a refusal or an owner down is logged
        and the dead letter is gone. False when it reaches no queue anywhere."""
        if not self.ready:
            return False
        owners, _leaderless = self.dead_letter_owners(exchange, routing_key, properties)
        if not owners:
            return False
        for owner in owners:

            def settle(ack: bool, reason: str | None, owner: str = owner) -> None:
                if not ack:
                    log.warning(
                        "dead letter not taken by the node owning its queue: dropped",
                        extra={"fields": {"node": owner, "exchange": exchange, "reason": reason}},
                    )

            self.send(owner, exchange, routing_key, body, properties, None, settle)
        return True

    def _serving(self, queue: str) -> str | None:
        """The node serving ``queue``: its owner, a quorum queue's leader (None: it has
        none now); this node for a queue the view does not have."""
        d = self.view.get("queues", queue)
        return self.serving(queue, d) if d is not None else self.node_name

    def peer_channel(self, channel_id: int, opened: bool) -> None:
        if opened:
            self.peer_channels.add(channel_id)
        else:
            self.peer_channels.discard(channel_id)

    def send(
        self,
        owner: str,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: dict[str, Any] | None,
        delay_s: float | None,
        settle: Callable[[bool, str | None], None],
        *,
        dedup: bool = True,
    ) -> None:
        peer = self._peer(owner)
        if peer is None:
            self._later(settle, f"queue_unavailable: node {owner!r} is down")
            return
        self.forwarded += 1
        peer.queue_publish(exchange, routing_key, body, properties, delay_s, settle, dedup=dedup)

    # ------------------------------------------------------------------- peers

    def _peer(self, owner: str) -> PeerChannel | None:
        record = self.view.live_nodes().get(owner)
        nursery = self._nursery
        if record is None or nursery is None:
            return None
        url = str(record.get("url"))
        peer = self._peers.get(owner)
        if peer is None or peer.closed or peer.url != url:
            peer = self._peers[owner] = PeerChannel(
                owner, url, origin=self.node_name, secret=self.secret, answer_timeout_s=self.answer_timeout_s,
                ssl_context=self.ssl_context,
            )
            nursery.start_soon(peer.serve)
        return peer

    def _later(self, settle: Callable[[bool, str | None], None], reason: str) -> None:
        """Settle after the caller returns (never from within ``send``)."""
        if self._nursery is None:
            return

        async def settle_soon() -> None:
            settle(False, reason)

        self._nursery.start_soon(settle_soon)

    def info(self) -> dict[str, Any]:
        return {
            "forwarded": self.forwarded,
            "peers": {name: {"url": p.url, "connected": not p.closed, "sent": p.sent} for name, p in self._peers.items()},
        }
