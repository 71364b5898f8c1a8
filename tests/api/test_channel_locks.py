"""Locks as channel ops: acquire (at once, after waiting in line while the channel
goes on, or refused), refresh, release and lock_info; refusals do not close the
channel, bad input does (an ``error`` event)."""

from __future__ import annotations

from broker.app import BrokerApp
from tests.support.channel import Clients, wait_until


async def test_acquire_refresh_release_on_a_channel(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    got = await ch.ok({"op": "lock_acquire", "lock": "nightly", "owner": "w1", "ttl_s": 30})
    assert got["op"] == "lock_acquire" and got["lock"]["owner"] == "w1"
    token = got["lock"]["token"]
    info = await ch.ok({"op": "lock_info", "lock": "nightly"})
    assert info["lock"]["token"] == token
    refreshed = await ch.ok({"op": "lock_refresh", "lock": "nightly", "owner": "w1", "token": token, "ttl_s": 5})
    assert refreshed["lock"]["ttl_s"] == 5
    wrong = await ch.call({"op": "lock_release", "lock": "nightly", "owner": "w2", "token": token})
    assert wrong["ev"] == "refused" and wrong["error"] == "not_lock_holder" and wrong["lock"]["owner"] == "w1"
    released = await ch.ok({"op": "lock_release", "lock": "nightly", "owner": "w1", "token": token})
    assert released["lock"]["held"] is False


async def test_a_waiting_acquire_does_not_block_the_channel(app: BrokerApp, clients: Clients) -> None:
    a = await clients.channel()
    b = await clients.channel()
    first = await a.ok({"op": "lock_acquire", "lock": "l", "owner": "a", "ttl_s": 30})
    busy = await b.call({"op": "lock_acquire", "lock": "l", "owner": "b"})
    assert busy["ev"] == "refused" and busy["error"] == "lock_held" and busy["lock"]["owner"] == "a"
    await b.send({"op": "lock_acquire", "lock": "l", "owner": "b", "wait_s": 30, "id": "w"})
    info = await b.ok({"op": "lock_info", "lock": "l"})  # answered while the acquire waits
    assert [w["owner"] for w in info["lock"]["waiters"]] == ["b"]
    await a.ok({"op": "lock_release", "lock": "l", "owner": "a", "token": first["lock"]["token"]})
    granted = await b.expect("ok", id="w", op="lock_acquire")
    assert granted["lock"]["owner"] == "b" and granted["lock"]["token"] > first["lock"]["token"]


async def test_a_wait_that_runs_out_is_refused(app: BrokerApp, clients: Clients) -> None:
    a = await clients.channel()
    b = await clients.channel()
    await a.ok({"op": "lock_acquire", "lock": "l", "owner": "a", "ttl_s": 30})
    await b.send({"op": "lock_acquire", "lock": "l", "owner": "b", "wait_s": 0.2, "id": 7})
    ended = await b.expect("refused", id=7, op="lock_acquire", error="lock_held")
    assert ended["lock"]["owner"] == "a"


async def test_a_channel_that_closes_leaves_the_line(app: BrokerApp, clients: Clients) -> None:
    a = await clients.channel()
    b = await clients.channel()
    first = await a.ok({"op": "lock_acquire", "lock": "l", "owner": "a", "ttl_s": 30})
    await b.send({"op": "lock_acquire", "lock": "l", "owner": "b", "wait_s": 30})
    await b.ok({"op": "lock_info", "lock": "l"})
    await b.ok({"op": "close"})
    await wait_until(lambda: b.channel_id not in app.runtime.core.channels)
    await a.ok({"op": "lock_release", "lock": "l", "owner": "a", "token": first["lock"]["token"]})
    assert (await a.ok({"op": "lock_info", "lock": "l"}))["lock"]["held"] is False


async def test_bad_input_closes_the_channel_with_an_error(app: BrokerApp, clients: Clients) -> None:
    ch = await clients.channel()
    reply = await ch.call({"op": "lock_acquire", "lock": "l", "owner": "a", "ttl_s": -1})
    assert reply["ev"] == "error" and reply["error"] == "invalid_argument"
