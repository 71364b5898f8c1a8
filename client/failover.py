"""Several nodes of one cluster behind one connection: ``connect("http://a:8081,
http://b:8082")`` (or a list of URLs).

Every node serves every queue (docs/cluster.md), so the client needs one live node,
not a particular one. :class:`FailoverOpener` opens each stream (a channel, a REST
connection) to the node that answered last, and moves on to the next in the list when
that one cannot be reached: a channel whose node died reconnects to another one, and
its recovery (declarations replayed, consumers re-established, pending publishes
resent with their message ids, deduplicated by the queue's owner) runs there.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio.abc

from .endpoint import Endpoint, StreamOpener

__all__ = ["FailoverOpener", "split_urls"]


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
