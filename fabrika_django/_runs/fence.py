"""The lease fence of ctx.transaction(): a stale attempt can never commit after its replacement started."""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from django.db import connection as default_connection
from django.db import connections, router

from .._signal import AbortSignal
from .._sql import fence as fence_sql
from ..exceptions import LeaseLost

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models import QuerySet

    from .._sql import SQLParam
    from ..models._tables import Lease

logger = logging.getLogger("fabrika_django.runner")


class LeaseFence:
    """Checks, at a transaction's begin and before its commit, that the lease is still the attempt's.

    At begin it holds the lease against a change of its token for the rest of the transaction, then checks
    the token. PostgreSQL: a shared advisory lock named after the Lease row (``_sql.fence.fence_lock``),
    which every path that changes or clears a token takes exclusively, in its own transaction, before its
    UPDATE (``lock_fences``); a renewal changes only ``expires`` and takes nothing, so it never waits.
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
        self._begin_queries: dict[int, tuple[object, bytes]] = {}

    def ran_out(self) -> bool:
        """True once the time the last renewal covers has passed: from then on the lease counts as lost."""
        return time.monotonic() >= self.valid_until

    def check(self) -> None:
        """Raise if the attempt ended or its lease may have expired."""
        self.signal.throw_if_aborted()
        if self.ran_out():
            raise LeaseLost(
                "The attempt's lease may have expired (it was not renewed in time): nothing was written; "
                "the next run picks up."
            )

    def hold(self, using: str | None) -> None:
        """Lock the lease row for the rest of the transaction, or raise LeaseLost if it is not ours."""
        # Imported here: this module is imported with the package, before the app registry is ready.
        from ..models._tables import Lease

        connection = connections[using or router.db_for_write(Lease)]
        if connection.vendor == "postgresql":
            held = self._begin_with(connection)
        else:
            held = self._hold_with_cursor(connection)
        if not held:
            self.signal.abort(LeaseLost.code)
            raise LeaseLost(
                "The attempt's lease was taken over by another attempt: this transaction may not begin; "
                "the next run picks up."
            )

    def _hold_with_cursor(self, connection: BaseDatabaseWrapper) -> bool:
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

    def _statement(self, connection: BaseDatabaseWrapper) -> tuple[str, list[SQLParam]]:
        """Return the fence's statement (``_sql.fence.hold_lease``) and its parameters: the lease row's id, token.

        On PostgreSQL that is the token check alone, which runs after the lock (``_begin_with``).
        """
        from ..models._tables import Lease

        token = Lease._meta.get_field("token").get_db_prep_value(self.token, connection)
        return fence_sql.hold_lease(connection), [self.lease_id, token]

    def _begin_with(self, connection: BaseDatabaseWrapper) -> bool:
        """PostgreSQL: take the fence's lock and check the token, in the round trip of the BEGIN; True if held.

        Two statements, in this order: ``SELECT pg_advisory_xact_lock_shared(...)``, then the token check. The
        check must be a statement of its own: at READ COMMITTED each statement reads a snapshot taken when it
        starts, so a check in the lock's own statement would read the snapshot from before a wait for the lock,
        and could find the old token of a takeover that committed during that wait. As the next statement it
        sees every token change whose writer held the lock exclusively before us (``lock_fences``).
        At REPEATABLE READ or SERIALIZABLE the transaction's one snapshot is taken by the lock's statement, so
        there the check also locks the row (``FOR KEY SHARE``, ``_sql.fence.hold_lease_locked``): a token changed
        after that snapshot makes it fail with a serialization error instead of passing (the check answers
        the level it ran at, a server default included).

        psycopg sends a transaction's BEGIN on its own and waits for it before the first statement, so the
        fence would cost two round trips per transaction. Here ``BEGIN; SELECT …; SELECT …`` goes as one simple
        query through psycopg's documented low-level connection (``pgconn``), which answers the last
        statement's rows (or the first error); psycopg then finds the transaction open and sends no BEGIN of
        its own. Inside a transaction already (a TestCase) the statements are ordinary ones. The query is
        built once per connection (binding it cost as much Python as the rest of a finishing transaction), and
        no Django cursor is made for it: a transaction at READ COMMITTED needs none. Neither psycopg nor Django
        has a public way to send a statement with the BEGIN; that psycopg then sends no BEGIN of its own inside
        Django's ``atomic()`` is pinned by tests/test_django_seams.py, on Django 5.2 and 6.x.
        """
        import psycopg  # the postgres extra's: not installed for SQLite-only projects

        connection.ensure_connection()  # open already inside atomic(): a check, not a round trip
        raw = connection.connection
        if raw.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with connection.cursor() as cursor:
                cursor.execute(fence_sql.fence_lock(), [self.lease_id])
                cursor.execute(*self._statement(connection))
                found = cursor.fetchone()
                return found is not None and self._checked_at(connection, found[0])
        built = self._begin_queries.get(id(raw))
        if built is None or built[0] is not raw:
            mogrify = psycopg.ClientCursor(raw).mogrify
            lock = mogrify(fence_sql.fence_lock(), [self.lease_id])
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

    def _checked_at(self, connection: BaseDatabaseWrapper, level: str) -> bool:
        """True if the token check, run at isolation ``level``, answers for the rest of the transaction."""
        if level == "read committed":
            return True
        _sql, params = self._statement(connection)
        with connection.cursor() as cursor:
            cursor.execute(fence_sql.hold_lease_locked(connection), params)
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


# PostgreSQL fences each ``ctx.transaction()`` with a shared advisory lock named after its lease, (FENCE_LOCK_CLASS,
# the Lease row's id): one per (job, lane), so one lane's changes never wait for another lane's transactions.
# The fence takes it in the transaction's first statement and checks the token in the next (``_fence``). Every
# path that changes or clears a token that a fenced transaction could still hold (a takeover, ``rotate``,
# ``end_run``, ``release``, ``release_all``) first takes the same lock exclusively in its own transaction
# (``lock_fences``), before its UPDATE, and keeps it until its commit. So a token change waits for every open
# fenced transaction of the old token (a stale attempt never commits after its replacement started), and a
# fenced transaction that asks for the lock meanwhile waits for the change's commit, after which its check
# finds the new token and refuses. A renewal changes only ``expires``, takes nothing and never waits. The free
# lease's one-statement start (``_sql.runs.free_lease_start``) sets a token over a null one, and no fenced
# transaction holds a null token (the path that cleared it waited for them all, and any later check finds
# null), so it takes nothing either. The lock replaced a ``FOR KEY SHARE`` row lock, which wrote the lease
# row's xmax (a dirtied page, WAL) in every fenced transaction: about a quarter millisecond of the server's.
#
# A stopped process (SIGSTOP, a long GC pause, a VM migration) never ends its fenced transaction, and the
# takeover would wait for as long as the process stays frozen (a takeover must come within about a lease). The
# shared lock names the sessions that hold a lane's fence in pg_locks, so a takeover of an *expired* lease ends
# those sessions (pg_terminate_backend) before it asks for the exclusive lock: their transactions roll back,
# which the fence would have done at their commit anyway, since an attempt whose lease expired may not commit;
# the exclusive lock then waits only for those sessions to exit. A live holder keeps renewing, so its lease
# never expires and its transactions are never touched.


def lock_fences(leases: QuerySet[Lease]) -> list[int] | None:
    """Wait for the open fenced transactions of ``leases`` (a Lease queryset), and hold off new ones, until this
    transaction ends; answer the ids it locked (None elsewhere than PostgreSQL: nothing to do there).

    The fence's lock, taken exclusively, lease by lease in the order of their ids, in the transaction that
    then changes or clears their tokens (on the other databases the token UPDATE's own lock does it). Only the
    rows the queryset finds now: a stale attempt's ``end_run`` whose token is gone locks nothing, so it never
    waits for its replacement's transactions.
    """
    connection = default_connection
    if connection.vendor != "postgresql":
        return None
    if not connection.in_atomic_block:
        raise RuntimeError("lock_fences() holds its locks until the transaction ends: call it inside one.")
    sql, params = leases.order_by("id").values("id").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(fence_sql.lock_fences(sql), params)
        return [row[0] for row in cursor.fetchall()]


def end_frozen_fences(lease_id: int) -> int:
    """End the sessions holding fenced transactions under the lease ``lease_id`` if it expired; return how many.

    Runs in the takeover's transaction (under the Job row's lock), before ``lock_fences`` and its UPDATE.
    """
    connection = default_connection
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        cursor.execute(fence_sql.end_frozen_fences(connection), [lease_id, lease_id])
        row = cursor.fetchone()
    ended = int(row[0]) if row else 0
    if ended:
        logger.warning("Ended the fenced transactions of a frozen holder lease=%d sessions=%d", lease_id, ended)
    return ended
