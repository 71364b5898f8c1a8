"""The write-ahead log's own IO thread: one long-lived thread that runs the writer's
blocking calls (write, fsync, probe) one at a time, in the order they were handed over.

One job: carry a blocking call from the event loop to a thread and its result back,
more cheaply than ``trio.to_thread.run_sync``. Under load the writer hands over a batch
per fsync; trio's call takes a thread from its cache, copies the context, goes through
the limiter's scheduling round and its own bookkeeping each time. Here the thread is
already waiting on a ``queue.SimpleQueue``; it runs the call and reports with one
``TrioToken.run_sync_soon`` that reschedules the waiting task.

* **Lifecycle.** :meth:`IOThread.start` (the writer task, ``GroupCommitter.serve``)
  starts the thread; :meth:`IOThread.stop` (the writer's end, ``aclose``) hands it a
  stop marker and joins it. The owner calls ``stop`` only while no call is in flight
  (it holds its IO lock), so the join returns at once. While the thread is not running
  (before ``serve``, after ``aclose``, or between), :meth:`IOThread.run` falls back to
  ``trio.to_thread.run_sync`` with the same limiter: same semantics, trio's threads.
* **Cancellation.** :meth:`IOThread.run` can be cancelled only before it hands the
  call over (while it waits for the ``limiter``, the WAL's one IO slot): the caller
  then knows nothing was done. Once handed over the call is never abandoned: the task
  waits for it whatever is cancelled, as ``trio.to_thread.run_sync`` does by default.
* **Errors.** Whatever the call raises is raised again in the waiting task.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import trio

__all__ = ["IOThread"]

T = TypeVar("T")

#: The thread's name (shows in py-spy and in ``threading.enumerate()``).
THREAD_NAME = "ackbus-wal-io"


class _Call(Generic[T]):
    """One call handed to the thread: what to run, and where its result goes."""

    __slots__ = ("error", "fn", "result", "task", "token")

    def __init__(self, fn: Callable[[], T], task: trio.lowlevel.Task, token: trio.lowlevel.TrioToken) -> None:
        self.fn = fn
        self.task = task
        self.token = token
        self.result: T | None = None
        self.error: BaseException | None = None

    def run_in_thread(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed back to the waiting task
            self.error = exc
        try:
            self.token.run_sync_soon(self.wake)
        except trio.RunFinishedError:  # pragma: no cover - the run ended under a waiting task
            pass

    def wake(self) -> None:
        trio.lowlevel.reschedule(self.task)


class IOThread:
    """A single long-lived worker thread for blocking IO, owned by one writer."""

    def __init__(self, limiter: trio.CapacityLimiter) -> None:
        #: The IO slot: taken for every call, so that a call waits (cancellably) for
        #: any other holder before it is handed over.
        self.limiter = limiter
        self._calls: queue.SimpleQueue[_Call[Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the thread (no-op if it runs)."""
        if self._thread is None:
            thread = threading.Thread(target=self._serve, args=(self._calls,), name=THREAD_NAME, daemon=True)
            thread.start()
            self._thread = thread

    def stop(self) -> None:
        """Stop the thread and join it (no-op if it is not running). Call only while
        no call is in flight, so the join does not block the event loop."""
        thread = self._thread
        if thread is None:
            return
        self._thread = None
        self._calls.put(None)
        thread.join()
        # A fresh queue for a later start(): the old thread took its stop marker.
        self._calls = queue.SimpleQueue()

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` in the thread and return (or raise) what it did.

        Cancellable only until the call is handed over (see the module's docstring)."""
        limiter = self.limiter
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            limiter.acquire_nowait()
        except trio.WouldBlock:
            await limiter.acquire()
        try:
            if self._thread is None:
                return await trio.to_thread.run_sync(fn)
            call: _Call[T] = _Call(fn, trio.lowlevel.current_task(), trio.lowlevel.current_trio_token())
            self._calls.put(call)
            await trio.lowlevel.wait_task_rescheduled(_never_abort)
            if call.error is not None:
                try:
                    raise call.error
                finally:
                    call.error = None  # no reference cycle through the traceback
            return cast(T, call.result)
        finally:
            limiter.release()

    @staticmethod
    def _serve(calls: queue.SimpleQueue[_Call[Any] | None]) -> None:
        while True:
            call = calls.get()
            if call is None:
                return
            call.run_in_thread()


def _never_abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
    """A call handed over is never abandoned: cancellation waits for it."""
    return trio.lowlevel.Abort.FAILED
