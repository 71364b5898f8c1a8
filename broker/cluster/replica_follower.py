"""A follower's side of one quorum queue: catch up with the leader and stay caught up.

The follower holds one kept-alive HTTP/1.1 connection to its leader
(:class:`PeerConnection`, h11 on trio) and, for the epoch its etcd view names:

1. **truncates by epoch** (Kafka's KIP-101/279): it asks the leader for the end of
   its own last epoch (``POST /cluster/replicas/{queue}/epoch-end``) and drops
   whatever it holds past that offset: a tail written by a leader that lost its
   majority before confirming it. A follower whose data directory was wiped has no
   epoch: it keeps nothing and fetches everything;
2. **fetches** (``POST /cluster/replicas/{queue}/fetch``) from its end + 1, long-polled:
   the leader answers at once when it has entries, else when some arrive (or after a
   second); the follower appends them and fsyncs them before it asks for more, so the
   offset of each fetch acknowledges everything before it. After a failed write (a
   sync, a snapshot's install, a truncation) it fetches again only once its whole log
   is on disk (:func:`durable_end`): never acknowledging what it does not durably hold.

It accepts entries only from the epoch it was started for (the leader answers for its
own epoch only, and says so); when etcd names another leader or epoch, the replication
manager cancels this and starts a new one.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any, Protocol
from urllib.parse import quote

import h11
import orjson
import trio

from broker.cluster.h11io import next_event
from broker.cluster.peers import SECRET_HEADER, open_peer
from broker.cluster.replica_leader import COMPACT_AFTER_ENTRIES, snapshot
from broker.cluster.replica_log import ReplicaLog, is_snapshot

__all__ = ["PeerConnection", "PeerError", "PeerSettings", "durable_end", "follow", "take_answer"]

log = logging.getLogger("ackbus.cluster")

MAX_ANSWER_BYTES = 256 * 1024 * 1024


class PeerError(Exception):
    """Another node could not be reached or answered something unusable."""


class PeerSettings(Protocol):
    """How a node reaches another (``ClusterConfig``'s fields of the same names)."""

    secret: str | None
    peer_ssl: ssl.SSLContext | None


class PeerConnection:
    """One kept-alive HTTP/1.1 connection to another node, for JSON POSTs."""

    def __init__(self, url: str, *, secret: str | None = None, ssl_context: ssl.SSLContext | None = None) -> None:
        self.url = url
        #: the cluster secret, carried so the leader lets a node in (``--cluster-secret``)
        self.secret = secret
        #: verifies an ``https://`` leader's certificate (None: the system's CAs)
        self.ssl_context = ssl_context
        self._stream: trio.abc.Stream | None = None
        self._host = ""
        self._h11: h11.Connection | None = None

    async def post(self, path: str, body: dict[str, Any], timeout_s: float) -> tuple[int, dict[str, Any]]:
        """POST ``body`` as JSON; ``(status, JSON answer)``. Raises PeerError."""
        try:
            with trio.fail_after(timeout_s):
                return await self._post(path, orjson.dumps(body))
        except (OSError, trio.TooSlowError, h11.ProtocolError, trio.BrokenResourceError, ValueError) as exc:
            await self.aclose()
            raise PeerError(f"{self.url}: {type(exc).__name__}: {exc}") from None

    async def _post(self, path: str, payload: bytes) -> tuple[int, dict[str, Any]]:
        if self._stream is None or self._h11 is None:
            self._stream, self._host = await open_peer(self.url, self.ssl_context)
            self._h11 = h11.Connection(h11.CLIENT)
        conn, stream = self._h11, self._stream
        headers = [
            ("Host", self._host),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(payload))),
        ]
        if self.secret:
            headers.append((SECRET_HEADER, self.secret))
        data = conn.send(h11.Request(method="POST", target=path, headers=headers)) or b""
        data += conn.send(h11.Data(data=payload)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(data)
        status = 0
        parts: list[bytes] = []
        size = 0
        while True:
            event = await next_event(conn, stream)
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_ANSWER_BYTES:
                    raise ValueError("answer too large")
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise OSError("the node closed the connection")
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            await self.aclose()
        answer = orjson.loads(b"".join(parts)) if parts else {}
        return status, answer if isinstance(answer, dict) else {}

    async def aclose(self) -> None:
        stream, self._stream, self._h11 = self._stream, None, None
        if stream is not None:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()


def replica_path(queue: str, what: str) -> str:
    return f"/cluster/replicas/{quote(queue, safe='')}/{what}"


class FollowerState:
    """What a follower shows (``GET /cluster``)."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.truncated = 0
        self.fetches = 0


async def follow(
    queue: str,
    me: str,
    leader_url: str,
    epoch: int,
    log_: ReplicaLog,
    state: FollowerState,
    *,
    timeout_s: float,
    settings: PeerSettings | None = None,
    compact_after: int = COMPACT_AFTER_ENTRIES,
) -> None:
    """Follow the leader of ``epoch`` at ``leader_url`` until cancelled; on a failure,
    wait a little and go again (the manager restarts this with a new leader). ``settings``:
    how to reach it (the cluster secret, the CAs that verify an https leader)."""
    peer = PeerConnection(leader_url, secret=settings.secret, ssl_context=settings.peer_ssl) if settings else PeerConnection(leader_url)
    try:
        truncated = False
        delay = 0.05
        while True:
            try:
                if not truncated:
                    status, answer = await peer.post(
                        replica_path(queue, "epoch-end"), {"epoch": log_.last_epoch, "leader_epoch": epoch}, timeout_s
                    )
                    if status != 200:
                        raise PeerError(f"epoch-end: {status} {answer.get('message', '')}")
                    end = int(answer["end_offset"])
                    if end < log_.end_offset:
                        dropped = await log_.truncate_after(end)
                        state.truncated += dropped
                        log.warning(
                            "replica log truncated by epoch",
                            extra={"fields": {"queue": queue, "after": end, "dropped": dropped, "epoch": epoch}},
                        )
                    truncated = True
                status, answer = await peer.post(
                    replica_path(queue, "fetch"),
                    {"node": me, "epoch": epoch, "offset": await durable_end(log_) + 1, "wait_s": 1.0},
                    timeout_s + 1.0,
                )
                if status != 200:
                    raise PeerError(f"fetch: {status} {answer.get('message', '')}")
                if int(answer.get("epoch", -1)) != epoch:
                    raise PeerError(f"fetch answered for epoch {answer.get('epoch')}, not {epoch}")
                if "truncate_to" in answer:
                    truncated = False
                    continue
                await take_answer(queue, log_, answer, compact_after)
                state.fetches += 1
                state.error = None
                delay = 0.05
            except (PeerError, OSError, ValueError, KeyError, TypeError) as exc:
                state.error = str(exc)
                truncated = False
                await trio.sleep(delay)
                delay = min(1.0, delay * 2)
    finally:
        await peer.aclose()


async def durable_end(log_: ReplicaLog) -> int:
    """The offset this follower may acknowledge (the next fetch asks for the one after
    it): the end of its log, once all of it is on disk. What a failed sync left
    unwritten, or a failed rewrite left to write again (a snapshot installed, a
    truncation), is synced first; while that fails (raises OSError) the follower
    acknowledges nothing, rather than entries it does not durably hold."""
    if log_.synced != log_.end_offset:
        await log_.sync()
    if log_.synced != log_.end_offset:
        raise OSError(f"the replica log is synced up to {log_.synced}, not to its end {log_.end_offset}")
    return log_.end_offset


async def take_answer(queue: str, log_: ReplicaLog, answer: dict[str, Any], compact_after: int = COMPACT_AFTER_ENTRIES) -> None:
    """Take one fetch answer of the leader: its entries appended and fsynced (the next
    fetch's offset acknowledges them), a snapshot installed first when this log ends
    before it, and the prefix every replica holds (``safe``) compacted once long."""
    entries = answer.get("entries") or []
    if entries and is_snapshot(entries[0]) and int(entries[0][1]) > log_.end_offset:
        # behind the leader's compacted prefix: its snapshot replaces this log
        await log_.install(entries[0])
        log.info("replica log installed from a snapshot", extra={"fields": {"queue": queue, "offset": log_.end_offset}})
        entries = entries[1:]
    if entries:
        try:
            log_.append_entries(entries)
        finally:  # the next fetch's offset acknowledges: on disk first
            await log_.sync()
    safe = int(answer.get("safe") or 0)
    if log_.wants_compaction(safe, compact_after):
        await log_.compact(safe, snapshot)
