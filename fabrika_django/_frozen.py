"""A holder frozen inside ``ctx.transaction()`` blocks its job at most about ``LEASE_SECONDS`` (DESIGN §15).

The fence locks the lease row (``FOR KEY SHARE``) for the whole of a fenced transaction, so a takeover, which
changes the row's unique token, waits for that transaction to end: a stale attempt can never commit after its
replacement started. A stopped process (SIGSTOP, a long GC pause, a VM migration) never ends it, and the
takeover would wait for as long as the process stays frozen.

So on PostgreSQL each fenced transaction also takes a shared advisory lock named after its job, in the same
statement as the row lock: it names the sessions that hold the job's fence, which a row lock does not (row
locks show in ``pg_locks`` only while someone waits for them). A takeover of an *expired* lease ends those
sessions (``pg_terminate_backend``) before it takes the row: their transactions roll back, which is what the
fence would have done at their commit anyway, since an attempt whose lease expired may not commit. A live
holder keeps renewing, so its lease never expires and its transactions are never touched.

The advisory key is (``FENCE_LOCK_CLASS``, ``hashtext(job)``); two job names with the same 32-bit hash would
only make a takeover of one end the other's fenced transaction while the first's lease is expired: a retry.
"""

from __future__ import annotations

import logging

from django.db import connection as default_connection

logger = logging.getLogger(__name__)

#: The advisory lock's first key: "fabr" in ASCII, so it stays apart from an application's own keys.
FENCE_LOCK_CLASS = 0x66616272


def fence_mark_sql(job_column: str) -> str:
    """The select-list expression a fenced transaction's lock statement adds (PostgreSQL)."""
    return f"pg_advisory_xact_lock_shared({FENCE_LOCK_CLASS}, hashtext({job_column}))"


def end_frozen_fences(name: str) -> int:
    """End the sessions holding fenced transactions under ``name``'s lease if it expired; return how many.

    Runs in the takeover's transaction (under the Job row's lock), just before it takes the lease row.
    """
    from .models import Lease

    connection = default_connection
    if connection.vendor != "postgresql":
        return 0
    lease = connection.ops.quote_name(Lease._meta.db_table)
    sql = (
        "SELECT count(pg_terminate_backend(locks.pid)) FROM pg_locks AS locks "  # noqa: S608  quoted name
        f"WHERE locks.locktype = 'advisory' AND locks.classid = {FENCE_LOCK_CLASS} "
        "AND locks.objid = hashtext(%s)::oid AND locks.objsubid = 2 AND locks.granted "
        "AND locks.pid <> pg_backend_pid() "
        f"AND EXISTS (SELECT 1 FROM {lease} WHERE job = %s AND token IS NOT NULL AND expires < now())"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [name, name])
        row = cursor.fetchone()
    ended = int(row[0]) if row else 0
    if ended:
        logger.warning("Ended the fenced transactions of a frozen holder job=%s sessions=%d", name, ended)
    return ended
