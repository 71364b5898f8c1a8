"""Read-only queries of the broker's state, for the edges (REST, metrics, channels).

The API and the metrics read the core through :class:`BrokerViews`
(``Broker.views``), never through its live dicts: each method answers with plain
values (numbers, names, JSON-ready dicts, lists it built), so nothing outside the
core holds a reference into its state or can change it by accident, and the core's
classes can be reorganised without touching the API.

The per-queue numbers the API sorts by and the metrics export are one table,
:data:`QUEUE_COUNTERS`, so a queue list and a dashboard never disagree on what
"messages ready" means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .entities import Exchange, Queue
from .names import SERVER_NAMED_PREFIX

__all__ = ["QUEUE_COUNTERS", "BrokerViews"]

#: Name -> one queue's number, as the queue list sorts by it and the metrics export it.
QUEUE_COUNTERS: dict[str, Callable[[Queue], int]] = {
    "messages": lambda q: q.ready_count() + q.unacked,
    "messages_ready": lambda q: q.ready_count(),
    "messages_unacked": lambda q: q.unacked,
    "messages_delayed": lambda q: len(q.delayed),
    "messages_paged_out": lambda q: q.paged_count(),
    "consumers": lambda q: len(q.consumers),
    "published": lambda q: q.published,
    "delivered": lambda q: q.delivered,
    "acked": lambda q: q.acked,
    "redelivered": lambda q: q.redelivered,
}


def _with_stats(exchange: Exchange) -> dict[str, Any]:
    """An exchange's settings and its message counters."""
    info = exchange.info()
    info["message_stats"] = {"messages_in": exchange.messages_in, "messages_out": exchange.messages_out}
    return info


