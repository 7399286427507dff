"""The lease fence of ctx.transaction(): a stale attempt can never commit after its replacement started."""

from __future__ import annotations

import time
import uuid

from django.db import connections, router

from .context import AbortSignal
from .exceptions import LeaseLost


class LeaseFence:
    """Checks, at a transaction's begin and before its commit, that the lease is still the attempt's.

    At begin it locks the lease row against takeover inside the transaction: PostgreSQL ``FOR KEY SHARE``
    (a takeover changes the unique ``token`` and so needs ``FOR UPDATE``, which waits; a renewal changes
    only ``expires`` and does not), SQLite the database write lock, other backends ``FOR UPDATE``. Before
    commit it checks locally, without a round trip: the signal (deadline, lost lease, shutdown) and the
    time the last renewal is known to cover.
    """

    def __init__(self, job_name: str, token: uuid.UUID, signal: AbortSignal, valid_until: float) -> None:
        self.job_name = job_name
        self.token = token
        self.signal = signal
        #: time.monotonic() up to which the lease is known to be ours (measured before the renewal was sent).
        self.valid_until = valid_until

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
        from .models import Lease

        alias = using or router.db_for_write(Lease)
        connection = connections[alias]
        table = connection.ops.quote_name(Lease._meta.db_table)
        token = Lease._meta.get_field("token").get_db_prep_value(self.token, connection)
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                # SQLite has no row locks: a write takes the database write lock for the transaction.
                sql = f"UPDATE {table} SET token = token WHERE job = %s AND token = %s"  # noqa: S608  quoted name
                cursor.execute(sql, [self.job_name, token])
                held = cursor.rowcount == 1
            else:
                lock = "FOR KEY SHARE" if connection.vendor == "postgresql" else "FOR UPDATE"
                sql = f"SELECT 1 FROM {table} WHERE job = %s AND token = %s {lock}"  # noqa: S608  quoted name
                cursor.execute(sql, [self.job_name, token])
                held = cursor.fetchone() is not None
        if not held:
            self.signal.abort("lease_lost")
            raise LeaseLost(
                "The attempt's lease was taken over by another attempt: this transaction may not begin; "
                "the next run picks up."
            )
