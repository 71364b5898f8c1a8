"""The words the cluster gives clients for what it refuses or ends: a quorum queue that
moved away from this node (``queue_moved``) and one without its majority
(``no quorum``).

A module of its own, with no imports, because the API layer needs these names on
every broker (its error mapping, its channels' consumers), clustered or not, and a
single node must not load the cluster's modules for them (``broker.cluster``'s face
loads a module on first use).
"""

from __future__ import annotations

from typing import Final

__all__ = ["NO_QUORUM", "QUEUE_MOVED", "is_moved", "moved_reason"]

#: How the reason of a consumer cancelled by a quorum queue leaving this node's core
#: while the queue lives on (this node stopped leading it) begins: not a delete.
QUEUE_MOVED: Final = "queue_moved"

#: The reason of a publish nacked, or a quorum queue refused, while the queue's leader
#: has no majority of its replicas.
NO_QUORUM: Final = "no quorum"


def moved_reason(queue: str, why: str) -> str:
    """The cancel reason of ``queue``'s consumers when it leaves this core for ``why``."""
    return f"{QUEUE_MOVED}: this node stopped leading quorum queue {queue!r} ({why})"


def is_moved(reason: str) -> bool:
    """Whether a consumer's cancel ``reason`` is a quorum queue's move (not a delete)."""
    return reason.startswith(QUEUE_MOVED + ":")
