"""``GET /queues`` one page at a time: filter by name, sort and paginate on the
server, so that a management page over 10,000 queues moves one page of JSON.

Without any of the parameters the answer is today's: every queue, in declaration
order, ``{"queues": [...]}``. With any of them the answer is one page plus the counts
a pager needs (``total``, ``filtered``, ``page``, ``page_size``, ``pages``), as
RabbitMQ's management API answers ``/api/queues?page=...``.

Sorting reads only the numbers it sorts by, and only the page's queues are turned into
JSON. Reading a number of 10,000 queues takes tens of milliseconds, so the sort keys
are read in slices with a trio checkpoint between them: a management page refreshing
its list never holds up publishes and deliveries for longer than one slice. A queue
deleted meanwhile is left out of the page.
"""

from __future__ import annotations

from typing import Any

from trio.lowlevel import checkpoint

from broker.core import BrokerViews, InvalidArgument
from broker.http import QueryParams

__all__ = ["LIST_QUERY", "MAX_PAGE_SIZE", "SORT_KEYS", "list_page"]

#: The largest page: RabbitMQ's management API caps ``page_size`` at 500 too.
MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100
#: Sort keys read between two trio checkpoints (about a millisecond's work).
KEYS_PER_SLICE = 500
#: The longest name filter (a queue name is at most 255 bytes).
MAX_FILTER_CHARS = 255

LIST_QUERY = frozenset({"page", "page_size", "name", "sort", "order"})

#: The ``sort`` values: the name, or one of the core's queue counters
#: (``broker.core.QUEUE_COUNTERS``; ties are broken by name).
SORT_KEYS = ("name", "messages", "messages_ready", "messages_unacked", "consumers", "published", "delivered")


async def list_page(views: BrokerViews, query: QueryParams) -> dict[str, Any]:
    """The answer of ``GET /queues`` for ``query``.

    Raises: ``InvalidArgument`` for a bad ``page``, ``page_size``, ``sort`` or ``order``
    (``InvalidRequest`` from the query parser for a non-number).
    """
    if not any(name in query for name in LIST_QUERY):
        return {"queues": views.queue_infos()}
    page = query.get_int("page", 1, min_value=1, max_value=1 << 31)
    page_size = query.get_int("page_size", DEFAULT_PAGE_SIZE, min_value=1, max_value=MAX_PAGE_SIZE)
    needle = query.get_str("name", "")
    if len(needle) > MAX_FILTER_CHARS:
        raise InvalidArgument(f"name filter longer than {MAX_FILTER_CHARS} characters")
    sort = query.get_str("sort", "name")
    if sort not in SORT_KEYS:
        raise InvalidArgument(f"sort must be one of {', '.join(SORT_KEYS)}")
    order = query.get_str("order", "asc")
    if order not in ("asc", "desc"):
        raise InvalidArgument("order must be asc or desc")
    names = views.queue_names()
    total = len(names)
    if needle:
        # a case-insensitive substring, like the filter box of RabbitMQ's queue list
        folded = needle.casefold()
        names = [name for name in names if folded in name.casefold()]
    names.sort()  # the tie-break: stable sorts keep it
    if sort != "name":
        keys: list[int] = []
        for start in range(0, len(names), KEYS_PER_SLICE):
            if start:
                await checkpoint()
            # a queue deleted meanwhile sorts first; it is left out of the page below
            keys.extend(views.queue_counter(sort, name) or 0 for name in names[start : start + KEYS_PER_SLICE])
        order_of = sorted(range(len(names)), key=keys.__getitem__)
        names = [names[i] for i in order_of]
    if order == "desc":
        names.reverse()
    filtered = len(names)
    pages = max(1, -(-filtered // page_size))
    start = (page - 1) * page_size
    infos = (views.queue_info(name) for name in names[start : start + page_size])
    return {
        "queues": [info for info in infos if info is not None],
        "total": total,
        "filtered": filtered,
        "page": page,
        "page_size": page_size,
        "pages": pages,
        "sort": sort,
        "order": order,
    }
