"""The list query of the management API: ``columns``, and RabbitMQ's pagination
(``page``, ``page_size``, ``name``, ``sort``, ``sort_reverse``; not ``use_regex``: a
regular expression could take exponential time).

Without ``page`` a list is a JSON array, as RabbitMQ answers; with it, one page in
RabbitMQ's envelope (``items``, ``page``, ``page_count``, ``page_size``,
``filtered_count``, ``item_count``, ``total_count``). ``columns`` keeps only the
named fields (``message_stats.publish`` names one inside an object), as
``rabbitmqadmin`` and the exporters ask; RabbitMQ applies it to a single object's
answer too (:func:`shown`). A page past the last is RabbitMQ's ``400
page_out_of_range`` (:class:`PageOutOfRange`), not an empty page.
"""

from __future__ import annotations

from typing import Any, Final

from broker.api.management.errors import PageOutOfRange
from broker.core import InvalidArgument
from broker.http import QueryParams

__all__ = ["MAX_PAGE_SIZE", "listed", "shown"]

#: RabbitMQ's largest page.
MAX_PAGE_SIZE: Final = 500
#: The longest ``name`` filter (a name is at most 255 bytes).
MAX_FILTER_CHARS: Final = 255


def listed(items: list[dict[str, Any]], query: QueryParams) -> Any:
    """The answer of a list endpoint for ``items`` under ``query``.

    Raises: ``InvalidArgument`` (400) for a bad page or page size, a filter too long,
    or ``use_regex=true``; ``PageOutOfRange`` (400) for a page past the last.
    """
    if "page" in query:
        page = _page(items, query)
        page["items"] = _columns(page["items"], query)
        return page
    return _columns(items, query)


def _page(items: list[dict[str, Any]], query: QueryParams) -> dict[str, Any]:
    page = query.get_int("page", 1, min_value=1, max_value=1 << 31)
    page_size = query.get_int("page_size", 100, min_value=1, max_value=MAX_PAGE_SIZE)
    total = len(items)
    needle = query.get_str("name", "")
    if len(needle) > MAX_FILTER_CHARS:
        raise InvalidArgument(f"name filter longer than {MAX_FILTER_CHARS} characters")
    if query.get_str("use_regex", "false") == "true":
        # a regular expression can take exponential time on a name (Python's re has
        # no time limit): one request must not hold up the broker
        raise InvalidArgument("use_regex is not supported: the name filter is a substring")
    if needle:
        folded = needle.casefold()
        items = [item for item in items if folded in str(item.get("name", "")).casefold()]
    sort = query.get_str("sort", "")
    reverse = query.get_str("sort_reverse", "false") == "true"
    if sort:
        items = sorted(items, key=lambda item: _sort_key(_path(item, sort)), reverse=reverse)
    elif reverse:
        items = items[::-1]
    filtered = len(items)
    start = (page - 1) * page_size
    if start > filtered:
        # RabbitMQ's bound (its lists:sublist/3 refuses a start past the end + 1):
        # the page right after a full last page is an empty page, not an error
        raise PageOutOfRange(f"Page out of range, page: {page} page size: {page_size}, len: {filtered}")
    chunk = items[start : start + page_size]
    return {
        "filtered_count": filtered,
        "item_count": len(chunk),
        "items": chunk,
        "page": page,
        "page_count": -(-filtered // page_size),  # 0 for no items, as RabbitMQ
        "page_size": page_size,
        "total_count": total,
    }


def shown(item: dict[str, Any], query: QueryParams) -> dict[str, Any]:
    """A single object's answer under ``query``: its ``columns`` only, as RabbitMQ
    answers ``GET /api/queues/%2F/{name}?columns=...`` (every other list parameter
    means nothing for one object and is ignored, as RabbitMQ does)."""
    return _columns([item], query)[0]


def _path(item: dict[str, Any], dotted: str) -> Any:
    value: Any = item
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _sort_key(value: Any) -> tuple[int, Any]:
    """Numbers before text before anything else, each in its own order."""
    if isinstance(value, bool) or value is None:
        return (2, str(value))
    if isinstance(value, (int, float)):
        return (0, value)
    return (1, str(value))


def _columns(items: list[dict[str, Any]], query: QueryParams) -> list[dict[str, Any]]:
    wanted = [c.strip() for c in query.get_str("columns", "").split(",") if c.strip()]
    if not wanted:
        return items
    out = []
    for item in items:
        kept: dict[str, Any] = {}
        for column in wanted:
            parts = column.split(".")
            if not _has(item, parts):
                continue  # a field the item does not have (or inside one that is not an object)
            target = kept
            for part in parts[:-1]:
                inner = target.get(part)
                # a copy: the item's own objects (a queue's arguments, which are the
                # core's) are never written into
                inner = dict(inner) if isinstance(inner, dict) else {}
                target[part] = inner
                target = inner
            target[parts[-1]] = _path(item, column)
        out.append(kept)
    return out


def _has(item: dict[str, Any], parts: list[str]) -> bool:
    """Whether the dotted path ``parts`` names a field of ``item``."""
    value: Any = item
    for part in parts:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True
