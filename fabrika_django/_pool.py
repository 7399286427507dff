"""The attempt's own thread pool behind ``ctx.executor()``: threads that carry the run.

The active run, which the write guard and ``ctx.transaction()`` read, is per thread: a thread a handler starts
itself is outside the run, its writes neither guarded nor fenced. Each thread of this pool enters the run and
the write guard before its first task, so ``ctx.transaction()`` works there (fenced by the same lease, on the
thread's own connection) and a write outside it is refused. Its connections are registered with the context,
so the runner can cut them off along with the handler's if the attempt is abandoned, and closed when the
thread ends.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any

from django.db import connections

from ._claimers import remembering_claims
from ._running import ActiveRun, running
from .guards import write_guard

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

_Task = tuple[Future, Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class RunExecutor(Executor):
    """A ``concurrent.futures.Executor`` whose threads run inside the attempt (write guard, fenced transactions)."""

    def __init__(self, new_run: Callable[[], ActiveRun], opened: list[BaseDatabaseWrapper], max_workers: int) -> None:
        """``new_run()`` makes each thread's active run; each thread's connections go into ``opened``, the
        attempt's list, so the runner can cut them off with the handler's."""
        if not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers < 1:
            raise ValueError(f"ctx.executor(max_workers={max_workers!r}): give a whole number of threads, at least 1.")
        self._new_run = new_run
        self._opened = opened
        self._max_workers = max_workers
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut_down = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        """Schedule ``fn(*args, **kwargs)`` on a thread of the attempt; return its future."""
        with self._lock:
            if self._shut_down:
                raise RuntimeError("ctx.executor() was shut down: submit inside its `with` block.")
            future: Future = Future()
            self._tasks.put((future, fn, args, kwargs))
            if len(self._threads) < self._max_workers:
                thread = threading.Thread(target=self._work, name="fabrika-executor", daemon=True)
                self._threads.append(thread)
                thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; let the threads finish what was submitted (or cancel it) and end."""
        with self._lock:
            self._shut_down = True
            threads = list(self._threads)
        if cancel_futures:
            self._cancel_waiting()
        for _ in threads:
            self._tasks.put(None)
        if wait:
            for thread in threads:
                thread.join()

    def _cancel_waiting(self) -> None:
        while True:
            try:
                task = self._tasks.get_nowait()
            except queue.Empty:
                return
            if task is not None:
                task[0].cancel()

    def _work(self) -> None:
        self._opened.extend(connections[alias] for alias in connections)
        try:
            run = self._new_run()
            with remembering_claims(run), running(run), write_guard():
                while (task := self._tasks.get()) is not None:
                    future, fn, args, kwargs = task
                    if not future.set_running_or_notify_cancel():
                        continue
                    try:
                        future.set_result(fn(*args, **kwargs))
                    except BaseException as exc:  # noqa: B036  the future carries it to the handler
                        future.set_exception(exc)
        finally:
            connections.close_all()
