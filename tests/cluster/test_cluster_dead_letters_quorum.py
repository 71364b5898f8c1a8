"""Dead letters into a quorum queue led by the dead-lettering node, at least once
(docs/cluster.md, "Dead letters"): the source message is settled only once a majority
of the quorum queue's replicas has the copy. With the followers paused (SIGSTOP) the
dead letters stay held in their source queue; the leader killed then, its followers
elect a new leader without the copies, and the restarted node still has every one of
them in its source queue, from where they reach the new leader. None is lost.

A publish refused by a full ``x-overflow: reject-publish-dlx`` queue was never in it:
its nack waits for its dead letter's copy (a bounded while), and a publisher whose
node is killed meanwhile has no confirm at all (it sends again)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import node_process, wait_for, wait_synced
from tests.cluster.test_replication import (  # noqa: F401 (``three`` is a fixture)
    _start_after_lapse,
    leader_of,
    three,
)
from tests.support.broker import BrokerProcess, stop_all
from tests.support.etcd import EtcdProcess
from tests.support.rawchannel import ChannelGone, RawChannel

pytestmark = pytest.mark.slow

LOCAL = {"x-queue-leader-locator": "client-local"}
PATIENCE_S = 40.0


def _browse(node: BrokerProcess, queue: str) -> list[dict[str, Any]]:
    """Every message of ``queue`` (ready, unacked or held), without consuming it."""
    status, body = node.request("GET", f"/queues/{queue}/messages?limit=1000")
    assert status == 200, body
    return list(body["messages"])


def _bodies(node: BrokerProcess, queue: str) -> list[str]:
    return [m["body"] for m in _browse(node, queue)]


def _publish(node: BrokerProcess, queue: str, body: str, headers: dict[str, str] | None = None) -> None:
    status, answer = node.request(
        "POST", f"/exchanges/amq.default/publish?routing_key={queue}", body.encode(), headers=headers or {}
    )
    assert status == 200 and answer["confirm"] == "ack", answer


def _reject_all(node: BrokerProcess, queue: str) -> list[str]:
    """Take every ready message of ``queue`` and nack it without requeue (dead-letter
    it); their bodies."""
    status, got = node.request("POST", f"/queues/{queue}/get?max=100&lease=60")
    assert status == 200, got
    if got["messages"]:
        leases = [m["lease_id"] for m in got["messages"]]
        status, answer = node.request("POST", f"/queues/{queue}/nack", {"lease_ids": leases, "requeue": False})
        assert status == 200, answer
    return [m["body"] for m in got["messages"]]


def _waiting(node: BrokerProcess) -> int:
    status, body = node.request("GET", "/cluster")
    assert status == 200, body
    return int(body["forwarding"]["dead_letters"]["waiting"])


def _queue(node: BrokerProcess, name: str) -> dict[str, Any]:
    status, body = node.request("GET", f"/queues/{name}")
    assert status == 200, body
    return dict(body)


def _pause(*procs: BrokerProcess) -> None:
    for p in procs:
        assert p.proc is not None
        os.kill(p.proc.pid, signal.SIGSTOP)


def _resume(*procs: BrokerProcess) -> None:
    for p in procs:
        assert p.proc is not None
        os.kill(p.proc.pid, signal.SIGCONT)


def test_dead_letters_into_a_quorum_queue_its_node_leads_survive_the_loss_of_that_leader(
    three: dict[str, BrokerProcess],  # noqa: F811 (the fixture)
) -> None:
    a = three["a"]
    status, body = a.request("PUT", "/queues/dlq", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
    assert status == 201, body
    leader = leader_of(three, "dlq")
    name = next(n for n, p in three.items() if p is leader)
    followers = [p for n, p in three.items() if n != name]
    # a classic source queue on the quorum queue's leader, dead-lettering into it
    assert leader.request("PUT", "/exchanges/dlx", {"type": "direct"})[0] == 201
    assert leader.request("POST", "/bindings", {"exchange": "dlx", "queue": "dlq", "routing_key": "dead"})[0] == 201
    src_args = {**LOCAL, "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead"}
    assert leader.request("PUT", "/queues/src", {"durable": True, "arguments": src_args})[0] == 201

    # every replica answering: a dead letter reaches the quorum queue and leaves src
    _publish(leader, "src", "m0")
    assert _reject_all(leader, "src") == ["m0"]
    wait_for("m0 in dlq", lambda: _bodies(leader, "dlq") == ["m0"])
    wait_for("m0 settled in src", lambda: _queue(leader, "src")["messages"] == 0)

    # the followers paused: no majority can have the copy, so the source holds it;
    # they come back: the majority has it, the source lets it go
    _pause(*followers)
    try:
        _publish(leader, "src", "r0")
        assert _reject_all(leader, "src") == ["r0"]
        wait_for("r0 held in src", lambda: _waiting(leader) == 1 and _queue(leader, "src")["messages_unacked"] == 1)
    finally:
        _resume(*followers)
    wait_for("r0 settled in src once the majority has it", lambda: _queue(leader, "src")["messages"] == 0, PATIENCE_S)
    assert sorted(_bodies(leader, "dlq")) == ["m0", "r0"]

    # paused again: rejected and expired messages are dead-lettered, then the leader
    # is killed before any follower has their copies
    _pause(*followers)
    try:
        for body in ("r1", "r2", "r3"):
            _publish(leader, "src", body)
        for body in ("e1", "e2"):
            _publish(leader, "src", body, {"X-Expiration": "200"})
        wait_for("e1 and e2 expired", lambda: _queue(leader, "src")["messages_ready"] == 3)
        assert sorted(_reject_all(leader, "src")) == ["r1", "r2", "r3"]
        wait_for("no message ready in src", lambda: _queue(leader, "src")["messages_ready"] == 0)
        leader.kill()
    finally:
        _resume(*followers)
    survivors = {n: p for n, p in three.items() if n != name}
    new = leader_of(survivors, "dlq", not_=name)
    _start_after_lapse(leader, name, new)

    # none lost: each is in its source queue (held or ready) or in the new leader's
    # dlq (src looked at first: one settled since is in dlq by then)
    lost = {"r1", "r2", "r3", "e1", "e2"}
    in_src = set(_bodies(leader, "src"))
    in_dlq = set(_bodies(new, "dlq"))
    assert lost <= in_src | in_dlq, (sorted(in_src), sorted(in_dlq))
    # and each reaches the new leader's dlq (the expired ones by themselves, the
    # rejected ones rejected again)
    wait_for("r1..r3 ready in src", lambda: _queue(leader, "src")["messages_ready"] == 3)
    _reject_all(leader, "src")
    wait_for("every dead letter in the new leader's dlq", lambda: lost <= set(_bodies(new, "dlq")), PATIENCE_S)
    wait_for("src empty", lambda: _queue(leader, "src")["messages"] == 0, PATIENCE_S)
    assert set(_bodies(new, "dlq")) == {"m0", "r0"} | lost


#: The lease TTL of the refused-publish test: the forwarding answer timeout is as long,
#: and a refused publish's nack waits half of it for its dead letter (dead_letters.py)
REFUSED_TTL_S = 6
REFUSED_WAIT_S = REFUSED_TTL_S / 2


def test_a_refused_publish_is_nacked_only_once_its_dead_letter_is_kept_or_given_up(tmp_path: Path, etcd: EtcdProcess) -> None:
    procs = {n: node_process(tmp_path, etcd, n, ttl_s=REFUSED_TTL_S) for n in ("a", "b", "c")}
    try:
        for p in procs.values():
            p.start()
        for p in procs.values():
            wait_synced(p)
        status, body = procs["a"].request("PUT", "/queues/dlq", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
        assert status == 201, body
        leader = leader_of(procs, "dlq")
        name = next(n for n, p in procs.items() if p is leader)
        followers = [p for n, p in procs.items() if n != name]
        assert leader.request("PUT", "/exchanges/dlx", {"type": "direct"})[0] == 201
        assert leader.request("POST", "/bindings", {"exchange": "dlx", "queue": "dlq", "routing_key": "dead"})[0] == 201
        src_args = {
            **LOCAL, "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead",
            "x-max-length": 1, "x-overflow": "reject-publish-dlx",
        }
        assert leader.request("PUT", "/queues/src", {"durable": True, "arguments": src_args})[0] == 201
        ch = RawChannel(leader.port)
        try:
            ch.send({"op": "publish", "routing_key": "src", "body": "fill"})
            assert ch.next_of("ack")["delivery_tag"] == 1
            # every replica answering: nacked (the queue is full), dead-lettered
            ch.send({"op": "publish", "routing_key": "src", "body": "r1"})
            nack = ch.next_of("nack")
            assert nack["delivery_tag"] == 2 and "full" in nack["reason"], nack
            wait_for("r1 in dlq", lambda: _bodies(leader, "dlq") == ["r1"])

            # the followers paused: no majority can have the copy; the nack waits for it
            # a bounded while, then gives it up (a lower bound on the time: load only
            # makes it longer)
            _pause(*followers)
            try:
                started = time.monotonic()
                ch.send({"op": "publish", "routing_key": "src", "body": "r2"})
                nack = ch.next_of("nack")
                waited = time.monotonic() - started
                assert nack["delivery_tag"] == 3 and waited >= REFUSED_WAIT_S * 0.9, (nack, waited)

                # killed while the nack waits: the publisher gets no confirm at all
                ch.send({"op": "publish", "routing_key": "src", "body": "r3"})
                wait_for("r3's dead letter waiting", lambda: _waiting(leader) == 1, REFUSED_WAIT_S)
                leader.kill()
                with pytest.raises(ChannelGone):
                    ev = ch.next_event()
                    raise AssertionError(f"a confirm came before the kill: {ev}")
            finally:
                _resume(*followers)
        finally:
            ch.close()
    finally:
        stop_all(procs.values())


def _role(node: BrokerProcess, queue: str) -> str | None:
    status, body = node.request("GET", "/cluster")
    assert status == 200, body
    return (body["replicated_queues"].get(queue) or {}).get("local", {}).get("role")


def test_a_dead_letter_held_for_a_quorum_queue_whose_leadership_comes_to_its_node_is_copied_there(
    three: dict[str, BrokerProcess],  # noqa: F811 (the fixture)
) -> None:
    """The dead letter's quorum queue is led by another node, which is killed: the
    dead letter waits in its source queue; the queue fails over to the source's own
    node (the third replica paused, so that only it campaigns), and the copy is made
    there, the source settled once the majority has it (the third replica back)."""
    a = three["a"]
    status, body = a.request("PUT", "/queues/dlq", {"durable": True, "arguments": {"x-queue-type": "quorum"}})
    assert status == 201, body
    leader = leader_of(three, "dlq")
    name = next(n for n, p in three.items() if p is leader)
    source, third = [p for n, p in three.items() if n != name]
    assert source.request("PUT", "/exchanges/dlx", {"type": "direct"})[0] == 201
    assert source.request("POST", "/bindings", {"exchange": "dlx", "queue": "dlq", "routing_key": "dead"})[0] == 201
    src_args = {**LOCAL, "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead"}
    assert source.request("PUT", "/queues/src", {"durable": True, "arguments": src_args})[0] == 201
    _publish(source, "src", "m0")
    assert _reject_all(source, "src") == ["m0"]
    wait_for("m0 in dlq", lambda: _bodies(source, "dlq") == ["m0"])
    wait_for("m0 settled in src", lambda: _queue(source, "src")["messages"] == 0)

    _publish(source, "src", "m1")
    leader.kill()
    assert _reject_all(source, "src") == ["m1"]
    _pause(third)
    try:
        wait_for("m1 held in src", lambda: _waiting(source) == 1)
        wait_for("the source's node leading dlq", lambda: _role(source, "dlq") == "leader", PATIENCE_S)
        assert _queue(source, "src")["messages_unacked"] == 1  # no majority has its copy yet
    finally:
        _resume(third)
    wait_for("m1 settled in src", lambda: _queue(source, "src")["messages"] == 0, PATIENCE_S)
    assert sorted(_bodies(source, "dlq")) == ["m0", "m1"]
