"""Every ``503`` a cluster answers a REST call with, for a reason that mends by itself,
carries ``Retry-After`` (broker/api/errors.py, the one rule): a publish nacked
``queue_unavailable`` (its queue's owner down, a quorum queue without a leader) or
``no quorum`` (below its majority), a call relayed to a queue's owner that is down or
knows no leader, a change refused while etcd is unreachable (``etcd_unavailable``),
and one etcd accepted that this node has not seen in time (``cluster_lagging``).
Before, only the relay to a down or hung owner said when to try again.

On real etcd and broker processes (loopback), but the mapping of errors no node can be
made to answer at will (``cluster_lagging``, a remote purge refused), which is checked
on the translator itself."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker.api.errors import CLUSTER_RETRY_AFTER_S, http_error, nack_retry_after_s
from broker.core import ChannelError, NotFound, Unavailable
from tests.cluster.conftest import TTL_S, wait_for
from tests.cluster.test_cut_off import answer
from tests.cluster.test_replication import QUORUM, Nodes, leader_of, replication
from tests.support.broker import BrokerProcess
from tests.support.etcd import EtcdProcess

RETRY = str(CLUSTER_RETRY_AFTER_S)


def _publish(node: BrokerProcess, queue: str, body: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    return answer(node, "POST", f"/exchanges/amq.default/publish?routing_key={queue}", body.encode())


def _refused(what: str, call: Any, timeout_s: float = TTL_S * 4 + 10) -> tuple[dict[str, Any], dict[str, str]]:
    """Wait until ``call()`` answers 503; its (body, headers)."""
    status, body, headers = wait_for(what, lambda: (lambda r: r if r[0] == 503 else None)(call()), timeout_s)
    return body, headers


@pytest.mark.slow
def test_every_503_of_a_cluster_refusal_says_when_to_retry(etcd: EtcdProcess, nodes: Nodes) -> None:
    three = {name: nodes(name) for name in ("a", "b", "c")}
    wait_for("three members", lambda: sum(n["alive"] for n in three["a"].request("GET", "/cluster")[1]["nodes"]) == 3)
    status, body = three["a"].request("PUT", "/queues/qq", QUORUM)
    assert status == 201, body
    leader = leader_of(three, "qq")
    followers = [p for p in three.values() if p is not leader]
    owner = followers[0]  # a classic queue's owner, soon down
    status, body = owner.request("PUT", "/queues/cq", {"arguments": {"x-queue-leader-locator": "client-local"}})
    assert status in (200, 201), body
    wait_for("cq seen by the leader", lambda: leader.request("GET", "/queues/cq")[0] == 200)
    for i, queue in enumerate(("qq", "cq")):
        status, body, _headers = _publish(leader, queue, f"before-{i}")
        assert status == 200 and body["confirm"] == "ack", body
    for f in followers:
        f.kill()

    # a publish routed to a classic queue whose owner is down: nacked queue_unavailable
    body, headers = _refused("a publish to cq refused", lambda: _publish(leader, "cq", "to a down owner"))
    assert body["confirm"] == "nack" and body["reason"].startswith("queue_unavailable"), body
    assert headers.get("retry-after") == RETRY, headers
    # a get relayed to that owner (the path that said it already)
    body, headers = _refused("a get of cq refused", lambda: answer(leader, "POST", "/queues/cq/get?max=1"))
    assert body["error"] == "queue_unavailable" and headers.get("retry-after") == RETRY, (body, headers)
    # a quorum queue below its majority: nacked no quorum
    body, headers = _refused("a publish to qq refused", lambda: _publish(leader, "qq", "below a majority"))
    assert body["confirm"] == "nack" and body["reason"].startswith("no quorum"), body
    assert headers.get("retry-after") == RETRY, headers

    etcd.stop()
    # a declare (and a binding, a lock) while etcd is unreachable: etcd_unavailable
    for method, path, payload in (
        ("PUT", "/queues/new", {}),
        ("POST", "/bindings", {"exchange": "amq.direct", "queue": "qq", "routing_key": "k"}),
        ("POST", "/locks/l/acquire", {"owner": "x"}),
    ):
        body, headers = _refused(f"{method} {path} refused", lambda: answer(leader, method, path, json.dumps(payload).encode()))
        assert body["error"] == "etcd_unavailable", (path, body)
        assert headers.get("retry-after") == RETRY, (path, headers)
    # the leader's lease is counted lost: it steps down, and the queue has no leader
    # it can name. A publish is nacked queue_unavailable, a call about it refused
    wait_for("the leader stepped down", lambda: replication(leader, "qq").get("leader") is None)
    body, headers = _refused("a publish to leaderless qq refused", lambda: _publish(leader, "qq", "no leader"))
    assert body["confirm"] == "nack" and body["reason"].startswith("queue_unavailable"), body
    assert headers.get("retry-after") == RETRY, headers
    body, headers = _refused("a get of leaderless qq refused", lambda: answer(leader, "POST", "/queues/qq/get?max=1"))
    assert body["error"] == "queue_unavailable" and headers.get("retry-after") == RETRY, (body, headers)


@pytest.mark.parametrize("code", ["queue_unavailable", "etcd_unavailable", "cluster_lagging"])
def test_the_cluster_s_refusals_are_translated_with_retry_after(code: str) -> None:
    error = http_error(Unavailable("not now", code=code))
    assert error is not None and error.status == 503 and error.code == code
    assert ("retry-after", RETRY) in error.headers


def test_other_errors_and_nacks_get_no_retry_after() -> None:
    for exc in (Unavailable("shutting down", code="shutting_down"), NotFound("no queue"), ChannelError("bad", code="queue_unavailable")):
        error = http_error(exc)
        assert error is not None and not any(name == "retry-after" for name, _ in error.headers), exc
    assert nack_retry_after_s("queue_unavailable: node 'b' is down") == CLUSTER_RETRY_AFTER_S
    assert nack_retry_after_s("no quorum: leadership of queue 'q' lost") == CLUSTER_RETRY_AFTER_S
    assert nack_retry_after_s("queue full") is None and nack_retry_after_s(None) is None
