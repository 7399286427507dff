"""The lease fence of ctx.transaction(): a stale attempt can never commit after its replacement started."""

from __future__ import annotations

import time
import uuid
from typing import Any

from django.db import connections, router

from .context import AbortSignal
from .exceptions import LeaseLost


class LeaseFence:
    """Checks, at a transaction's begin and before its commit, that the lease is still the attempt's.

    At begin it locks the lease row against takeover inside the transaction: PostgreSQL ``FOR KEY SHARE``
    (a takeover changes the unique ``token`` and so needs ``FOR UPDATE``, which waits; a renewal changes
    only ``expires`` and does not), MariaDB/MySQL a shared lock on the token's unique index entry (the same
    split), SQLite the database write lock, other backends ``FOR UPDATE``. Before
    commit it checks locally, without a round trip: the signal (deadline, lost lease, shutdown) and the
    time the last renewal is known to cover.
    """

    def __init__(self, job_name: str, token: uuid.UUID, signal: AbortSignal, valid_until: float, lease_id: int) -> None:
        self.job_name = job_name
        self.token = token
        #: The Lease row (one per job and lane) the attempt holds.
        self.lease_id = lease_id
        self.signal = signal
        #: time.monotonic() up to which the lease is known to be ours (measured before the renewal was sent).
        self.valid_until = valid_until
        #: PostgreSQL: the "BEGIN; lock" query of each raw connection (by id, with the connection to check it
        #: is the same one), built at its first transaction: the same bytes for every transaction of the attempt.
        self._begin_queries: dict[int, tuple[Any, bytes]] = {}

    def check(self) -> None:
        """Raise if the attempt ended or its lease may have expired."""
        self.signal.throw_if_aborted()
        if time.monotonic() >= self.valid_until:
            raise LeaseLost(
                "The attempt's lease may have expired (it was not renewed in time): nothing was written; "
                "the next run picks up."
            )

    def hold(self, using: str | None) -> None:
        """Lock the lease row for the rest of the transaction, or raise LeaseLost if it is not ours."""
        # Imported here: this module is imported with the package, before the app registry is ready.
        from .models import Lease

        connection = connections[using or router.db_for_write(Lease)]
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                held = self._begin_with(connection, cursor)
            elif connection.vendor == "sqlite":
                # SQLite has no row locks: a write takes the database write lock for the transaction.
                cursor.execute(*self._statement(connection))
                held = cursor.rowcount == 1
            elif connection.vendor == "mysql":
                cursor.execute(*self._statement(connection))  # answers whether the token's row is the job's
                found = cursor.fetchone()
                held = found is not None and bool(found[0])
            else:
                cursor.execute(*self._statement(connection))
                held = cursor.fetchone() is not None
        if not held:
            self.signal.abort("lease_lost")
            raise LeaseLost(
                "The attempt's lease was taken over by another attempt: this transaction may not begin; "
                "the next run picks up."
            )

    def _statement(self, connection: Any) -> tuple[str, list[Any]]:
        """Return the lock statement (``_jobstate.hold_lease_sql``) and its parameters: the lease row's id, token."""
        from . import _jobstate
        from .models import Lease

        token = Lease._meta.get_field("token").get_db_prep_value(self.token, connection)
        return _jobstate.hold_lease_sql(connection), [self.lease_id, token]

    def _begin_with(self, connection: Any, cursor: Any) -> bool:
        """Run the lock in the same round trip as the transaction's BEGIN (PostgreSQL); True if it found the row.

        psycopg sends a transaction's BEGIN on its own and waits for it before the first statement, so the
        fence would cost two round trips per transaction. Here ``BEGIN; SELECT …`` goes as one simple query
        through psycopg's documented low-level connection (``pgconn``); psycopg then finds the transaction open
        and sends no BEGIN of its own. Inside a transaction already (a TestCase) the lock is an ordinary
        statement. The query is built once per connection (binding it cost as much Python as the rest of a
        finishing transaction).
        """
        import psycopg  # the postgres extra's: not installed for SQLite-only projects

        raw = connection.connection
        if raw.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            cursor.execute(*self._statement(connection))
            return cursor.fetchone() is not None
        built = self._begin_queries.get(id(raw))
        if built is None or built[0] is not raw:
            query = f"{_begin(raw)}; " + psycopg.ClientCursor(raw).mogrify(*self._statement(connection))
            built = self._begin_queries[id(raw)] = (raw, query.encode(raw.info.encoding))
        with connection.wrap_database_errors:  # raised as Django's errors, as from a cursor
            result = raw.pgconn.exec_(built[1])
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise psycopg.errors.error_from_result(result, encoding=raw.info.encoding)
        return result.ntuples == 1


def _begin(raw: Any) -> str:
    """The BEGIN psycopg itself would send: the connection's isolation level, read-only and deferrable modes."""
    words = ["BEGIN"]
    if raw.isolation_level is not None:
        words.append("ISOLATION LEVEL " + raw.isolation_level.name.replace("_", " "))
    if raw.read_only is not None:
        words.append("READ ONLY" if raw.read_only else "READ WRITE")
    if raw.deferrable is not None:
        words.append("DEFERRABLE" if raw.deferrable else "NOT DEFERRABLE")
    return " ".join(words)
