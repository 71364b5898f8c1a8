"""Cluster mode's schedules: defined in etcd, fired by one node at a time, each tick
once, through any node's death (docs/cluster.md, "Locks and schedules").

- A schedule's definition is ``/<cluster>/schedules/<name>`` (exchange, routing key,
  body, properties, timing, missed policy, paused), put by whichever node is asked,
  validated first by a scratch core exactly as a single node would.
- Its progress is ``/<cluster>/schedule-state/<name>`` (``fired_up_to``: the newest
  tick handled; counters).
- The **runner** is the node holding ``/<cluster>/scheduler``, taken with a txn
  (``create_revision == 0``) and put with the node's membership lease: it vanishes
  when that node dies or loses etcd, and another node takes it. Only the runner
  fires; it looks every :data:`POLL_S`.
- A tick is published through the node's gateway (so it reaches queues on every
  node) with ``message_id`` ``<name>@<tick>``, *then* recorded with a txn that
  compares the state's revision. A runner that dies between the two leaves the tick
  unrecorded: the next runner fires it again with the same message id, which the
  queues' owners deduplicate (within their window, 2 minutes by default). So a tick
  is fired once, or at worst published twice and taken once.
- Ticks that came due while nobody ran (the time a dead runner's lease takes to
  lapse) follow the schedule's ``missed`` policy, as after a single node's restart.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import quote, unquote

import orjson
import trio

from broker.cluster.etcd import EtcdClient
from broker.cluster.etcdproto import (
    CompareCreate,
    CompareMod,
    EtcdError,
    KeyValue,
    OpDelete,
    OpPut,
)
from broker.cluster.view import ClusterKeys, ClusterView, canonical
from broker.core import (
    BUILTIN_EXCHANGES,
    Broker,
    NotFound,
    Unavailable,
    iso_utc,
    parse_timing,
)

__all__ = ["ClusterSchedules"]

log = logging.getLogger("ackbus.cluster")

#: How often the runner looks for due ticks (and others for a runner's absence).
POLL_S: Final = 0.5

#: publish(exchange, routing_key, body, properties) -> None when acked, else why not
Publish = Callable[[str, str, bytes, dict[str, Any]], Awaitable[str | None]]


class ClusterSchedules:
    """Schedules in etcd and their runner (see the module docstring)."""

    def __init__(self, client: EtcdClient, keys: ClusterKeys, view: ClusterView, node_name: str) -> None:
        self.client = client
        self.view = view
        self.node_name = node_name
        self.defs = keys.root + b"schedules/"
        self.states = keys.root + b"schedule-state/"
        self.runner_key = keys.root + b"scheduler"
        self.running = False

    def _def_key(self, name: str) -> bytes:
        return self.defs + quote(name, safe="").encode()

    def _state_key(self, name: str) -> bytes:
        return self.states + quote(name, safe="").encode()

    # -------------------------------------------------------------- definitions

    def _validated(self, name: str, d: dict[str, Any]) -> dict[str, Any]:
        """Check ``d`` with a scratch core (the single node's rules); its info."""
        scratch = Broker(clock=lambda: time.monotonic(), wall_clock=time.time)
        exchange = d["exchange"]
        if exchange not in BUILTIN_EXCHANGES:
            x = self.view.get("exchanges", exchange)
            if x is None:
                raise NotFound(f"no exchange {exchange!r}")
            scratch.declare_exchange(exchange, x["type"], internal=x["internal"], arguments=x["arguments"])
        info, _changed = scratch.put_schedule(
            name, exchange=exchange, routing_key=d["routing_key"], body=base64.b64decode(d["body_b64"]),
            properties=d["properties"], timing=d["timing"], missed=d["missed"], max_missed=d["max_missed"],
            paused=d["paused"],
        )
        return dict(info)

    async def put(
        self, name: str, *, exchange: str, routing_key: str, body: bytes, properties: dict[str, Any] | None,
        timing: dict[str, Any], missed: str, max_missed: Any, paused: bool,
    ) -> dict[str, Any]:
        d: dict[str, Any] = {
            "exchange": exchange, "routing_key": routing_key, "body_b64": base64.b64encode(body).decode(),
            "properties": properties, "timing": timing, "missed": missed, "max_missed": max_missed,
            "paused": paused, "created": time.time(),
        }
        self._validated(name, d)
        await self._etcd(self.client.put(self._def_key(name), canonical(d)))
        return await self.info(name)

    async def delete(self, name: str) -> None:
        result = await self._etcd(
            self.client.txn([CompareCreate(self._def_key(name))], [], [OpDelete(self._def_key(name)), OpDelete(self._state_key(name))])
        )
        if result.succeeded:  # create_revision 0: absent
            raise NotFound(f"no schedule {name!r}")

    async def pause(self, name: str, paused: bool) -> dict[str, Any]:
        _rev, found = await self._etcd(self.client.get(self._def_key(name)))
        if found is None:
            raise NotFound(f"no schedule {name!r}")
        d = dict(orjson.loads(found.value))
        if d["paused"] != paused:
            d["paused"] = paused
            if not paused:
                d["resumed"] = time.time()  # ticks missed while paused are skipped
            await self._etcd(self.client.txn([CompareMod(found.key, found.mod_revision)], [OpPut(found.key, canonical(d))], []))
        return await self.info(name)

    async def info(self, name: str) -> dict[str, Any]:
        _rev, found = await self._etcd(self.client.get(self._def_key(name)))
        if found is None:
            raise NotFound(f"no schedule {name!r}")
        _rev, state = await self._etcd(self.client.get(self._state_key(name)))
        return self._info(name, found, state)

    async def infos(self) -> list[dict[str, Any]]:
        _rev, defs = await self._etcd(self.client.get_prefix(self.defs))
        _rev, states = await self._etcd(self.client.get_prefix(self.states))
        by_name = {kv.key[len(self.states):]: kv for kv in states}
        return [self._info(unquote(kv.key[len(self.defs):].decode()), kv, by_name.get(kv.key[len(self.defs):])) for kv in defs]

    def _info(self, name: str, found: KeyValue, state: KeyValue | None) -> dict[str, Any]:
        d = orjson.loads(found.value)
        s = orjson.loads(state.value) if state is not None else {}
        timing = parse_timing(d["timing"], d["created"])
        after = max(s.get("fired_up_to", d["created"]), d.get("resumed", 0.0))
        nxt = None if d["paused"] else timing.next_after(after)
        return {
            "name": name, "exchange": d["exchange"], "routing_key": d["routing_key"], **timing.to_json(),
            "kind": timing.kind, "missed": d["missed"], "max_missed": d["max_missed"], "paused": d["paused"],
            "created_at": iso_utc(d["created"]), "next_tick": iso_utc(nxt) if nxt is not None else None,
            "fired_up_to": iso_utc(after), "ticks_fired": s.get("ticks_fired", 0), "ticks_skipped": s.get("ticks_skipped", 0),
            "last_error": s.get("last_error"), "runner": self.node_name if self.running else None,
        }

    @staticmethod
    async def _etcd(call: Awaitable[Any]) -> Any:
        try:
            return await call
        except EtcdError as exc:
            raise Unavailable(f"etcd is unreachable, so schedules cannot be used now: {exc.message}", code="etcd_unavailable") from None

    # ------------------------------------------------------------------ runner

    async def run(self, lease: Callable[[], int], publish: Publish) -> None:
        """Take the runner's key when it is free (with this node's lease ``lease()``)
        and fire due ticks while holding it; until cancelled."""
        while True:
            try:
                self.running = await self._hold_runner(lease())
                if self.running:
                    await self._fire_due(publish)
            except EtcdError as exc:
                self.running = False
                log.warning("schedules: etcd failed", extra={"fields": {"error": exc.message}})
            await trio.sleep(POLL_S)

    async def _hold_runner(self, lease: int) -> bool:
        if not lease:
            return False
        result = await self.client.txn(
            [CompareCreate(self.runner_key)], [OpPut(self.runner_key, self.node_name.encode(), lease)], []
        )
        if result.succeeded:
            log.info("schedules: this node runs them", extra={"fields": {"node": self.node_name}})
            return True
        _rev, found = await self.client.get(self.runner_key)
        return found is not None and found.value == self.node_name.encode() and found.lease == lease

    async def _fire_due(self, publish: Publish) -> None:
        _rev, defs = await self.client.get_prefix(self.defs)
        now = time.time()
        for kv in defs:
            d = orjson.loads(kv.value)
            if d["paused"]:
                continue
            name = unquote(kv.key[len(self.defs):].decode())
            _rev, state = await self.client.get(self._state_key(name))
            s = orjson.loads(state.value) if state is not None else {"fired_up_to": d["created"], "ticks_fired": 0, "ticks_skipped": 0}
            after = max(float(s["fired_up_to"]), float(d.get("resumed", 0.0)))
            timing = parse_timing(d["timing"], d["created"])
            ticks, total = timing.due(after, now, int(d["max_missed"]))
            if not ticks:
                continue
            late = [t for t in ticks if now - t > 2 * POLL_S + 1.0]
            on_time = [t for t in ticks if t not in late]
            fire = on_time + ({"latest": late[-1:], "skip": [], "all": late}[d["missed"]] if late else [])
            fire.sort()
            for tick in fire:
                error = await publish(*self._message(name, d, tick))
                s["last_error"] = error
            s["ticks_fired"] = int(s["ticks_fired"]) + len(fire)
            s["ticks_skipped"] = int(s["ticks_skipped"]) + (total - len(fire))
            s["fired_up_to"] = ticks[-1]
            compare = CompareMod(self._state_key(name), state.mod_revision) if state is not None else CompareCreate(self._state_key(name))
            await self.client.txn([compare], [OpPut(self._state_key(name), canonical(s))], [])

    @staticmethod
    def _message(name: str, d: dict[str, Any], tick: float) -> tuple[str, str, bytes, dict[str, Any]]:
        stamp = iso_utc(tick)
        properties = dict(d["properties"] or {})
        headers = dict(properties.get("headers") or {})
        headers["x-schedule"] = name
        headers["x-schedule-tick"] = stamp
        properties["headers"] = headers
        properties["message_id"] = f"{name}@{stamp}"
        properties.setdefault("timestamp", int(tick))
        return d["exchange"], d["routing_key"], base64.b64decode(d["body_b64"]), properties
