"""Message rates for the ``_details`` fields, from the runtime's history of samples
(``broker.runtime.RateHistory``: one every 5 s, as RabbitMQ's basic rates mode
samples): the change between the last two samples over the time between them.

The history records, broker-wide, the published, delivered, acked, confirmed counters
and the ready and unacked depths; per queue, its depths and its published counter.
A number it does not record has no rate here, and its ``_details`` is left out.
"""

from __future__ import annotations

from typing import Any

__all__ = ["broker_rates", "queue_rates"]


def _last_two(samples: list[dict[str, Any]], fields: tuple[str, ...]) -> dict[str, float]:
    if len(samples) < 2:
        return {}
    older, newer = samples[-2], samples[-1]
    seconds = newer["t"] - older["t"]
    if seconds <= 0:
        return {}
    return {name: (newer[name] - older[name]) / seconds for name in fields if name in newer and name in older}


def queue_rates(history: Any, name: str) -> dict[str, float]:
    """Per-second rates of queue ``name``'s numbers: ``published``, ``messages_ready``,
    ``messages_unacked`` and ``messages`` (ready and unacked)."""
    rates = _last_two(history.queue_json(name)["samples"], ("published", "messages_ready", "messages_unacked"))
    if "messages_ready" in rates:
        rates["messages"] = rates["messages_ready"] + rates.get("messages_unacked", 0.0)
    return rates


def broker_rates(history: Any) -> dict[str, float]:
    """Per-second broker-wide rates: ``published``, ``delivered``, ``acked``,
    ``confirmed``, ``messages_ready``, ``messages_unacked`` and ``messages``."""
    rates = _last_two(
        history.broker_json()["samples"],
        ("published", "delivered", "acked", "confirmed", "messages_ready", "messages_unacked"),
    )
    if "messages_ready" in rates:
        rates["messages"] = rates["messages_ready"] + rates.get("messages_unacked", 0.0)
    return rates
