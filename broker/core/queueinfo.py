"""A queue's description: what the API shows of one queue.

:func:`queue_info` reads a queue's settings and counts into a JSON-ready dict (the
``Broker.queue_info`` command; the views of views.py call it for ``GET /queues`` and
``GET /queues/{name}``); it changes nothing.
"""

from __future__ import annotations

import copy
from typing import Any

from .entities import Queue

__all__ = ["queue_info"]


def queue_info(queue: Queue) -> dict[str, Any]:
    """One queue as the API shows it (``GET /queues/{name}``, the queue list): its
    settings, counts and message statistics."""
    ready = queue.ready_count()
    info = {
        "name": queue.name,
        "durable": queue.durable,
        "exclusive": queue.exclusive_owner is not None,
        "auto_delete": queue.auto_delete,
        "arguments": copy.deepcopy(queue.arguments),  # the caller's to change
        "messages": ready + queue.unacked,
        "messages_ready": ready,
        "messages_unacked": queue.unacked,
        "messages_delayed": len(queue.delayed),
        "consumers": len(queue.consumers),
        "message_stats": {
            "published": queue.published,
            "delivered": queue.delivered,
            "acked": queue.acked,
            "redelivered": queue.redelivered,
            "dead_lettered": dict(queue.dead_lettered),
        },
    }
    if queue.max_priority is not None:
        # a priority queue's ready messages by priority level (levels holding any)
        info["messages_ready_by_priority"] = {
            str(level): len(lane) for level, lane in enumerate(queue.lanes) if lane
        }
    return info
