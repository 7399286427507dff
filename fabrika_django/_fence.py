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

    At begin it holds the lease against a change of its token for the rest of the transaction, then checks
    the token. PostgreSQL: a shared advisory lock named after the Lease row (``_jobstate.fence_lock_sql``),
    which every path that changes or clears a token takes exclusively, in its own transaction, before its
    UPDATE (``_jobstate.lock_fences``); a renewal changes only ``expires`` and takes nothing, so it never waits.
    MariaDB/MySQL: a shared lock on the token's unique index entry (a token change must lock that entry, a
    renewal does not). SQLite: the database write lock. Other backends: ``FOR UPDATE``. Before commit it checks
    locally, without a round trip: the signal (deadline, lost lease, shutdown) and the time the last renewal
    is known to cover.
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
        if connection.vendor == "postgresql":
            held = self._begin_with(connection)
        else:
            held = self._hold_with_cursor(connection)
        if not held:
            self.signal.abort("lease_lost")
            raise LeaseLost(
                "The attempt's lease was taken over by another attempt: this transaction may not begin; "
                "the next run picks up."
            )

    def _hold_with_cursor(self, connection: Any) -> bool:
        """Every backend but PostgreSQL: the fence's statement through a cursor; True if the lease is held."""
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
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
        return held

    def _statement(self, connection: Any) -> tuple[str, list[Any]]:
        """Return the fence's statement (``_jobstate.hold_lease_sql``) and its parameters: the lease row's id, token.

        On PostgreSQL that is the token check alone, which runs after the lock (``_begin_with``).
        """
        from . import _jobstate
        from .models import Lease

        token = Lease._meta.get_field("token").get_db_prep_value(self.token, connection)
        return _jobstate.hold_lease_sql(connection), [self.lease_id, token]

    def _begin_with(self, connection: Any) -> bool:
        """PostgreSQL: take the fence's lock and check the token, in the round trip of the BEGIN; True if held.

        Two statements, in this order: ``SELECT pg_advisory_xact_lock_shared(...)``, then the token check. The
        check must be a statement of its own: at READ COMMITTED each statement reads a snapshot taken when it
        starts, so a check in the lock's own statement would read the snapshot from before a wait for the lock,
        and could find the old token of a takeover that committed during that wait. As the next statement it
        sees every token change whose writer held the lock exclusively before us (``_jobstate.lock_fences``).
        At REPEATABLE READ or SERIALIZABLE the transaction's one snapshot is taken by the lock's statement, so
        there the check also locks the row (``FOR KEY SHARE``, ``hold_lease_locked_sql``): a token changed
        after that snapshot makes it fail with a serialization error instead of passing (the check answers
        the level it ran at, a server default included).

        psycopg sends a transaction's BEGIN on its own and waits for it before the first statement, so the
        fence would cost two round trips per transaction. Here ``BEGIN; SELECT …; SELECT …`` goes as one simple
        query through psycopg's documented low-level connection (``pgconn``), which answers the last
        statement's rows (or the first error); psycopg then finds the transaction open and sends no BEGIN of
        its own. Inside a transaction already (a TestCase) the statements are ordinary ones. The query is
        built once per connection (binding it cost as much Python as the rest of a finishing transaction), and
        no Django cursor is made for it: a transaction at READ COMMITTED needs none.
        """
        import psycopg  # the postgres extra's: not installed for SQLite-only projects

        from . import _jobstate

        connection.ensure_connection()  # open already inside atomic(): a check, not a round trip
        raw = connection.connection
        if raw.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with connection.cursor() as cursor:
                cursor.execute(_jobstate.fence_lock_sql(), [self.lease_id])
                cursor.execute(*self._statement(connection))
                found = cursor.fetchone()
                return found is not None and self._checked_at(connection, found[0])
        built = self._begin_queries.get(id(raw))
        if built is None or built[0] is not raw:
            mogrify = psycopg.ClientCursor(raw).mogrify
            lock = mogrify(_jobstate.fence_lock_sql(), [self.lease_id])
            query = "; ".join((_begin(raw), lock, mogrify(*self._statement(connection))))
            built = self._begin_queries[id(raw)] = (raw, query.encode(raw.info.encoding))
        with connection.wrap_database_errors:  # raised as Django's errors, as from a cursor
            result = raw.pgconn.exec_(built[1])
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise psycopg.errors.error_from_result(result, encoding=raw.info.encoding)
        if result.ntuples != 1:
            return False
        level = result.get_value(0, 0)
        return self._checked_at(connection, level.decode() if level is not None else "")

    def _checked_at(self, connection: Any, level: str) -> bool:
        """True if the token check, run at isolation ``level``, answers for the rest of the transaction."""
        if level == "read committed":
            return True
        from . import _jobstate

        _sql, params = self._statement(connection)
        with connection.cursor() as cursor:
            cursor.execute(_jobstate.hold_lease_locked_sql(connection), params)
            return cursor.fetchone() is not None


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
