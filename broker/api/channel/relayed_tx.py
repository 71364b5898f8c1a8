"""Cluster mode: a transaction's settles of deliveries relayed from other nodes' queues.

In a transaction (the channel's ``tx_select``, AMQP's ``tx.select``) the acks, nacks and
rejects of relayed deliveries (``relayed.py``) are held, as the core holds those of
local ones, in :class:`HeldRelayedSettles`: each names the owner's tags it settles at
the time it arrives. ``tx_commit`` (``broker.runtime.txcommit``) checks them before
anything is applied (:meth:`HeldRelayedSettles.check`: one whose relay ended, its
deliveries requeued by the owner, refuses the commit) and, once the rest of the
commit is kept, sends each owner its share inside a transaction of the owner's own
channel, so the owner applies it in one step and answers once it is durable
(:meth:`HeldRelayedSettles.commit`). ``tx_rollback`` and the channel's end forget them
(:meth:`HeldRelayedSettles.rollback`): the deliveries stay unacked on their owners,
as RabbitMQ leaves a rolled-back transaction's deliveries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

import trio

from broker.cluster import PeerStream, PeerUnreachable
from broker.core import ChannelError

__all__ = ["COMMIT_TIMEOUT_S", "HeldRelayedSettles", "RelayLink"]

#: How long a commit waits for an owner to commit the settles it is sent (its answer
#: comes once they are durable there).
COMMIT_TIMEOUT_S: Final = 30.0


class RelayLink(Protocol):
    """What a held settle needs of the relay (``relayed._Relay``) it goes over."""

    owner: str
    queue: str
    stream: PeerStream
    #: this channel's delivery tag -> the owner's
    tags: dict[int, int]
    ended: bool
    end_reason: str
    #: the owner's channel is transactional (since this channel's first commit for it)
    tx_selected: bool
    #: set when the owner answers a commit sent to it, or the relay ends
    committed: trio.Event | None
    #: the owner's answer to that commit (None: the relay ended first)
    commit_answer: dict[str, Any] | None


class _Held:
    """One held settle: the ``op`` sent to the owner at the commit (with the owner's
    tag, and ``multiple``), and this channel's tags it settles."""

    __slots__ = ("relay", "op", "local_tags")

    def __init__(self, relay: RelayLink, op: dict[str, Any], local_tags: list[int]) -> None:
        self.relay = relay
        self.op = op
        self.local_tags = local_tags


class HeldRelayedSettles:
    """The open transaction's settles of relayed deliveries, in order (see the module
    docstring). ``forget_tag`` drops a settled tag from the channel's relays' index;
    ``end_relay`` ends a relay whose owner failed a commit (the owner requeues what it
    still holds)."""

    def __init__(self, forget_tag: Callable[[int], object], end_relay: Callable[[Any], None]) -> None:
        self._forget_tag = forget_tag
        self._end_relay = end_relay
        self._held: list[_Held] = []
        #: settled tags whose relay had already ended (-> its owner): they refuse the commit
        self._lost: dict[int, str] = {}
        #: the tags they settle (a tag is settled at most once a transaction)
        self.tags: set[int] = set()

    def __len__(self) -> int:
        return len(self._held) + len(self._lost)

    def add(self, relay: RelayLink, op: dict[str, Any], local_tags: list[int]) -> None:
        """Hold ``op`` for ``relay``'s owner, settling this channel's ``local_tags``."""
        self._held.append(_Held(relay, op, local_tags))
        self.tags.update(local_tags)

    def add_lost(self, tag: int, owner: str) -> None:
        """Note a settle of ``tag``, whose relay (to ``owner``) had already ended."""
        self._lost[tag] = owner
        self.tags.add(tag)

    def check(self) -> None:
        """Before the commit applies anything: raises ChannelError
        (``queue_unavailable``) when a held settle's deliveries are gone with their
        relay (the connection to the owner was lost, or the consumer was cancelled:
        the owner requeued them), so that nothing of the transaction is applied."""
        lost = sorted({(h.relay.queue or "(get)", h.relay.owner, h.relay.end_reason) for h in self._held if h.relay.ended})
        whys = [f"queue {q!r} on node {o!r}: {r or 'relay ended'}" for q, o, r in lost]
        whys += [f"delivery tag {tag} of node {owner!r}: its relay had ended" for tag, owner in sorted(self._lost.items())]
        if whys:
            why = "; ".join(whys)
            raise ChannelError(
                "transaction not committed, nothing of it applied: deliveries it settles were requeued by their "
                f"owner (their relayed consumer or get ended): {why}",
                code="queue_unavailable",
            )

    def rollback(self) -> int:
        """Forget them (the deliveries stay unacked on their owners); how many."""
        count = len(self)
        self._held, self._lost, self.tags = [], {}, set()
        return count

    async def commit(self) -> list[str]:
        """Send each owner its share inside a transaction of the owner's channel and
        wait until every owner has committed it (durable there). Returns what failed
        (empty: all taken), each naming its node."""
        assert not self._lost, "check() first"
        held, self._held, self.tags = self._held, [], set()
        by_relay: dict[int, tuple[RelayLink, list[dict[str, Any]]]] = {}
        for h in held:
            for tag in h.local_tags:
                h.relay.tags.pop(tag, None)
                self._forget_tag(tag)
            by_relay.setdefault(id(h.relay), (h.relay, []))[1].append(h.op)
        failed: list[str] = []
        async with trio.open_nursery() as nursery:
            for relay, ops in by_relay.values():
                nursery.start_soon(self._commit_on, relay, ops, failed)
        return failed

    async def _commit_on(self, relay: RelayLink, ops: list[dict[str, Any]], failed: list[str]) -> None:
        """Commit ``ops`` on ``relay``'s owner; a failure is appended to ``failed``
        (and the relay ends)."""
        relay.committed, relay.commit_answer = trio.Event(), None
        batch = [*([] if relay.tx_selected else [{"op": "tx_select"}]), *ops, {"op": "tx_commit", "id": "relay-commit"}]
        reason = ""
        try:
            for each in batch:
                await relay.stream.send(each)
            relay.tx_selected = True
            with trio.move_on_after(COMMIT_TIMEOUT_S):
                await relay.committed.wait()
            if relay.commit_answer is None:
                reason = relay.end_reason or f"no answer within {COMMIT_TIMEOUT_S:g} s"
        except PeerUnreachable as exc:
            reason = f"cannot be reached: {exc}"
        finally:
            relay.committed = None
        if reason:
            failed.append(f"{len(ops)} settle(s) of deliveries relayed from node {relay.owner!r}: {reason}")
            if not relay.ended:
                self._end_relay(relay)
