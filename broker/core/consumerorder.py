"""Consumer priorities (``x-priority`` on consume): which consumer of a queue is
offered its next message when the consumers' priorities differ.

RabbitMQ's rule: the consumers of the highest priority get the messages while they
can take them (room in their prefetch and credit); only when every one of them is
full do consumers of a lower priority get any; consumers of one priority take turns.
A queue keeps its consumers ordered by priority, highest first, registration order
within a priority; a consumer that was given a message moves behind the others of its
priority (RabbitMQ's turn-taking). When all priorities are equal, ``Deliveries``
keeps its plain round-robin and this module is not called.

A single-active-consumer queue ignores priorities (registration order decides which
consumer is active, as in RabbitMQ 3.10).
"""

from __future__ import annotations

from .entities import Consumer, Queue
from .errors import InvalidArgument

__all__ = ["MAX_CONSUMER_PRIORITY", "add_consumer", "check_consumer_priority", "choose_by_priority"]

#: ``x-priority`` is a signed 32-bit integer in RabbitMQ.
MAX_CONSUMER_PRIORITY = (1 << 31) - 1


def check_consumer_priority(priority: object) -> int:
    """The one ``x-priority`` rule (AMQP's consume argument and the HTTP channel's):
    an integer within a signed 32 bits; None is 0. Raises InvalidArgument."""
    if priority is None:
        return 0
    if not isinstance(priority, int) or isinstance(priority, bool) or not (
        -MAX_CONSUMER_PRIORITY - 1 <= priority <= MAX_CONSUMER_PRIORITY
    ):
        raise InvalidArgument(f"x-priority must be an integer (a signed 32-bit one), not {priority!r}")
    return priority


def add_consumer(queue: Queue, consumer: Consumer) -> None:
    """Register ``consumer`` in ``queue``'s list: after every consumer of its priority
    or higher (at the end on a single-active-consumer queue)."""
    consumers = queue.consumers
    if queue.single_active or not consumers or consumers[-1].priority >= consumer.priority:
        consumers.append(consumer)
        return
    index = len(consumers)
    while index and consumers[index - 1].priority < consumer.priority:
        index -= 1
    consumers.insert(index, consumer)
    if queue.rr >= index and queue.rr:
        queue.rr += 1  # (the plain round-robin's cursor keeps pointing at the same one)


def choose_by_priority(queue: Queue) -> Consumer | None:
    """The consumer to give ``queue``'s next message to: the first that can take one
    in the highest priority that has any; it moves behind its priority's others.
    None when every consumer is full."""
    consumers = queue.consumers
    n = len(consumers)
    start = 0
    while start < n:
        priority = consumers[start].priority
        end = start + 1
        while end < n and consumers[end].priority == priority:
            end += 1
        for index in range(start, end):
            consumer = consumers[index]
            if consumer.can_take():
                if index != end - 1:
                    del consumers[index]
                    consumers.insert(end - 1, consumer)
                return consumer
        start = end
    return None
