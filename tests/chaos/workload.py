"""The clients of the fault test, each a thread recording into one :class:`History`:

- **publishers**, each sending numbered messages ``p<k>-<n>`` in order, one at a
  time, to whichever node leads the queue, with the message id equal to the body and
  ``mandatory`` (a node that stopped leading routes it nowhere: not a confirm); a
  message not confirmed (nack, 503, error) is sent again, same id, until confirmed or
  ``give_up_s`` passes (every attempt and its answer is recorded);
- a **consumer** taking messages from the leader with REST gets (leases) and acking
  them, recording every delivery and its ``redelivered`` flag;
- a **locker** acquiring and releasing one cluster lock through any node, each time
  under a new owner, recording every fencing token it was granted;
- a **watcher** polling every node's ``GET /cluster`` for its own replica of the queue
  (role, epoch, commit offset), so the checker can tell which node confirmed in which
  epoch.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.cluster import QUEUE, Cluster

__all__ = ["History", "consumer", "drain", "locker", "publisher", "watcher"]

LOCK = "chaos-lock"


@dataclass
class History:
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: body -> time of its confirm
    confirmed: dict[str, float] = field(default_factory=dict)
    #: bodies whose publisher gave up (never confirmed)
    abandoned: list[str] = field(default_factory=list)
    attempts: int = 0
    nacks: int = 0
    #: "status reason" -> how many publishes were refused so
    refusals: dict[str, int] = field(default_factory=dict)
    #: (time, body, redelivered)
    deliveries: list[tuple[float, str, bool]] = field(default_factory=list)
    #: (time, kind, target)
    faults: list[tuple[float, str, str]] = field(default_factory=list)
    #: (time granted, owner, fencing token, node asked)
    tokens: list[tuple[float, str, int, str]] = field(default_factory=list)
    #: (time sent, time answered, body, node asked, status, confirm, routed, reason)
    attempt_log: list[tuple[float, float, str, str, int, str | None, int | None, str | None]] = field(default_factory=list)
    #: (time, node, role, epoch it leads or follows, commit offset or None)
    replicas: list[tuple[float, str, str, int | None, int | None]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "confirmed": self.confirmed, "abandoned": self.abandoned, "deliveries": self.deliveries,
            "faults": self.faults, "tokens": self.tokens, "replicas": self.replicas,
            "attempts": self.attempt_log,
        }


def publisher(cluster: Cluster, history: History, k: int, stop: threading.Event, give_up_s: float) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        body = f"p{k}-{n}"
        first = time.monotonic()
        while not stop.is_set():
            leader = cluster.leader()
            if leader is not None:
                with history.lock:
                    history.attempts += 1
                sent = time.time()
                try:
                    status, answer = leader.request("POST",
                        f"/exchanges/amq.default/publish?routing_key={QUEUE}&mandatory=true", body.encode(),
                        headers={"X-Message-Id": body}, timeout_s=10,
                    )
                except OSError:
                    status, answer = 0, None
                got = answer if isinstance(answer, dict) else {}
                with history.lock:
                    history.attempt_log.append((
                        sent, time.time(), body, leader.name, status, got.get("confirm"), got.get("routed"),
                        got.get("reason") or got.get("error"),
                    ))
                # mandatory: a node that no longer holds the queue answers 404 no_route
                # (not an ack of a message routed nowhere); routed 0 with 200 is a
                # resend deduplicated by its message id (taken before)
                if status == 200 and isinstance(answer, dict) and answer.get("confirm") == "ack":
                    with history.lock:
                        history.confirmed[body] = time.time()
                    break
                with history.lock:
                    history.nacks += 1
                    why = answer.get("reason") or answer.get("error") if isinstance(answer, dict) else "no answer"
                    history.refusals[f"{status} {why}"] = history.refusals.get(f"{status} {why}", 0) + 1
            if time.monotonic() - first > give_up_s:
                with history.lock:
                    history.abandoned.append(body)
                break
            time.sleep(0.1)


def _take(cluster: Cluster, history: History, path: str) -> int:
    """One get from the leader, recorded and acked; how many messages it took."""
    leader = cluster.leader()
    if leader is None:
        return 0
    status, got = leader.request("POST", path, timeout_s=5)
    messages = (got.get("messages") or []) if status == 200 and isinstance(got, dict) else []
    now = time.time()
    with history.lock:
        for m in messages:
            history.deliveries.append((now, m.get("body", ""), bool(m.get("redelivered"))))
    if messages:
        leader.request("POST", f"/queues/{QUEUE}/ack",
                {"lease_ids": [m["lease_id"] for m in messages]}, timeout_s=5)
    return len(messages)


def consumer(cluster: Cluster, history: History, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            if not _take(cluster, history, f"/queues/{QUEUE}/get?max=50&lease=5&wait=0.5"):
                time.sleep(0.1)
        except OSError:
            time.sleep(0.1)


def drain(cluster: Cluster, history: History, quiet_s: float = 8.0, limit_s: float = 120.0) -> None:
    """Consume until the queue stays empty for ``quiet_s`` (longer than the consumer's
    5 s leases: a get whose answer was lost gives its messages back by then)."""
    deadline = time.monotonic() + limit_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_s:
        try:
            if _take(cluster, history, f"/queues/{QUEUE}/get?max=500&lease=60"):
                quiet_since = time.monotonic()
        except OSError:
            pass
        time.sleep(0.2)


def locker(cluster: Cluster, history: History, stop: threading.Event) -> None:
    """Acquire and release one lock, again and again, each time as a new owner, through
    a random live node; a grant's token is recorded (a new owner's grant must carry a
    token above every earlier one)."""
    n = 0
    while not stop.wait(0.2):
        node = cluster.any_node()
        if node is None:
            continue
        n += 1
        owner = f"locker-{n}"
        try:
            status, body = node.request("POST", f"/locks/{LOCK}/acquire",
                                   {"owner": owner, "ttl_s": 2, "wait_s": 0}, timeout_s=5)
        except OSError:
            continue  # unknown: maybe held by this owner until its TTL
        if status != 200 or not isinstance(body, dict) or body.get("owner") != owner:
            continue
        token = int(body["token"])
        with history.lock:
            history.tokens.append((time.time(), owner, token, node.name))
        stop.wait(0.3)
        try:
            node.request("POST", f"/locks/{LOCK}/release", {"owner": owner, "token": token}, timeout_s=5)
        except OSError:
            pass


def watcher(cluster: Cluster, history: History, stop: threading.Event, every_s: float = 0.25) -> None:
    """Poll each live node's own view of its replica of the queue (``GET /cluster``,
    answered by the node itself; ``GET /queues/{q}`` would be relayed to the leader)."""
    while not stop.wait(every_s):
        for node in list(cluster.nodes.values()):
            if not node.alive():
                continue
            try:
                status, body = node.request("GET", "/cluster", timeout_s=1)
            except OSError:
                continue
            if status != 200 or not isinstance(body, dict) or body.get("node") != node.name:
                continue
            rep = (body.get("replicated_queues") or {}).get(QUEUE) or {}
            local = rep.get("local") or {}
            role = str(local.get("role") or "none")
            epoch = local.get("log_epoch")
            commit = rep.get("commit_offset") if role == "leader" else None
            with history.lock:
                history.replicas.append((time.time(), node.name, role, epoch, commit))
