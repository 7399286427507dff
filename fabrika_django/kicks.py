"""kick(): ask for a run of a job once the current transaction commits.

A kick rides in the caller's transaction: one ``KickRequest`` row inserted there (on PostgreSQL in the same
statement as a ``NOTIFY`` on ``_channel.CHANNEL``, which the commit delivers and a rollback drops). So an enqueue
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

from django.db import DatabaseError, connections, router

from ._running import framework_write
from ._runs.kickmarks import kicked_in_transaction, note_kick

logger = logging.getLogger(__name__)


def kick(name: str, *, using: str | None = None) -> None:
    """Ask for a run of ``name`` once the current transaction commits (at once outside one).

    Inside a transaction the kick is a row written in it: a rollback kicks nothing, and a kick that cannot be
    written fails the transaction like any other write of it. Outside one, a failing kick is logged and never
    breaks the caller, whose own writes have committed already. Raises UnknownJob at once for a name no job has.
    """
    from .jobs import registry

    job = registry.get(name)
    alias = _kick_alias(using)
    if kicked_in_transaction(job.name, alias):
        note_kick(job.name, alias)  # this transaction's kick row is in already: nothing more to write
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
    note_kick(job.name, alias)


def _kick_alias(using: str | None) -> str:
    """The database a kick is written to: ``using``, else where the router writes kick rows."""
    from .models._tables import KickRequest  # not at import: the package root imports this module before models load

    return using or router.db_for_write(KickRequest)


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
