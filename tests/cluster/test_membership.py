"""The membership lease's renewal, against a stand-in for the etcd client, on trio's
virtual clock: one renewal etcd leaves unanswered must not cost the node its lease."""

from __future__ import annotations

from typing import Any

import trio

from broker.cluster.etcdproto import EtcdUnavailable
from broker.cluster.membership import Membership
from broker.cluster.view import ClusterKeys

TTL_S = 3
CALL_TIMEOUT_S = 1.0  # the node's etcd calls give up after a third of the TTL


class OneSilentRenewal:
    """An etcd client whose second keepalive gets no answer (a member cut off: the
    call waits its timeout), whose others are answered at once; a node that counts its
    lease lost registers again, which this one refuses to take part in."""

    def __init__(self) -> None:
        self.keepalives: list[float] = []

    async def lease_keepalive(self, lease: int) -> int:
        self.keepalives.append(trio.current_time())
        if len(self.keepalives) == 2:
            await trio.sleep(CALL_TIMEOUT_S)
            raise EtcdUnavailable("http://e1:2379: no answer within 1 s", code=4)
        return TTL_S

    async def lease_grant(self, ttl_s: int) -> int:
        raise AssertionError("the node counted its lease lost and registered again")

    async def lease_revoke(self, lease: int) -> None:
        raise AssertionError("the node revoked its lease")

    async def txn(self, *args: Any) -> Any:
        raise AssertionError("the node registered again")


async def test_a_renewal_without_an_answer_is_retried_before_the_lease_is_counted_lost(autojump_clock: Any) -> None:
    client = OneSilentRenewal()
    membership = Membership(client, ClusterKeys("c"), "a", "http://a:1", TTL_S)  # type: ignore[arg-type]
    membership.lease = 7
    membership.alive_until = trio.current_time() + TTL_S - membership.margin_s
    errors: list[str | None] = []
    lapsed: list[float] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(membership.keep_alive, errors.append)
        with trio.move_on_after(6 * TTL_S):
            while True:
                if not membership.registered:
                    lapsed.append(trio.current_time())
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert lapsed == [], f"lease counted lost at {lapsed[:3]} (keepalives at {client.keepalives})"
    assert membership.lease == 7
    failed_at = client.keepalives[1] + CALL_TIMEOUT_S
    assert client.keepalives[2] - failed_at <= 0.2  # retried at once, not a third of the TTL later
    assert any("no answer" in str(e) for e in errors) and errors[-1] is None


class SilentFor:
    """An etcd client that answers no keepalive from ``start`` to ``end`` (virtual
    seconds; etcd re-electing its own leader, say), then answers that the lease still
    holds; registering again is refused."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end

    async def lease_keepalive(self, lease: int) -> int:
        if self.start <= trio.current_time() < self.end:
            await trio.sleep(CALL_TIMEOUT_S)
            raise EtcdUnavailable("http://e1:2379: no answer within 1 s", code=4)
        return TTL_S

    async def lease_grant(self, ttl_s: int) -> int:
        raise AssertionError("the node registered again (and would revoke its old lease)")

    async def lease_revoke(self, lease: int) -> None:
        raise AssertionError("the node revoked its lease")

    async def txn(self, *args: Any) -> Any:
        raise AssertionError("the node registered again")


async def test_a_lease_counted_lost_that_etcd_still_holds_is_renewed_not_replaced(autojump_clock: Any) -> None:
    membership = Membership(SilentFor(1.0, 6.0), ClusterKeys("c"), "a", "http://a:1", TTL_S)  # type: ignore[arg-type]
    membership.lease = 7
    membership.alive_until = trio.current_time() + TTL_S - membership.margin_s
    member: list[tuple[float, bool]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(membership.keep_alive, lambda _error: None)
        with trio.move_on_after(4 * TTL_S):
            while True:
                member.append((trio.current_time(), membership.registered))
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    lost = [t for t, registered in member if not registered]
    assert lost and lost[0] < 6.0  # counted lost while etcd did not answer
    assert all(registered for t, registered in member if t > 7.5)  # a member again after
    assert membership.lease == 7  # the same lease: its keys never went