class BrokerViews:
    """Read-only queries of one :class:`~broker.core.Broker` (see the module docstring)."""

    __slots__ = ("_core",)

    def __init__(self, core: Any) -> None:
        # ``core`` is the Broker facade, which exposes this class as ``Broker.views``
        # (typed loosely: the facade's module imports this one, never the reverse).
        self._core = core

    # ------------------------------------------------------------- exchanges

    def exchange_exists(self, name: str) -> bool:
        return name in self._core.exchanges

    def exchange_infos(self) -> list[dict[str, Any]]:
        """Every exchange's settings, in declaration order (names as stored: ``""`` is
        the default exchange)."""
        return [_with_stats(x) for x in self._core.exchanges.values()]

    def exchange_info(self, name: str) -> dict[str, Any] | None:
        """One exchange's settings and the bindings from it; None if it does not exist."""
        exchange = self._core.exchanges.get(name)
        if exchange is None:
            return None
        info: dict[str, Any] = _with_stats(exchange)
        info["bindings"] = [b for b in self._core.list_bindings() if b["exchange"] == name]
        return info

    def exchange_counters(self, counter: str) -> dict[str, int]:
        """``messages_in`` or ``messages_out`` of every exchange, by name."""
        return {name: getattr(x, counter) for name, x in self._core.exchanges.items()}

    def bindings(self) -> list[dict[str, Any]]:
        """Every binding (``exchange``, ``routing_key``, ``arguments``, and ``queue``
        or ``to_exchange``)."""
        result: list[dict[str, Any]] = self._core.list_bindings()
        return result

    # ---------------------------------------------------------------- queues

    def queue_exists(self, name: str) -> bool:
        return name in self._core.queues

    def is_local_queue(self, name: str) -> bool:
        """Whether queue ``name`` is in this core for one connection alone: exclusive,
        or server-named (``amq.gen-``); in a cluster it lives on this node only."""
        queue = self._core.queues.get(name)
        return queue is not None and (queue.exclusive_owner is not None or name.startswith(SERVER_NAMED_PREFIX))

    def queue_count(self) -> int:
        return len(self._core.queues)

    def queue_names(self) -> list[str]:
        """Every queue's name, in declaration order."""
        return list(self._core.queues)

    def queue_info(self, name: str) -> dict[str, Any] | None:
        """``GET /queues/{name}``'s answer; None if the queue does not exist."""
        queue = self._core.queues.get(name)
        return self._core.queue_info(queue) if queue is not None else None

    def queue_infos(self) -> list[dict[str, Any]]:
        core = self._core
        return [core.queue_info(q) for q in core.queues.values()]

    def queue_counter(self, counter: str, name: str) -> int | None:
        """One number of :data:`QUEUE_COUNTERS` for queue ``name`` (None: no such queue)."""
        queue = self._core.queues.get(name)
        return QUEUE_COUNTERS[counter](queue) if queue is not None else None

    def queue_counters(self, counter: str) -> dict[str, int]:
        """One number of :data:`QUEUE_COUNTERS` for every queue, by name."""
        read = QUEUE_COUNTERS[counter]
        return {q.name: read(q) for q in self._core.queues.values()}

    def dead_lettered(self) -> dict[tuple[str, str], int]:
        """Messages dead-lettered, by (queue, reason)."""
        return {
            (q.name, reason): n for q in self._core.queues.values() for reason, n in q.dead_lettered.items()
        }

    def paged_out_total(self) -> int:
        """Queued messages whose body is only in the log (a running count: O(1))."""
        paged: int = self._core.counts.paged
        return paged

    def read_blocked_queues(self) -> dict[str, str]:
        """Queues waiting to read their next message back from the log, and why."""
        return {q.name: q.read_failure for q in self._core.queues.values() if q.read_failure is not None}

    # -------------------------------------------------------------- channels

    def channel_exists(self, channel_id: int) -> bool:
        return channel_id in self._core.channels

    def channel_info(self, channel_id: int) -> dict[str, Any] | None:
        """What the core knows of an open channel (``GET /channels/{id}`` adds who
        opened it); None if it is not open."""
        ch = self._core.channels.get(channel_id)
        if ch is None:
            return None
        return {
            "id": channel_id,
            "prefetch": ch.prefetch,
            "default_prefetch": ch.default_prefetch,
            "unacked": ch.unacked,
            "publishes": ch.publish_seq,
            "deliveries": ch.next_tag - 1,
            "pending_confirms": len(ch.confirms),
            "transactional": ch.tx is not None,
            "consumers": [
                {
                    "consumer_tag": c.tag,
                    "queue": c.queue.name,
                    "prefetch": c.prefetch,
                    "unacked": c.unacked,
                    "no_ack": c.no_ack,
                    "exclusive": c.exclusive,
                }
                for c in ch.consumers.values()
            ],
        }

    def consumer_tags(self, channel_id: int) -> list[str]:
        """The consumers of a channel (none if it is not open)."""
        ch = self._core.channels.get(channel_id)
        return list(ch.consumers) if ch is not None else []

    def consumer_queues(self, channel_id: int) -> list[tuple[str, str]]:
        """(consumer tag, queue name) of every consumer of a channel."""
        ch = self._core.channels.get(channel_id)
        return [(tag, c.queue.name) for tag, c in ch.consumers.items()] if ch is not None else []

    def has_consumer(self, channel_id: int, consumer_tag: str) -> bool:
        """Whether ``consumer_tag`` is one of the channel's queue consumers in this
        core (not whether the tag is taken: :meth:`consumer_tag_taken`)."""
        ch = self._core.channels.get(channel_id)
        return ch is not None and consumer_tag in ch.consumers

    def consumer_tag_taken(self, channel_id: int, consumer_tag: str) -> bool:
        """Whether a consumer of the channel, of any kind, has ``consumer_tag``
        (``ConsumerTags``: queue, reply and held tags alike)."""
        return bool(self._core.deliveries.tags.is_taken(channel_id, consumer_tag))

    def reply_exists(self, name: str) -> bool:
        """Whether ``name`` is direct reply-to's pseudo-queue or a live reply address
        (``DirectReplies.reply_exists``)."""
        return bool(self._core.replies.reply_exists(name))

    def reply_address(self, channel_id: int) -> str | None:
        """The channel's direct reply-to address (None: no reply consumer)."""
        address: str | None = self._core.replies.reply_address(channel_id)
        return address

    def pending_confirms(self, channel_id: int) -> int:
        """Publishes of the channel still waiting for their confirm (0 if it is not open)."""
        ch = self._core.channels.get(channel_id)
        return len(ch.confirms) if ch is not None else 0

    def channel_settled(self, channel_id: int) -> bool:
        """Whether the channel has nothing left to settle: every publish confirmed and
        no delivery unacked (true if it is not open)."""
        ch = self._core.channels.get(channel_id)
        return ch is None or (not ch.deliveries and not len(ch.confirms))

    def unacked_tags(self, channel_id: int, tags: list[int]) -> list[int]:
        """Those of ``tags`` still delivered and unsettled on the channel."""
        ch = self._core.channels.get(channel_id)
        if ch is None:
            return []
        deliveries = ch.deliveries
        return [tag for tag in tags if tag in deliveries]

    def newest_unacked_tag(self, channel_id: int, upto: int | None = None) -> int:
        """The channel's newest delivery tag still unsettled, at most ``upto`` (0:
        none): what an AMQP ``multiple`` settle of tag 0, or up to a tag, reaches. In
        the channel's unsettled deliveries, not in every tag it ever used."""
        ch = self._core.channels.get(channel_id)
        if ch is None:
            return 0
        return max((tag for tag in ch.deliveries if upto is None or tag <= upto), default=0)

    # ------------------------------------------------------- broker-wide state

    def storage_ok(self) -> bool:
        return bool(self._core.storage_ok)

    def publish_refusal(self) -> str | None:
        """Why persistent publishes are refused right now (the disk is nearly full)."""
        refusal: str | None = self._core.publish_refusal
        return refusal

    def stats(self) -> dict[str, int]:
        """The broker-wide counters (published, nacked, returned, deduplicated, ...)."""
        return dict(self._core.stats)

    def stat(self, name: str) -> int:
        return int(self._core.stats[name])

    def totals(self) -> dict[str, int]:
        return dict(self._core.totals())

    def dead_letter_drops(self) -> dict[str, int]:
        return dict(self._core.dead_letter_drops)

    # ---------------------------------------------------------- coordination

    def coordination_counts(self) -> dict[str, int]:
        """Locks held, acquires waiting, acquisitions and expiries so far, schedules."""
        coord = self._core.coord
        return {
            "locks_held": sum(1 for x in coord.locks.values() if x.owner),
            "lock_waiters": len(coord.waiters),
            "lock_acquisitions": coord.locks_acquired,
            "lock_expiries": coord.lock_expiries,
            "schedules": len(coord.schedules),
        }

    def lock_infos(self) -> list[dict[str, Any]]:
        """Every held (or waited for) lock, by name."""
        result: list[dict[str, Any]] = self._core.lock_list()
        return result

    def lock_info(self, name: str) -> dict[str, Any]:
        """One lock as it is (a free one too). Raises InvalidArgument for a bad name."""
        result: dict[str, Any] = self._core.lock_info(name)
        return result

    def schedule_infos(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._core.schedule_list()
        return result

    def schedule_info(self, name: str) -> dict[str, Any]:
        """One schedule. Raises NotFound."""
        result: dict[str, Any] = self._core.schedule_info(name)
        return result

    def schedule_counters(self, attr: str) -> dict[str, int]:
        """``ticks_fired`` or ``ticks_skipped`` of every schedule, by name."""
        if attr not in ("ticks_fired", "ticks_skipped"):
            raise ValueError(f"no schedule counter {attr!r}")
        return {s.name: getattr(s, attr) for s in self._core.coord.schedules.values()}

    # ----------------------------------------------------------------- users

    def user_info(self, name: str) -> dict[str, Any] | None:
        user = self._core.users.get(name)
        return user.info() if user is not None else None

    def user_permissions(self, name: str) -> dict[str, Any] | None:
        """A copy of a user's permission patterns; None if there is no such user."""
        user = self._core.users.get(name)
        return dict(user.permissions) if user is not None else None

    def user_infos(self) -> list[dict[str, Any]]:
        return [u.info() for u in self._core.users.users.values()]

    def token_infos(self, user: str) -> list[dict[str, Any]]:
        return [t.info() for t in self._core.users.tokens_of(user)]

    def token_info(self, token_id: str) -> dict[str, Any] | None:
        token = self._core.users.tokens.get(token_id)
        return token.info() if token is not None else None

    def token_owner(self, token_id: str) -> str | None:
        """The user a token belongs to; None if there is no such token."""
        token = self._core.users.tokens.get(token_id)
        return token.user if token is not None else None
