"""A nursery for a library's background tasks that does not wrap the caller's errors.

With strict exception groups (trio's and anyio's), an exception from the body of ``async with
open_nursery()`` comes out wrapped in an ``ExceptionGroup``. The client's context
managers (``conn.channel()``) run the caller's block inside such a nursery; their
background tasks never raise (they record failures on the channel instead), so any
group that escapes holds the caller's own exception, which is re-raised bare: a
``KeyError`` in the caller's block comes out as a ``KeyError``. Groups of several
exceptions (a bug in a background task alongside it) are left as they are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc

__all__ = ["open_service_nursery"]


@asynccontextmanager
async def open_service_nursery() -> AsyncIterator[anyio.abc.TaskGroup]:
    single: BaseException | None = None
    try:
        async with anyio.create_task_group() as nursery:
            yield nursery
    except BaseExceptionGroup as group:
        if len(group.exceptions) != 1:
            raise
        single = group.exceptions[0]
    if single is not None:
        # Raised outside the except block so its own __context__/__cause__ stay intact.
        raise single
