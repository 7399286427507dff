"""The worker's ways of hearing about kicks: a PostgreSQL LISTEN thread, or nothing (the worker polls).

The listener owns a connection of its own to ``LISTEN_DATABASE`` from ``connections.create_connection()``:
LISTEN needs a session that stays, which a transaction pooler (PgBouncer) does not give, and Django's
per-thread connections may be closed or reused under it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta

from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils.connection import ConnectionDoesNotExist

from . import _db_failure
from ._channel import CHANNEL
from .backoff import doubling

logger = logging.getLogger("fabrika_django.worker")

# Seconds between checks of the stop flag (and of the connection, by a round trip now and then).
_WAIT_SECONDS = 0.5
_PING_EVERY = 20


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

    After every (re)connection it calls ``on_connect``: kicks sent while it was away are not lost, since the
    worker then reads every pending flag again. A lost connection calls ``on_lost`` and is retried with a
    growing pause.
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

    def run(self) -> None:
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
        raw.execute(f"LISTEN {CHANNEL}")
        if self.backoff.failures:
            logger.info("Listen connection back alias=%s", self.alias)
        self.backoff.reset()
        logger.debug("Listening channel=%s alias=%s", CHANNEL, self.alias)
        self.on_connect()
        idle = 0
        while not self.stop.is_set():
            heard = False
            for note in raw.notifies(timeout=_WAIT_SECONDS):
                heard = True
                self.on_kick(note.payload)
                if self.stop.is_set():
                    return
            idle = 0 if heard else idle + 1
            if idle >= _PING_EVERY:
                # A connection that died without a word (a dropped network) shows up only on a round trip.
                raw.execute("SELECT 1")
                idle = 0
