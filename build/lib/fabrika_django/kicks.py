"""kick(): ask for a run of a job once the current transaction commits.

A kick is one statement after the commit, in autocommit: it sets the job's ``pending_since`` if it is not
set yet. On PostgreSQL the same statement sends a NOTIFY on :data:`CHANNEL` (only when it set the flag), so
a listening worker starts the run at once; elsewhere workers poll the flag. Nothing is written inside the
request's own transaction, so kicks of a busy job never queue behind each other's row locks there.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from django.db import connections, router, transaction

from . import _prepared
from ._running import framework_write

logger = logging.getLogger(__name__)

#: The LISTEN/NOTIFY channel; versioned so workers of another release never misread a payload.
CHANNEL = "fabrika_kick_v1"

#: Lists the test kit appends kicked job names to (fabrika_django.testing's ``fabrika_kicks``).
_recorders: list[list[str]] = []


def kick(name: str, *, using: str | None = None) -> None:
    """Ask for a run of ``name`` once the current transaction commits (at once outside one).

    A rolled-back transaction kicks nothing; a failing kick never breaks the request that committed.
    Raises UnknownJob at once for a name no job has.
    """
    from .jobs import registry

    job = registry.get(name)
    transaction.on_commit(partial(_deliver, job.name, using), using=using, robust=True)


def _deliver(name: str, using: str | None) -> None:
    for recorder in _recorders:
        recorder.append(name)
    try:
        with framework_write():
            request_run(name, using=using)
    except Exception as exc:
        # The request committed; the schedule recovers a lost kick. Log the class only, never the message.
        logger.warning("Kick not delivered job=%s error=%s", name, type(exc).__name__)


def request_run(name: str, *, using: str | None = None) -> None:
    """Mark the job pending: a worker (or the active run, when it ends) runs it once more.

    One statement in the common case. The job's row is created only when it is missing (a job no worker
    or run has seen yet).
    """
    from .models import Job

    alias = using or router.db_for_write(Job)
    connection = connections[alias]
    table = connection.ops.quote_name(Job._meta.db_table)
    if connection.vendor == "postgresql":
        # One row always (an aggregate): (0, ...) when the flag was up already.
        marked, exists = _prepared.fetchone(connection, _kick_sql(connection), [name, CHANNEL, name]) or (0, True)
    else:
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET pending_since = %s WHERE name = %s AND pending_since IS NULL",  # noqa: S608
                [connection.ops.adapt_datetimefield_value(_now()), name],
            )
            marked = cursor.rowcount
        # Zero rows: already pending (the common case under load), or no row yet (the rare miss).
        exists = marked or Job.objects.using(alias).filter(name=name, pending_since__isnull=False).exists()
    if not marked and not exists:
        _create_pending(name, alias)
    logger.debug("Kick job=%s marked=%d", name, bool(marked))


def _kick_sql(connection: Any) -> str:
    """PostgreSQL's kick (bench/kick_latency.py runs it alone, as the database's floor).

    The CTE's UPDATE and the NOTIFY go in one round trip; the EXISTS reads the row as it was before the
    UPDATE, which tells "already pending" (nothing to do) from "no row yet". Parameters: name, channel, name.
    """
    from .models import Job

    table = connection.ops.quote_name(Job._meta.db_table)
    return (
        f"WITH k AS (UPDATE {table} SET pending_since = now() "  # noqa: S608  quoted name
        "WHERE name = %s AND pending_since IS NULL RETURNING name) "
        f"SELECT count(pg_notify(%s, k.name)), EXISTS (SELECT 1 FROM {table} WHERE name = %s) FROM k"
    )


def _create_pending(name: str, alias: str) -> None:
    """The rare miss: make the job's row (unless another session just did) and mark it pending."""
    from django.db.models.functions import Now

    from .models import Job

    manager = Job.objects.using(alias)
    manager.bulk_create([Job(name=name)], ignore_conflicts=True)
    # Whoever made the row, it may not be pending yet: a worker's sync makes rows without the flag.
    if manager.filter(name=name, pending_since__isnull=True).update(pending_since=Now()):
        notify(name, using=alias)


def notify(name: str, *, using: str | None = None) -> None:
    """Wake the workers listening on PostgreSQL for ``name`` (nothing elsewhere: they poll)."""
    connection = connections[using or "default"]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, name])


def _now():
    from django.utils import timezone

    return timezone.now()
