"""Several nodes of one cluster behind one connection: ``connect("http://a:8081,
http://b:8082")`` (or a list of URLs).

Every node serves every queue (docs/cluster.md), so the client needs one live node,
not a particular one. :class:`FailoverOpener` opens each stream (a channel, a REST
connection) to the node that answered last, and moves on to the next in the list when
that one cannot be reached: a channel whose node died reconnects to another one, and
its recovery (declarations replayed, consumers re-established, pending publishes
resent with their message ids, deduplicated by the queue's owner) runs there.

A node can also be reachable and useless: one cut off from the rest of the cluster
(its membership lease lapsed) knows no leader it can reach for a quorum queue and
refuses its publishes (``queue_unavailable``, or ``no quorum`` from a leader left
below its majority) until the cut heals, while the other nodes elect a new leader and
serve the queue again. So a refusal that says another node may do better
(:func:`unavailable_here`) moves the connection on as well: a REST call's ``503`` at
once (the next request goes to the next node), and a channel once its node has
refused that way for :data:`MOVE_AFTER_S` with no confirm in between
(:class:`NodeSteering`: the channel reconnects to the next node, resending its pending
publishes). During an ordinary election every node refuses for a few seconds: moving
then costs a reconnect and gains nothing, which the delay keeps to about one a
second.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
import anyio.abc

from .endpoint import Endpoint, StreamOpener
from .errors import ConnectionLost

__all__ = ["MOVE_AFTER_S", "FailoverOpener", "NodeSteering", "split_urls", "unavailable_here"]

#: how long a channel's node may refuse publishes as unavailable (no confirm in
#: between) before the channel moves to the next node
MOVE_AFTER_S = 1.0


def unavailable_here(reason: str) -> bool:
    """Whether a refusal's reason (a nack's, or a ``503``'s error code) says this node
    cannot serve the queue now while another node may: ``queue_unavailable`` (no
    leader it can reach, the owner down) and ``no quorum`` (a leader below its
    majority: perhaps the minority side of a split)."""
    return reason.startswith(("queue_unavailable", "no quorum"))


def split_urls(url: str | Sequence[str]) -> list[str]:
    """The URLs of ``"http://a:1,http://b:2"`` or of a list of them.

    Raises:
        ValueError: no URL at all.
    """
    items = url.split(",") if isinstance(url, str) else [part for u in url for part in str(u).split(",")]
    urls = [u.strip() for u in items if u.strip()]
    if not urls:
        raise ValueError("no broker URL given")
    return urls


class FailoverOpener:
    """Opens streams to the first of ``endpoints`` that answers, starting from the one
    that answered last (see the module docstring). The endpoint a caller passes is
    replaced by the node chosen: all of them carry the same credentials and path."""

    def __init__(self, endpoints: Sequence[Endpoint], inner: StreamOpener) -> None:
        if not endpoints:
            raise ValueError("no endpoint")
        self.endpoints = list(endpoints)
        self._inner = inner
        self.current = 0

    @property
    def endpoint(self) -> Endpoint:
        """The node used last (or first)."""
        return self.endpoints[self.current]

    def move_on(self, endpoint: Endpoint) -> None:
        """``endpoint`` answered that it cannot serve what was asked (see
        :func:`unavailable_here`): the next stream opens to the node after it (unless
        another stream moved on already)."""
        if self.endpoints[self.current] == endpoint:
            self.current = (self.current + 1) % len(self.endpoints)

    async def __call__(self, endpoint: Endpoint) -> anyio.abc.ByteStream:
        count = len(self.endpoints)
        start = self.current
        last: OSError | None = None
        for step in range(count):
            index = (start + step) % count
            try:
                stream = await self._inner(self.endpoints[index])
            except OSError as exc:
                last = exc
                continue
            self.current = index
            return stream
        assert last is not None
        if count == 1:
            raise last
        raise OSError(last.errno, f"no node of {', '.join(str(e) for e in self.endpoints)} answered: {last}") from last


class NodeSteering:
    """Moves a channel to the next node once its node has refused publishes as
    unavailable (:func:`unavailable_here`) for :data:`MOVE_AFTER_S` with no confirm
    in between (see the module docstring). Inert unless the channel's opener is a
    :class:`FailoverOpener` over several nodes."""

    def __init__(self, opener: StreamOpener, clock: Callable[[], float] = anyio.current_time) -> None:
        self._opener = opener if isinstance(opener, FailoverOpener) and len(opener.endpoints) > 1 else None
        self._clock = clock
        self._since: float | None = None

    def confirmed(self) -> None:
        """A confirm arrived: the node serves."""
        self._since = None

    def refused(self, reason: str, abort: Callable[[BaseException], None]) -> None:
        """A nack with ``reason`` arrived; ``abort(error)`` ends the channel's session
        (it then reconnects, to the next node)."""
        opener = self._opener
        if opener is None or not unavailable_here(reason):
            return
        now = self._clock()
        if self._since is None:
            self._since = now
            return
        if now - self._since < MOVE_AFTER_S:
            return
        self._since = None
        node = opener.endpoint
        opener.move_on(node)
        abort(ConnectionLost(f"{node} cannot serve this channel's publishes now ({reason}): moving to another node"))
