"""The worker's ways of hearing about kicks: a PostgreSQL LISTEN thread, or nothing (the worker polls).

The listener owns a connection of its own to ``LISTEN_DATABASE`` from ``connections.create_connection()``:
LISTEN needs a session that stays, which a transaction pooler (PgBouncer) does not give, and Django's
per-thread connections may be closed or reused under it.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
from collections.abc import Callable
from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.connection import ConnectionDoesNotExist

from . import _db_failure
from ._channel import CHANNEL
from ._sql import listen as listen_sql
from .backoff import doubling
from .conf import settings

logger = logging.getLogger("fabrika_django.worker")

# Seconds of silence after which a round trip checks the connection: one that died without a word (a dropped
# network) shows up only then. The stop does not wait for it: it wakes the thread at once.
_WAIT_SECONDS = 10.0


class Backoff:
    """A growing pause after failures: ``first`` doubled per failure, at most ``cap``; reset on success."""

    def __init__(self, first: float = 0.1, cap: float = 10.0) -> None:
        self.first, self.cap = first, cap
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return doubling(timedelta(seconds=self.first), self.failures, timedelta(seconds=self.cap)).total_seconds()

    def reset(self) -> None:
        self.failures = 0


def listen_alias(alias: str | None) -> str | None:
    """Return the alias to LISTEN on, or None when the worker has to poll (not PostgreSQL, or turned off)."""
    if not alias:
        return None
    try:
        vendor = connections[alias].vendor
    except ConnectionDoesNotExist:
        raise ImproperlyConfigured(
            f"FABRIKA['LISTEN_DATABASE'] is {alias!r}, which is not in DATABASES: name a database alias that "
            "connects directly (not through a transaction pooler), or None to poll."
        ) from None
    return alias if vendor == "postgresql" else None


class Listener(threading.Thread):
    """LISTENs on the kick channel and hands each job name to ``on_kick``.

    It waits on the connection's socket and on a socket pair of its own, where ``wake()`` writes a byte: a
    stopping worker's listener ends at once, not at the end of its wait. After every (re)connection it calls
    ``on_connect``: kicks sent while it was away are not lost, since the worker then reads every pending flag
    again. A lost connection calls ``on_lost`` and is retried with a growing pause.
    """

    def __init__(
        self,
        alias: str,
        stop: threading.Event,
        *,
        on_kick: Callable[[str], None],
        on_connect: Callable[[], None],
        on_lost: Callable[[], None],
    ) -> None:
        super().__init__(name="fabrika-listen", daemon=True)
        self.alias = alias
        self.stop = stop
        self.on_kick, self.on_connect, self.on_lost = on_kick, on_connect, on_lost
        self.backoff = Backoff()
        self._woken, self._waker = socket.socketpair()
        self._woken.setblocking(False)
        self._waker.setblocking(False)

    @classmethod
    def if_configured(
        cls,
        stop: threading.Event,
        *,
        on_kick: Callable[[str], None],
        on_connect: Callable[[], None],
        on_lost: Callable[[], None],
    ) -> Listener | None:
        """The listener on ``FABRIKA["LISTEN_DATABASE"]``, or None when the worker polls (not PostgreSQL, or off)."""
        alias = listen_alias(settings.LISTEN_DATABASE)
        if alias is None:
            return None
        return cls(alias, stop, on_kick=on_kick, on_connect=on_connect, on_lost=on_lost)

    def wake(self) -> None:
        """End the thread's wait now, to look at the stop flag (from any thread; a signal handler too)."""
        try:
            self._waker.send(b"\0")
        except OSError:
            pass  # a full buffer: a wake is pending already; a closed pair: the thread has ended

    def run(self) -> None:
        try:
            self._serve()
        finally:
            self._woken.close()
            self._waker.close()

    def _serve(self) -> None:
        while not self.stop.is_set():
            wrapper = connections.create_connection(self.alias)
            try:
                self._listen(wrapper)
            except Exception as exc:
                pause = self.backoff.next()
                server = _db_failure.server_of(connections[self.alias].settings_dict)
                logger.warning(
                    "Listen connection lost alias=%s server=%s kind=%s error=%s retry_in=%.1fs",
                    self.alias, server, _db_failure.kind_of(exc), type(exc).__name__, pause,
                )  # fmt: skip
                self.on_lost()
                self.stop.wait(pause)
            finally:
                try:
                    wrapper.close()
                except Exception:
                    logger.debug("Closing a broken listen connection failed alias=%s", self.alias)

    def _listen(self, wrapper) -> None:
        wrapper.ensure_connection()
        raw = wrapper.connection
        raw.autocommit = True
        raw.execute(listen_sql.listen())
        if self.backoff.failures:
            logger.info("Listen connection back alias=%s", self.alias)
        self.backoff.reset()
        logger.debug("Listening channel=%s alias=%s", CHANNEL, self.alias)
        self.on_connect()
        with selectors.DefaultSelector() as selector:
            selector.register(raw.fileno(), selectors.EVENT_READ)
            selector.register(self._woken, selectors.EVENT_READ)
            self._hand_over(raw)  # notes that came with the LISTEN's answer: read already, so no socket wakes
            while not self.stop.is_set():
                if not selector.select(timeout=_WAIT_SECONDS):
                    raw.execute(listen_sql.PING)  # silence: is the connection still there? (notes heard meanwhile wait)
                self._drain_wakes()
                self._hand_over(raw)

    def _hand_over(self, raw) -> None:
        """Hand each note received (read now, without waiting) to ``on_kick``, until the worker stops."""
        for note in raw.notifies(timeout=0):
            if self.stop.is_set():
                return
            self.on_kick(note.payload)

    def _drain_wakes(self) -> None:
        try:
            while self._woken.recv(64):
                pass
        except BlockingIOError:
            pass
