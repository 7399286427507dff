"""The statements of the lease fence (``_runs.fence``): the lock a fenced transaction holds, the token check, the
exclusive lock a token change takes first, the end of a frozen holder's sessions, and the renewal that must not
wait for the fence (MariaDB/MySQL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import table

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

#: The fence's advisory lock's first key: "fabr" in ASCII, apart from an application's own keys.
FENCE_LOCK_CLASS = 0x66616272


def _fence_mark(id_column: str) -> str:
    """The select-list expression the fence's lock statement adds on PostgreSQL (see above)."""
    return f"pg_advisory_xact_lock_shared({FENCE_LOCK_CLASS}, {id_column})"


def fence_lock() -> str:
    """The fence's shared lock (PostgreSQL), the first statement of a fenced transaction. Parameter: the Lease id."""
    return f"SELECT {_fence_mark('%s')}"


def hold_lease(connection: BaseDatabaseWrapper) -> str:
    """The fence's lock of the lease row (``_runs.fence.LeaseFence.hold``). Parameters: the Lease row's id, token."""
    leases = table(connection, "Lease")
    if connection.vendor == "sqlite":
        return f"UPDATE {leases} SET token = token WHERE id = %s AND token = %s"  # noqa: S608  quoted name
    if connection.vendor == "mysql":
        # InnoDB's FOR KEY SHARE: a shared lock read through the unique token index alone (the index covers the
        # query, the id being its primary key, so the table's row is not locked). A takeover or release changes
        # the token and must lock that index entry, so it waits; a renewal changes only expires and never touches
        # the index, so it does not. The id is compared in the answer, not the WHERE, which would let the
        # optimizer pick the primary key and lock the row. A locking read is a current read at any isolation.
        return f"SELECT id = %s FROM {leases} WHERE token = %s LOCK IN SHARE MODE"  # noqa: S608  quoted name
    if connection.vendor == "postgresql":
        # The token check alone, run after fence_lock (see _runs.fence.LeaseFence._begin_with): it answers the
        # transaction's isolation level, at which the check holds only under READ COMMITTED.
        return f"SELECT current_setting('transaction_isolation') FROM {leases} WHERE id = %s AND token = %s"  # noqa: S608
    return f"SELECT 1 FROM {leases} WHERE id = %s AND token = %s FOR UPDATE"  # noqa: S608  quoted name


def hold_lease_locked(connection: BaseDatabaseWrapper) -> str:
    """PostgreSQL, above READ COMMITTED: the token check that also locks the row (see ``_runs.fence``). Id, token."""
    leases = table(connection, "Lease")
    return f"SELECT 1 FROM {leases} WHERE id = %s AND token = %s FOR KEY SHARE"  # noqa: S608  quoted name


def lock_fences(inner: str) -> str:
    """PostgreSQL: take the fence's lock exclusively on each lease ``inner`` selects (a query of their ids, in
    order); answers each id. Parameters: ``inner``'s."""
    return f"SELECT held.id, pg_advisory_xact_lock({FENCE_LOCK_CLASS}, held.id) FROM ({inner}) AS held"  # noqa: S608


def end_frozen_fences(connection: BaseDatabaseWrapper) -> str:
    """PostgreSQL: end the other sessions holding the fence's lock of a lease whose token expired; answers how
    many. Parameters: the Lease row's id, twice."""
    return (
        "SELECT count(pg_terminate_backend(locks.pid)) FROM pg_locks AS locks "  # noqa: S608  quoted name
        f"WHERE locks.locktype = 'advisory' AND locks.classid = {FENCE_LOCK_CLASS} "
        "AND locks.objid = %s::oid AND locks.objsubid = 2 AND locks.granted "
        "AND locks.pid <> pg_backend_pid() "
        # pg_locks is the whole server's: lease ids repeat in every database that has fabrika's tables.
        "AND locks.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        f"AND EXISTS (SELECT 1 FROM {table(connection, 'Lease')} WHERE id = %s AND token IS NOT NULL "
        "AND expires < now())"
    )


def renew_by_primary_key(connection: BaseDatabaseWrapper) -> str:
    """MariaDB/MySQL: the renewal through the primary key only, which the optimizer is told (``_runs.lease``).

    Parameters: the microseconds granted, the Lease row's id, its token.
    """
    return (
        f"UPDATE {table(connection, 'Lease')} FORCE INDEX (PRIMARY) "  # noqa: S608  quoted name
        "SET expires = CURRENT_TIMESTAMP(6) + INTERVAL %s MICROSECOND WHERE id = %s AND token = %s"
    )


#: PostgreSQL: end a stale attempt's session (a handler that ignored its abort), which rolls back what it held.
#: Parameter: the session's backend pid.
TERMINATE_BACKEND = "SELECT pg_terminate_backend(%s)"
#: MariaDB/MySQL: the same, by the connection's thread id.
KILL_CONNECTION = "KILL CONNECTION %s"
