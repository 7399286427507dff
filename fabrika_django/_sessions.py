"""Session settings of fabrika's own processes (the worker, ``fabrika_job run``): bounds on a frozen or cut-off
holder's session.

A holder frozen inside a transaction (SIGSTOP, a long GC pause, a VM paused) keeps its locks for as long as it
stays frozen: the fence's lock on its lease row inside ``ctx.transaction()``, or a Job row between a run's
start and end. What that blocks must stay bounded by about a lease. PostgreSQL's takeover ends such sessions
itself (``_runs.fence.end_frozen_fences``, and the Job row's ``idle_in_transaction_session_timeout``). On
MariaDB the server does it here: every connection of a fabrika process sets ``idle_transaction_timeout`` to one
lease, so a transaction that sends no statement for that long has its connection closed and its locks freed, about
when the lease of a frozen holder expires and its takeover begins. A live handler never sits that long inside
``ctx.transaction()`` without a statement unless it waits on something outside the database there, which holds
the row locks it took for as long (the MariaDB how-to says so); on MariaDB it loses that transaction.
MySQL has no such setting; SQLite's single writer has no sessions to end.

A holder cut off from the database (its host gone, a network partition) is idle in the server's eyes too, and
when no other worker takes its lease over, nothing ends its session until the server's TCP keepalive notices,
about two hours by the operating system's defaults. So on PostgreSQL every connection of a fabrika process sets
the server's keepalives for its session: the first probe after a lease of silence, three more a third of a lease
apart, and a lease for data left unacknowledged (``tcp_user_timeout``). A cut-off holder's session then ends,
and its locks are freed, within about two leases of its last word. A connection through a Unix socket has no TCP
to watch, and the server ignores the settings there.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from django.db import connections
from django.db.backends.signals import connection_created

from ._lease_time import lease_seconds
from ._sql import sessions as sql

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


def bound_idle_transactions() -> None:
    """Bound idle transactions on this process's MariaDB connections: those open now and every later one."""
    connection_created.connect(_on_connection_created, dispatch_uid="fabrika_bound_idle_transactions")
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None:
            _bound(connection)


def idle_transaction_seconds() -> int:
    """One lease, in whole seconds (the server's unit)."""
    return math.ceil(lease_seconds())


def _on_connection_created(sender: object, connection: BaseDatabaseWrapper, **kwargs: object) -> None:
    _bound(connection)


def dead_client_settings() -> list[str]:
    """PostgreSQL's keepalive idle, interval and count (seconds, seconds, probes) and user timeout (ms)."""
    lease = lease_seconds()
    return [str(math.ceil(lease)), str(math.ceil(lease / 3)), "3", str(math.ceil(lease * 1000))]


def _bound(connection: BaseDatabaseWrapper) -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql.POSTGRESQL_BOUND_DEAD_CLIENTS, dead_client_settings())
        return
    if connection.vendor != "mysql" or "mariadb" not in connection.connection.get_server_info().lower():
        return
    with connection.cursor() as cursor:
        cursor.execute(sql.MARIADB_BOUND_IDLE_TRANSACTIONS, [idle_transaction_seconds()])
