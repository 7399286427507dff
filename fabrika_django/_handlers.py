"""Threads that run job handlers, kept between attempts so each keeps its database connection.

Opening a PostgreSQL connection costs milliseconds, more than the rest of a kicked run's start; a
thread that ran one attempt waits for the next with its connection open. A thread whose attempt was
abandoned (it ignored its abort) is never reused: it closes its connections and ends when its handler
finally returns.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from django.db import connection, connections

logger = logging.getLogger("fabrika_django.worker")

# Idle threads kept at most; more only while more attempts run at once.
_KEEP_IDLE = 8


class Task:
    """One handler call handed to a thread."""

    def __init__(self, call: Callable[[], None]) -> None:
        self.call = call
        self.done = threading.Event()
        #: Set by the runner when it gave up on the call: the thread must not be reused.
        self.abandoned = False


class _HandlerThread(threading.Thread):
    def __init__(self, pool: HandlerThreads) -> None:
        super().__init__(name="fabrika-handler", daemon=True)
        self.pool = pool
        self.inbox: queue.SimpleQueue[Task | None] = queue.SimpleQueue()

    def run(self) -> None:
        try:
            while True:
                task = self.inbox.get()
                if task is None:
                    return
                _drop_broken_connections()
                try:
                    task.call()
                finally:
                    task.done.set()
                if task.abandoned or not self.pool.take_back(self):
                    return
        finally:
            connections.close_all()


def close_quietly() -> None:
    """Close this thread's default connection; one that broke cannot fail the caller (it is gone either way)."""
    try:
        connection.close()
    except Exception:
        logger.debug("Closing a broken connection failed")


def _drop_broken_connections() -> None:
    """Close a connection that failed during an earlier attempt and no longer answers."""
    for conn in connections.all(initialized_only=True):
        if conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()


class HandlerThreads:
    """A small pool of handler threads."""

    def __init__(self) -> None:
        self._idle: list[_HandlerThread] = []
        self._lock = threading.Lock()

    def submit(self, call: Callable[[], None]) -> Task:
        """Run ``call`` in an idle thread, or a new one; return its task."""
        task = Task(call)
        with self._lock:
            thread = self._idle.pop() if self._idle else None
        if thread is None:
            thread = _HandlerThread(self)
            thread.start()
        thread.inbox.put(task)
        return task

    def take_back(self, thread: _HandlerThread) -> bool:
        with self._lock:
            if len(self._idle) >= _KEEP_IDLE:
                return False
            self._idle.append(thread)
            return True

    def drain(self) -> None:
        """End every idle thread and close its connections (tests call this before dropping the database)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for thread in idle:
            thread.inbox.put(None)
        for thread in idle:
            thread.join(5)


handler_threads = HandlerThreads()
