"""kick(): ask for a run of a job once the current transaction commits.

A kick rides in the caller's transaction: one ``KickRequest`` row inserted there (on PostgreSQL in the same
statement as a ``NOTIFY`` on :data:`CHANNEL`, which the commit delivers and a rollback drops). So an enqueue
costs its caller one commit, not two, and a rollback kicks nothing.

Why a row of its own, and not the job's pending flag set in the transaction: the flag is one row per job,
which every request kicking that job would update, and each would hold its lock until its commit, so
concurrent requests would wait for each other. Kick rows are only ever inserted by requests (no two touch
the same row) and deleted by workers. Why a row at all, and not the NOTIFY alone: a NOTIFY that no worker
hears (none listening at that moment, or one killed before it started the run) is gone, and a kick-only job
has no schedule to recover it; the row stays until a worker takes it (on its next poll, or its start), and a
worker that took it left the job's durable pending flag. The other way, workers looking for due rows in the
queue tables that kick-only jobs claim, would miss a kick-only job whose work is not a queue table's row
(and one that has never run, whose tables nobody knows yet).

Outside a transaction (autocommit) the kick is one statement, its own commit, at once.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, connections, router, transaction

from . import _channel
from ._running import framework_write

logger = logging.getLogger(__name__)

#: The LISTEN/NOTIFY channel; versioned so workers of another release never misread a payload.
CHANNEL = _channel.CHANNEL

#: Lists the test kit appends kicked job names to (fabrika_django.testing's ``fabrika_kicks``).
_recorders: list[list[str]] = []


def kick(name: str, *, using: str | None = None) -> None:
    """Ask for a run of ``name`` once the current transaction commits (at once outside one).

    Inside a transaction the kick is a row written in it: a rollback kicks nothing, and a kick that cannot be
    written fails the transaction like any other write of it. Outside one, a failing kick is logged and never
    breaks the caller, whose own writes have committed already. Raises UnknownJob at once for a name no job has.
    """
    from .jobs import registry

    job = registry.get(name)
    alias = _kick_alias(using)
    if _kicked_in_transaction(job.name, alias):
        _note_kick(job.name, alias)  # this transaction's kick row is in already: nothing more to write
        return
    if connections[alias].in_atomic_block:
        with framework_write():
            _add(job.name, alias)
    else:
        try:
            with framework_write():
                _add(job.name, alias)
        except DatabaseError as exc:
            # The caller's writes committed; a scheduled job's schedule recovers. The class only, never the message.
            logger.warning("Kick not delivered job=%s error=%s", job.name, type(exc).__name__)
            return
    _note_kick(job.name, alias)


def _kick_alias(using: str | None) -> str:
    """The database a kick is written to: ``using``, else where the router writes kick rows."""
    from .models import KickRequest  # not at import: the package root imports this module before models load

    return using or router.db_for_write(KickRequest)


def _kicked_in_transaction(name: str, alias: str) -> bool:
    """Whether the open transaction of ``alias`` holds a kick of ``name`` already (one row is enough).

    Each kick leaves a marker among the transaction's on-commit callbacks, which Django drops with a
    savepoint rolled back: a marker found means a kick row that commits with this transaction.

    Read through ``connection.run_on_commit``, which Django does not document: neither 5.2 nor 6.1 offers a
    documented way to see a transaction's callbacks (or to hear of a savepoint's rollback), and a record of our
    own could not tell which savepoint dropped its kick row. Each entry holds the callback second on 5.2 and 6.1;
    tests/test_tasks.py, which CI runs on Django 6 too, fails if that changes.
    """
    connection = connections[alias]
    if not connection.in_atomic_block:
        return False
    # Each entry is (savepoint ids, callback, robust) (django-stubs knows an older two-item form).
    callbacks: list[Any] = list(connection.run_on_commit)
    return any(isinstance(entry[1], _Kicked) and entry[1].name == name for entry in callbacks)


def _note_kick(name: str, alias: str) -> None:
    """Note a kick written in the current transaction of ``alias`` (``add_kick``, or an insert that holds one)."""
    if connections[alias].in_atomic_block:
        transaction.on_commit(_Kicked(name), using=alias)
    else:
        _Kicked(name)()


class _Kicked:
    """On commit: the kick of ``name`` went out (the test kit's recorders hear of it). Also the marker that
    ``_kicked_in_transaction`` looks for."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> None:
        for recorder in _recorders:
            recorder.append(self.name)


def _add(name: str, alias: str) -> None:
    # Imported here: this module is imported with the package (``kick``), before the app registry is ready.
    from ._runs import pending as run_pending

    run_pending.add_kick(name, using=alias)


def request_run(name: str, *, using: str | None = None) -> None:
    """Mark the job pending at once (the worker's own requests): a worker, or the active run when it ends,
    runs it once more."""
    from ._runs import pending as run_pending

    marked = run_pending.mark_pending(name, using=using)
    logger.debug("Kick job=%s marked=%d", name, marked)
