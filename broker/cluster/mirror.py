"""Carries the cluster's metadata into the local core, through its public commands.

What a node's core holds in cluster mode:

- every exchange of the cluster (exchanges hold no messages);
- the classic queues this node owns, and only those: a queue's messages live on its
  owner; on the other nodes a queue is metadata only (``ClusterView``), which
  :func:`owner_of` answers from;
- the quorum queues this node leads, put there and taken away by the replication
  layer (:meth:`CoreMirror.hold_queue`, :meth:`CoreMirror.drop_queue`); a queue
  taken away while it lives on (this node stopped leading it) cancels its consumers
  with a reason of its own (:data:`QUEUE_MOVED`), which the channels tell apart from
  a delete: their consumers go on from the queue's next leader;
- the bindings whose source and destination are both in the core (to its own queues,
  and between exchanges); a binding to a queue owned elsewhere is metadata only;
- every user and token (``broker.cluster.users``).

``apply`` carries one watch batch's changes; ``reconcile`` makes the core match the
whole view (at start and after a gap in the watch), deleting what etcd no longer has.
A change the core refuses is logged and counted, never fatal: etcd is the source of
truth and the next change may repair it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from broker.cluster.reasons import QUEUE_MOVED, is_moved, moved_reason
from broker.cluster.users import UserMirror
from broker.cluster.view import (
    LEADER_LOCATOR,
    MASTER_LOCATOR,
    Change,
    ClusterView,
    is_replicated,
)
from broker.core import QUEUE_DELETED, Broker, ErrorReply

__all__ = ["QUEUE_MOVED", "CoreMirror", "core_arguments", "is_moved", "moved_reason"]

log = logging.getLogger("ackbus.cluster")

def core_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """A queue's arguments as the core takes them: placement is the cluster's business."""
    return {k: v for k, v in arguments.items() if k not in (LEADER_LOCATOR, MASTER_LOCATOR)}


class CoreMirror:
    """Applies cluster metadata to ``core`` for the node called ``node_name``."""

    def __init__(self, core: Broker, node_name: str) -> None:
        self.core = core
        self.node_name = node_name
        #: the last refusals (time-ordered), shown on /cluster
        self.errors: deque[str] = deque(maxlen=20)
        self.applied = 0
        self.users = UserMirror(core, self.errors)
        #: whether the replication layer holds this queue in the core (it leads it)
        self.holds: Callable[[str], bool] = lambda name: False
        #: called after users or tokens changed in the core (the authenticator's
        #: enforcement of revocations on what users hold open)
        self.on_users_changed: Callable[[], None] = lambda: None

    # ------------------------------------------------------------------ entry points

    def apply(self, changes: list[Change], view: ClusterView) -> None:
        self._apply(changes, view)
        if any(change.kind in ("users", "tokens") for change in changes):
            self.on_users_changed()

    def _apply(self, changes: list[Change], view: ClusterView) -> None:
        for change in changes:
            if change.kind == "exchanges":
                if change.new is None:
                    self._remove_exchange(change.name)
                else:
                    self._ensure_exchange(change.name, change.new, view)
            elif change.kind == "queues":
                d = change.new if change.new is not None else change.old
                if self.replicated(d) or self.connections_own(d):
                    continue  # replicated queues: the replication layer holds them
                if change.new is None or not self.keeps(change.new):
                    self._remove_queue(change.name)
                else:
                    self._ensure_queue(change.name, change.new, view)
            elif change.kind == "bindings":
                if change.new is None:
                    if change.old is not None:
                        self._unbind(change.old)
                else:
                    self._bind(change.new)
            elif change.kind == "users":
                if change.new is None:
                    self.users.delete_user(change.name)
                else:
                    self.users.put_user(change.new)
            elif change.kind == "tokens":
                if change.new is None:
                    self.users.revoke_token(change.name)
                else:
                    self.users.put_token(change.new)

    def reconcile(self, view: ClusterView) -> None:
        """Make the core match ``view`` entirely."""
        core = self.core
        wanted_x = {name for name in view.entries["exchanges"]}
        for name in [n for n, x in core.exchanges.items() if not x.builtin and n not in wanted_x]:
            self._remove_exchange(name)
        wanted_q = {
            n for n, (q, _r) in view.entries["queues"].items()
            if self.keeps(q) and not self.replicated(q) and not self.connections_own(q)
        }
        local_q = {n for n, (q, _r) in view.entries["queues"].items() if self.connections_own(q)}
        for name in [
            n for n, q in core.queues.items()
            if q.exclusive_owner is None and n not in wanted_q and n not in local_q and not self.holds(n)
        ]:
            self._remove_queue(name)
        for name, (value, _rev) in view.entries["exchanges"].items():
            self._ensure_exchange(name, value, view, rebind=False)
        for name in wanted_q:
            self._ensure_queue(name, view.entries["queues"][name][0], view, rebind=False)
        wanted_b = {_binding_tuple(b) for b in view.values("bindings")}
        for item in core.list_bindings():
            b = {
                "source": item["exchange"],
                "destination": item.get("queue", item.get("to_exchange")),
                "to_exchange": "to_exchange" in item,
                "routing_key": item["routing_key"],
                "arguments": item["arguments"],
            }
            if _binding_tuple(b) not in wanted_b:
                self._unbind(b)
        for b in view.values("bindings"):
            self._bind(b)
        self.users.reconcile(view)
        self.on_users_changed()

    def keeps(self, d: dict[str, Any]) -> bool:
        """Whether the core keeps the classic queue defined by ``d``: its owner's does
        (the cluster-wide routing table of ``broker.cluster.forward`` keeps every queue)."""
        return d.get("owner") == self.node_name

    def connections_own(self, d: dict[str, Any] | None) -> bool:
        """Whether queue ``d`` is a connection's own (exclusive or server-named:
        ``local``), made in its node's core by the gateway, not by this mirror."""
        return bool(d and d.get("local"))

    def made_by_gateway(self, name: str) -> bool:
        """Whether queue ``name`` of this core is a connection's own (see
        :meth:`connections_own`): this mirror neither deletes it nor binds it."""
        return self.core.views.is_local_queue(name)

    def replicated(self, d: dict[str, Any] | None) -> bool:
        """Whether queue ``d`` is left to the replication layer (a quorum queue: the
        core of its leader holds it, put there by :meth:`hold_queue`)."""
        return is_replicated(d)

    # ------------------------------------------------------- replicated queues

    def hold_queue(self, name: str, d: dict[str, Any], view: ClusterView) -> None:
        """Declare replicated queue ``name`` in the core, with its bindings (this node
        leads it)."""
        self._ensure_queue(name, d, view)

    def drop_queue(self, name: str, reason: str = QUEUE_DELETED) -> None:
        """Replicated queue ``name`` leaves the core (this node no longer leads it);
        its consumers are cancelled with ``reason`` (:func:`moved_reason` while the
        queue lives on elsewhere)."""
        self._remove_queue(name, reason)

    # ---------------------------------------------------------------------- steps

    def _attempt(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = fn(*args, **kwargs)
        except ErrorReply as exc:
            message = f"{what}: {exc.message}"
            self.errors.append(message)
            log.warning("cluster metadata not applied", extra={"fields": {"what": what, "error": exc.message}})
            return None
        self.applied += 1
        return result

    def _ensure_exchange(self, name: str, d: dict[str, Any], view: ClusterView, *, rebind: bool = True) -> None:
        settings = (d["type"], d["durable"], d["auto_delete"], d["internal"], d["arguments"])
        existing = self.core.exchanges.get(name)
        if existing is not None and existing.settings() == settings:
            return
        if existing is not None:
            self._remove_exchange(name)
        self._attempt(
            f"declare exchange {name!r}",
            self.core.declare_exchange,
            name,
            d["type"],
            durable=d["durable"],
            auto_delete=d["auto_delete"],
            internal=d["internal"],
            arguments=d["arguments"],
        )
        if rebind:
            for b in view.bindings_touching("exchanges", name).values():
                self._bind(b)

    def _ensure_queue(self, name: str, d: dict[str, Any], view: ClusterView, *, rebind: bool = True) -> None:
        arguments = core_arguments(d["arguments"])
        existing = self.core.queues.get(name)
        if existing is not None and existing.settings() == (d["durable"], False, d["auto_delete"], arguments):
            return
        if existing is not None:
            self._remove_queue(name)
        self._attempt(
            f"declare queue {name!r}",
            self.core.declare_queue,
            name,
            durable=d["durable"],
            auto_delete=d["auto_delete"],
            arguments=arguments,
            reserved_ok=True,  # (its name was checked where it was made: amq.gen-* by a node)
        )
        if rebind:
            for b in view.bindings_touching("queues", name).values():
                self._bind(b)

    def _remove_exchange(self, name: str) -> None:
        exchange = self.core.exchanges.get(name)
        if exchange is not None and not exchange.builtin:
            self._attempt(f"delete exchange {name!r}", self.core.delete_exchange, name)

    def _remove_queue(self, name: str, reason: str = QUEUE_DELETED) -> None:
        queue = self.core.queues.get(name)
        if queue is not None and not self.made_by_gateway(name):
            self._attempt(f"delete queue {name!r}", self.core.delete_queue, name, reason=reason)

    def _local(self, b: dict[str, Any]) -> bool:
        """Whether both ends of binding ``b`` are in this node's core."""
        if b["source"] not in self.core.exchanges:
            return False
        if b["to_exchange"]:
            return b["destination"] in self.core.exchanges
        return b["destination"] in self.core.queues and not self.made_by_gateway(b["destination"])

    def _bind(self, b: dict[str, Any]) -> None:
        if self._local(b):
            self._attempt(
                f"bind {b['source']!r} -> {b['destination']!r}",
                self.core.bind,
                b["source"],
                b["destination"],
                b["routing_key"],
                b["arguments"],
                to_exchange=b["to_exchange"],
            )

    def _unbind(self, b: dict[str, Any]) -> None:
        if not self._local(b):
            return
        try:
            self.core.unbind(b["source"], b["destination"], b["routing_key"], b["arguments"], to_exchange=b["to_exchange"])
        except ErrorReply:
            pass  # not bound here: nothing to undo


def _binding_tuple(b: dict[str, Any]) -> tuple[Any, ...]:
    return (b["source"], b["destination"], bool(b["to_exchange"]), b["routing_key"], repr(sorted(b["arguments"].items())))
