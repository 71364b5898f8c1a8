"""The permission matrix: for each operation, on REST, channels and streams, a user
holding exactly the permissions it needs is served, and a user missing any one of
them is refused (403 / an ``error`` event ``access_refused``) with nothing changed."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

import pytest

from broker.api.permissions import DEFAULT_EXCHANGE_NAME
from broker.api.rest import DEFAULT_EXCHANGE_ALIAS
from broker.app import BrokerApp
from tests.support.channel import Clients, wait_until
from tests.support.http import open_tcp_client
from tests.support.security import add_user

_names = itertools.count()

Need = tuple[str, str]  # (permission, resource)


@dataclass(frozen=True)
class Case:
    name: str
    needs: tuple[Need, ...]
    rest: tuple[str, str, Any] | None = None  # method, path, JSON body
    op: dict[str, Any] | None = None  # a channel op
    stream: str | None = None  # a queue to stream


_DLX_TO_DEFAULT = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q", "x-message-ttl": 1}

CASES = [
    Case("declare exchange", (("configure", "nx"),), rest=("PUT", "/exchanges/nx", {}),
         op={"op": "declare_exchange", "exchange": "nx"}),
    Case("delete exchange", (("configure", "x"),), rest=("DELETE", "/exchanges/x", None),
         op={"op": "delete_exchange", "exchange": "x"}),
    Case("declare queue", (("configure", "nq"),), rest=("PUT", "/queues/nq", {}),
         op={"op": "declare_queue", "queue": "nq"}),
    # an argument that makes the broker publish for the declarer: write on that exchange
    # and read on the entity declared, as RabbitMQ
    Case("declare queue with a dead-letter exchange", (("configure", "nq"), ("read", "nq"), ("write", "x")),
         rest=("PUT", "/queues/nq", {"arguments": {"x-dead-letter-exchange": "x"}}),
         op={"op": "declare_queue", "queue": "nq", "arguments": {"x-dead-letter-exchange": "x"}}),
    Case("declare queue dead-lettering to the default exchange",
         (("configure", "nq"), ("read", "nq"), ("write", "amq.default")),
         rest=("PUT", "/queues/nq", {"arguments": _DLX_TO_DEFAULT}),
         op={"op": "declare_queue", "queue": "nq", "arguments": _DLX_TO_DEFAULT}),
    Case("declare server-named queue with a dead-letter exchange",
         (("configure", "amq.gen-"), ("read", "amq.gen-"), ("write", "x")),
         op={"op": "declare_queue", "queue": "", "arguments": {"x-dead-letter-exchange": "x"}}),
    Case("declare exchange with an alternate exchange", (("configure", "nx"), ("read", "nx"), ("write", "x")),
         rest=("PUT", "/exchanges/nx", {"arguments": {"alternate-exchange": "x"}}),
         op={"op": "declare_exchange", "exchange": "nx", "arguments": {"alternate-exchange": "x"}}),
    Case("declare exchange with the default exchange as its alternate",
         (("configure", "nx"), ("read", "nx"), ("write", "amq.default")),
         rest=("PUT", "/exchanges/nx", {"arguments": {"alternate-exchange": ""}}),
         op={"op": "declare_exchange", "exchange": "nx", "arguments": {"alternate-exchange": ""}}),
    Case("declare server-named queue", (("configure", "amq.gen-"),), op={"op": "declare_queue", "queue": ""}),
    Case("delete queue", (("configure", "q"),), rest=("DELETE", "/queues/q", None),
         op={"op": "delete_queue", "queue": "q"}),
    Case("publish", (("write", "x"),), rest=("POST", "/exchanges/x/publish?routing_key=k", b"m"),
         op={"op": "publish", "exchange": "x", "routing_key": "k", "body": "m"}),
    Case("publish to the default exchange", (("write", "amq.default"),),
         rest=("POST", "/exchanges/amq.default/publish?routing_key=q", b"m"),
         op={"op": "publish", "exchange": "", "routing_key": "q", "body": "m"}),
    Case("bind", (("write", "q"), ("read", "x")), rest=("POST", "/bindings", {"exchange": "x", "queue": "q", "routing_key": "n"}),
         op={"op": "bind", "exchange": "x", "queue": "q", "routing_key": "n"}),
    Case("bind exchange to exchange", (("write", "y"), ("read", "x")),
         rest=("POST", "/bindings", {"exchange": "x", "to_exchange": "y", "routing_key": "n"}),
         op={"op": "bind", "exchange": "x", "to_exchange": "y", "routing_key": "n"}),
    Case("bind to a consistent-hash exchange", (("write", "q"), ("read", "h")),
         rest=("POST", "/bindings", {"exchange": "h", "queue": "q", "routing_key": "1"}),
         op={"op": "bind", "exchange": "h", "queue": "q", "routing_key": "1"}),
    Case("bind an exchange to a consistent-hash exchange", (("write", "h"), ("read", "x")),
         rest=("POST", "/bindings", {"exchange": "x", "to_exchange": "h", "routing_key": "n"}),
         op={"op": "bind", "exchange": "x", "to_exchange": "h", "routing_key": "n"}),
    Case("bind a consistent-hash exchange to an exchange", (("write", "y"), ("read", "h")),
         rest=("POST", "/bindings", {"exchange": "h", "to_exchange": "y", "routing_key": "1"}),
         op={"op": "bind", "exchange": "h", "to_exchange": "y", "routing_key": "1"}),
    Case("unbind", (("write", "q"), ("read", "x")), rest=("DELETE", "/bindings", {"exchange": "x", "queue": "q", "routing_key": "k"}),
         op={"op": "unbind", "exchange": "x", "queue": "q", "routing_key": "k"}),
    Case("get", (("read", "q"),), rest=("POST", "/queues/q/get", None)),
    Case("get from several queues", (("read", "q"), ("read", "q2")), rest=("POST", "/get", {"queues": ["q", "q2"]})),
    Case("consume", (("read", "q"),), op={"op": "consume", "queue": "q", "consumer_tag": "c"}, stream="q"),
    Case("purge", (("read", "q"),), rest=("POST", "/queues/q/purge", None), op={"op": "purge_queue", "queue": "q"}),
    Case("ack leases", (("read", "q"),), rest=("POST", "/queues/q/ack", {"lease_ids": ["nope"]})),
    Case("nack leases", (("read", "q"),), rest=("POST", "/queues/q/nack", {"lease_ids": ["nope"]})),
    Case("extend leases", (("read", "q"),), rest=("POST", "/queues/q/extend", {"lease_ids": ["nope"]})),
    Case("browse", (("read", "q"),), rest=("GET", "/queues/q/messages", None)),
    Case("redrive", (("administrator", ""), ("read", "q"), ("write", "amq.default")),
         rest=("POST", "/queues/q/redrive", {})),
    Case("redrive to an exchange", (("administrator", ""), ("read", "q"), ("write", "x")),
         rest=("POST", "/queues/q/redrive", {"exchange": "x", "routing_key": "k"})),
    Case("acquire a lock", (("write", "nightly"),), rest=("POST", "/locks/nightly/acquire", {"owner": "o"}),
         op={"op": "lock_acquire", "lock": "nightly", "owner": "o"}),
    Case("refresh a lock", (("write", "held"),), rest=("POST", "/locks/held/refresh", {"owner": "h", "token": 1}),
         op={"op": "lock_refresh", "lock": "held", "owner": "h", "token": 1}),
    Case("release a lock", (("write", "held"),), rest=("POST", "/locks/held/release", {"owner": "h", "token": 1}),
         op={"op": "lock_release", "lock": "held", "owner": "h", "token": 1}),
    Case("put a schedule", (("configure", "tick"), ("write", "x")),
         rest=("PUT", "/schedules/tick", {"exchange": "x", "routing_key": "k", "body": "t", "interval_s": 60})),
    Case("put a schedule on the default exchange", (("configure", "tick"), ("write", "amq.default")),
         rest=("PUT", "/schedules/tick", {"routing_key": "q", "body": "t", "interval_s": 60})),
    Case("pause a schedule", (("configure", "daily"),), rest=("POST", "/schedules/daily/pause", None)),
    Case("delete a schedule", (("configure", "daily"),), rest=("DELETE", "/schedules/daily", None)),
]


def permissions_for(needs: tuple[Need, ...]) -> tuple[dict[str, str], tuple[str, ...]]:
    by_kind: dict[str, list[str]] = {"configure": [], "write": [], "read": []}
    tags: tuple[str, ...] = ()
    for permission, resource in needs:
        if permission == "administrator":
            tags = ("administrator",)
        else:
            by_kind[permission].append(resource)
    return {k: ("^(" + "|".join(re.escape(n) for n in v) + ")$") if v else "" for k, v in by_kind.items()}, tags


def state(app: BrokerApp) -> Any:
    core = app.runtime.core
    return (
        sorted(core.exchanges),
        sorted((q.name, q.ready_count(), q.unacked, len(q.consumers)) for q in core.queues.values()),
        sorted(str(b) for b in core.list_bindings()),
        sorted((lock["name"], lock.get("owner"), lock.get("token")) for lock in core.lock_list()),
        sorted((sched["name"], sched.get("paused"), sched.get("exchange")) for sched in core.schedule_list()),
    )


async def setup(app: BrokerApp) -> None:
    core = app.runtime.core
    add_user(core, "admin", tags=("administrator",))
    core.declare_exchange("x", "direct")
    core.declare_exchange("y", "fanout")
    core.declare_exchange("h", "x-consistent-hash")
    core.declare_queue("q")
    core.declare_queue("q2")
    core.bind("x", "q", "k", {})
    core.publish(0, "", "q", b"ready", None)
    core.lock_acquire(0, "held", "h", 600, 0)  # (token 1)
    core.put_schedule("daily", exchange="x", routing_key="k", body=b"d", properties=None,
                      timing={"cron": "0 3 * * *"}, missed="latest", max_missed=100, paused=False)
    await app.runtime.wait_durable()


def attempts(case: Case) -> list[tuple[str, tuple[Need, ...], bool]]:
    """(label, needs granted, allowed?): all of them, then each one missing."""
    out = [("all", case.needs, True)]
    for missing in case.needs:
        out.append((f"without {missing[0]} on {missing[1]!r}", tuple(n for n in case.needs if n != missing), False))
    return out


def user_with(app: BrokerApp, granted: tuple[Need, ...]) -> list[tuple[str, str]]:
    permissions, tags = permissions_for(granted)
    return add_user(app.runtime.core, f"u{next(_names)}", tags=tags, permissions=permissions)


@pytest.mark.parametrize("case", [c for c in CASES if c.rest], ids=lambda c: c.name)
async def test_rest(broker_app: BrokerApp, case: Case) -> None:
    await setup(broker_app)
    assert case.rest is not None
    method, path, body = case.rest
    async with open_tcp_client(broker_app.port) as client:
        for label, granted, allowed in attempts(case):
            creds = user_with(broker_app, granted)
            await broker_app.runtime.wait_durable()
            await wait_until(lambda: len(broker_app.runtime.core.channels) == 1)  # earlier ones ended
            before = state(broker_app)
            kw: dict[str, Any] = {}
            if isinstance(body, bytes):
                kw["body"] = body
            elif body is not None:
                kw["json"] = body
            reply = await client.request(method, path, headers=creds, **kw)
            if allowed:
                assert reply.status < 400 or reply.error not in ("access_refused", "unauthorized"), (label, reply.body)
            else:
                assert reply.status == 403 and reply.error == "access_refused", (label, reply.status, reply.body)
                assert state(broker_app) == before, label


@pytest.mark.parametrize("case", [c for c in CASES if c.op], ids=lambda c: c.name)
async def test_channel(broker_app: BrokerApp, case: Case) -> None:
    await setup(broker_app)
    assert case.op is not None
    async with Clients(broker_app.port) as clients:
        for label, granted, allowed in attempts(case):
            creds = user_with(broker_app, granted)
            await broker_app.runtime.wait_durable()
            await wait_until(lambda: len(broker_app.runtime.core.channels) == 1)  # earlier ones ended
            before = state(broker_app)
            ch = await clients.channel(headers=creds)
            await ch.send({**case.op, "id": "the-op"})
            await ch.send({"op": "close", "id": "end"})
            events = await ch.remaining_events()
            errors = [e for e in events if e["ev"] == "error"]
            if allowed:
                assert not errors, (label, events)
                assert any(e.get("id") == "end" for e in events), (label, events)
            else:
                assert len(errors) == 1 and errors[0]["error"] == "access_refused", (label, events)
                assert errors[0]["id"] == "the-op"
                assert not [e for e in events if e["ev"] in ("ack", "nack", "ok", "consume_ok")], (label, events)
                assert state(broker_app) == before, label


@pytest.mark.parametrize("case", [c for c in CASES if c.stream], ids=lambda c: c.name)
async def test_stream(broker_app: BrokerApp, case: Case) -> None:
    await setup(broker_app)
    assert case.stream is not None
    async with Clients(broker_app.port) as clients:
        for label, granted, allowed in attempts(case):
            creds = user_with(broker_app, granted)
            await broker_app.runtime.wait_durable()
            await wait_until(lambda: len(broker_app.runtime.core.channels) == 1)  # earlier ones ended
            before = state(broker_app)
            stream = await clients.stream(case.stream, headers=creds)
            if allowed:
                assert stream.status == 200, label
                assert (await stream.next_item())["body"] == "ready"
                await stream.abort()
            else:
                assert stream.status == 403, label
                assert state(broker_app) == before, label


async def test_a_permission_change_reaches_an_open_channel(broker_app: BrokerApp) -> None:
    await setup(broker_app)
    core = broker_app.runtime.core
    creds = add_user(core, "svc", permissions={"configure": "", "write": "^x$", "read": ""})
    await broker_app.runtime.wait_durable()
    async with Clients(broker_app.port) as clients:
        ch = await clients.channel(headers=creds)
        await ch.send({"op": "publish", "exchange": "x", "routing_key": "k", "body": "1"})
        assert (await ch.expect("ack"))["delivery_tag"] == 1
        core.set_permissions("svc", {"write": "^y$"})
        await ch.send({"op": "publish", "exchange": "x", "routing_key": "k", "body": "2"})
        error = await ch.expect("error")
        assert error["error"] == "access_refused"
    assert core.queues["q"].ready_count() == 2  # "ready" and "1"


async def test_a_deleted_users_open_channel_is_refused_everything(broker_app: BrokerApp) -> None:
    await setup(broker_app)
    core = broker_app.runtime.core
    creds = add_user(core, "svc")
    await broker_app.runtime.wait_durable()
    async with Clients(broker_app.port) as clients:
        ch = await clients.channel(headers=creds)
        await ch.send({"op": "publish", "exchange": "x", "routing_key": "k", "body": "1"})
        assert (await ch.expect("ack"))["delivery_tag"] == 1
        core.delete_user("svc")
        await ch.send({"op": "publish", "exchange": "x", "routing_key": "k", "body": "2", "id": "late"})
        error = await ch.expect("error")
        assert error["error"] == "access_refused" and error["id"] == "late"
    assert core.queues["q"].ready_count() == 2  # "ready" and "1"


async def test_dead_letter_and_alternate_exchanges_do_not_bypass_write(broker_app: BrokerApp) -> None:
    """The reported attack: a user confined to ``^a\\.`` puts messages into
    ``secret.q`` through a dead-letter exchange or an alternate exchange. Each declare
    is refused and changes nothing; with a user allowed to write there, both work."""
    core = broker_app.runtime.core
    add_user(core, "admin", tags=("administrator",))
    core.declare_queue("secret.q")
    core.declare_exchange("secret.x", "fanout")
    core.bind("secret.x", "secret.q", "", {})
    confined = add_user(core, "mallory", permissions={"configure": r"^a\.", "write": r"^a\.", "read": r"^a\."})
    await broker_app.runtime.wait_durable()
    dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "secret.q", "x-message-ttl": 1}
    async with open_tcp_client(broker_app.port) as client:
        reply = await client.request("POST", "/exchanges/amq.default/publish?routing_key=secret.q", body=b"m",
                                     headers=confined)
        assert reply.status == 403
        reply = await client.request("PUT", "/queues/a.q", json={"arguments": dlx}, headers=confined)
        assert reply.status == 403 and reply.error == "access_refused", reply.body
        assert "amq.default" in reply.json()["message"]
        reply = await client.request("PUT", "/exchanges/a.x", json={"type": "fanout", "arguments": {"alternate-exchange": "secret.x"}},
                                     headers=confined)
        assert reply.status == 403 and reply.error == "access_refused", reply.body
        assert "secret.x" in reply.json()["message"]
        async with Clients(broker_app.port) as clients:
            ch = await clients.channel(headers=confined)
            await ch.send({"op": "declare_queue", "queue": "a.q", "arguments": dlx, "id": 1})
            error = await ch.expect("error")
            assert error["error"] == "access_refused" and error["id"] == 1
        assert "a.q" not in core.queues and "a.x" not in core.exchanges
        # what the arguments are for still works for a user allowed to write there
        trusted = add_user(core, "svc", permissions={"configure": r"^a\.", "write": r"^(a\.|amq\.default$)", "read": r"^a\."})
        await broker_app.runtime.wait_durable()
        assert (await client.request("PUT", "/queues/a.q", json={"arguments": dlx}, headers=trusted)).status == 201
        assert core.queues["secret.q"].ready_count() == 0  # mallory got nothing in
        reply = await client.request("POST", "/exchanges/amq.default/publish?routing_key=a.q", body=b"m", headers=trusted)
        assert reply.status == 200
    await wait_until(lambda: core.queues["secret.q"].ready_count() == 1)  # expired into it


def test_the_default_exchange_has_one_name_in_paths_and_permissions() -> None:
    assert DEFAULT_EXCHANGE_NAME == DEFAULT_EXCHANGE_ALIAS == "amq.default"
