"""Schedules on the broker (``conn.schedules``): publish a message at every tick of a
cron expression, a fixed interval or one time, exactly once per tick (see
docs/coordination.md). REST calls; each returns the schedule as the broker shows it
(``next_tick``, ``ticks_fired``, ``last_lateness_s``...)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

__all__ = ["Schedules"]

_Call = Callable[..., Awaitable[Any]]


def _path(name: str) -> str:
    return f"/schedules/{quote(name, safe='')}"


class Schedules:
    """The broker's schedules, through ``call`` (``BrokerAPI._call``)."""

    def __init__(self, call: _Call) -> None:
        self._call = call

    async def put(
        self,
        name: str,
        *,
        routing_key: str,
        body: bytes | str = b"",
        exchange: str = "",
        properties: dict[str, Any] | None = None,
        cron: str | None = None,
        timezone: str | None = None,
        interval_s: float | None = None,
        start: float | str | None = None,
        at: float | str | None = None,
        missed: str = "latest",
        max_missed: int = 100,
        paused: bool = False,
    ) -> dict[str, Any]:
        """Create or replace schedule ``name`` (an equal definition changes nothing:
        ``changed`` in the answer). Give one timing: ``cron`` (with ``timezone``),
        ``interval_s`` (with ``start``) or ``at``. ``missed``: what ticks missed while
        the broker was down do: ``latest`` (fire the newest once), ``skip``, ``all``
        (at most ``max_missed``).

        Raises: BrokerRequestError (400 for a bad cron, time zone or timing; 404 for
        an unknown exchange), ConnectionLost."""
        spec: dict[str, Any] = {
            "exchange": exchange or "amq.default",
            "routing_key": routing_key,
            "missed": missed,
            "max_missed": max_missed,
            "paused": paused,
        }
        raw = body.encode() if isinstance(body, str) else body
        try:
            spec["body"] = raw.decode("utf-8")
        except UnicodeDecodeError:
            spec["body_b64"] = base64.b64encode(raw).decode()
        if properties:
            spec["properties"] = properties
        for key, value in (("cron", cron), ("timezone", timezone), ("interval_s", interval_s),
                           ("start", start), ("at", at)):
            if value is not None:
                spec[key] = value
        result: dict[str, Any] = await self._call("PUT", _path(name), json=spec)
        return result

    async def get(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("GET", _path(name))
        return result

    async def list(self) -> list[dict[str, Any]]:
        result = await self._call("GET", "/schedules")
        return list(result.get("schedules", [])) if isinstance(result, dict) else []

    async def delete(self, name: str) -> None:
        await self._call("DELETE", _path(name))

    async def pause(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("POST", _path(name) + "/pause")
        return result

    async def resume(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("POST", _path(name) + "/resume")
        return result
