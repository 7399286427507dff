"""Kick rows and the pending flag: writing a kick, taking kicks into the flag, the worker's own requests,
and a full claim's ask for one more lane.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, router, transaction
from django.db.models import Exists
from django.db.models.functions import Now
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from .._channel import CHANNEL
from .._running import framework_write
from .._sql import cache_dict, prepared
from .._sql import runs as run_sql
from ..models._tables import Job, KickRequest, Lease

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("fabrika_django.runner")


# A kick is a ``KickRequest`` row inserted in the kicking transaction (with, on PostgreSQL, a NOTIFY that the
# commit delivers and a rollback drops): one more row in the caller's own commit, never an update of a row that
# other requests update too. A worker *takes* kick rows (deletes them and sets their jobs' ``pending_since`` in
# one transaction) on each poll, and a run's start takes its job's (on PostgreSQL in the start's own statement,
# so the run a NOTIFY asked for starts in one round trip); from there on a kick is the worker-side pending flag.
# A kick nobody heard (no worker listening, or one killed before it took the row) stays a row until a worker's
# next poll or start-up; one killed after it took the row left the durable flag.


def add_kick(name: str, *, using: str) -> None:
    """Insert a kick of ``name`` in the current transaction of ``using`` (in autocommit: its own commit)."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        prepared.fetchone(connection, run_sql.kick(connection), {"name": name, "channel": CHANNEL})
        return
    with connection.cursor() as cursor:
        cursor.execute(
            run_sql.kick_insert(connection), [name, connection.ops.adapt_datetimefield_value(timezone.now())]
        )


def take_kicks(names: list[str], *, using: str | None = None) -> list[str]:
    """Take the kick rows of the named jobs: delete them and set those jobs' pending flags; return the jobs.

    A job's ``pending_since`` becomes its oldest kick's time unless it was pending already. Rows another worker
    is taking are skipped (PostgreSQL, MariaDB/MySQL), never waited for. The common case, no kick waiting, costs
    one statement that finds nothing.
    """
    if not names:
        return []
    connection = connections[using or router.db_for_write(KickRequest)]
    if connection.vendor == "postgresql":
        row = prepared.fetchone(connection, run_sql.take_kicks(connection), {"names": list(names)})
        taken, known = (row[0] or [], row[1] or []) if row else ([], [])
    else:
        taken, known = _take_kicks_locked(connection, names)
    for name in set(taken) - set(known):
        _create_pending(name, connection.alias)  # a job whose row no worker has made yet
    return sorted(set(taken))


def _take_kicks_locked(connection: BaseDatabaseWrapper, names: list[str]) -> tuple[list[str], list[str]]:
    """The other databases' ``take_kicks``: a plain read first (nothing to take, nothing locked), then a
    transaction that locks the rows (MariaDB/MySQL: skipping those another worker holds; SQLite: the write lock),
    deletes them and sets the flags."""
    alias = connection.alias
    kicks = KickRequest.objects.using(alias).filter(job__in=names)
    if not kicks.exists():
        return [], []
    with framework_write(), transaction.atomic(using=alias):
        if connection.features.has_select_for_update_skip_locked:
            kicks = kicks.select_for_update(skip_locked=True)
        else:
            # SQLite: take the write lock before reading, as claim does, so the read and delete see one state.
            quote = connection.ops.quote_name
            with connection.cursor() as cursor:
                cursor.execute(run_sql.write_lock(connection, quote(KickRequest._meta.db_table), quote("job")))
        firsts: dict[str, datetime] = {}
        ids = []
        for pk, job, created in kicks.values_list("pk", "job", "created"):
            ids.append(pk)
            firsts[job] = min(created, firsts.get(job, created))
        KickRequest.objects.using(alias).filter(pk__in=ids).delete()
        known = set(Job.objects.using(alias).filter(name__in=list(firsts)).values_list("name", flat=True))
        for job, created in firsts.items():
            Job.objects.using(alias).filter(name=job, pending_since__isnull=True).update(pending_since=created)
    return list(firsts), list(known)


def waiting_kicks(names: list[str]) -> set[str]:
    """Return those of the named jobs with kick rows no worker has taken yet (they are pending too)."""
    return set(KickRequest.objects.filter(job__in=names).values_list("job", flat=True).distinct())


def mark_pending(name: str, *, using: str | None = None) -> bool:
    """Set the job's pending flag unless it is up already; wake listening workers; True if this set it.

    The worker's own requests (a fire during a run, a run handed over at shutdown), in autocommit; a request's
    kick is a ``KickRequest`` row instead (``add_kick``). One statement in the common case. The job's row is
    made only when it is missing (a job no worker or run has seen yet).
    """
    alias = using or router.db_for_write(Job)
    connection = connections[alias]
    if connection.vendor == "postgresql":
        # One row always (an aggregate): (0, ...) when the flag was up already.
        params = {"name": name, "channel": CHANNEL}
        marked, exists = prepared.fetchone(connection, run_sql.mark_pending(connection), params) or (0, True)
    else:
        with connection.cursor() as cursor:
            cursor.execute(
                run_sql.mark_pending_plain(connection), [connection.ops.adapt_datetimefield_value(timezone.now()), name]
            )
            marked = cursor.rowcount
        # Zero rows: already pending (the common case under load), or no row yet (the rare miss).
        exists = marked or Job.objects.using(alias).filter(name=name, pending_since__isnull=False).exists()
    if not marked and not exists:
        marked = _create_pending(name, alias)
    return bool(marked)


def _create_pending(name: str, alias: str) -> bool:
    """The rare miss: make the job's row (unless another session just did) and mark it pending."""
    manager = Job.objects.using(alias)
    manager.bulk_create([Job(name=name)], ignore_conflicts=True)
    # Whoever made the row, it may not be pending yet: a worker's sync makes rows without the flag.
    if manager.filter(name=name, pending_since__isnull=True).update(pending_since=Now()):
        notify(name, using=alias)
        return True
    return False


def notify(name: str, *, using: str | None = None) -> None:
    """Wake the workers listening on PostgreSQL for ``name`` (nothing elsewhere: they poll)."""
    connection = connections[using or "default"]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(run_sql.NOTIFY, [CHANNEL, name])


def ask_for_lane(name: str, lanes: int) -> bool:
    """Ask for one more run of ``name`` in a free lane (a run's claim came back full); True if this asked.

    One statement, which writes only while the flag is down and a lane of the job is free: a job whose every
    lane is busy costs its runs' full claims a read, not a write. Workers hear it as a kick.
    """
    alias = router.db_for_write(Job)
    sql, params = lane_ask(alias, name, lanes)
    with framework_write():
        with transaction.mark_for_rollback_on_error(alias), connections[alias].cursor() as cursor:
            cursor.execute(sql, params)
            asked = cursor.rowcount
        if asked:
            notify(name)
    return bool(asked)


# ask_for_lane's UPDATE by (database alias, job, lanes), compiled by the ORM once: every full claim of a run in
# lanes sends it, and compiling it again each time cost more of the worker's Python than the claim's own SQL.
_LANE_ASKS: dict[tuple[str, str, int], tuple[str, tuple[Any, ...]]] = cache_dict()


def lane_ask(alias: str, name: str, lanes: int) -> tuple[str, tuple[Any, ...]]:
    """Return ``ask_for_lane``'s statement and parameters: what ``QuerySet.update()`` would send."""
    key = (alias, name, lanes)
    if key not in _LANE_ASKS:
        free = Lease.objects.using(alias).filter(job=name, lane__lt=lanes, token__isnull=True)
        asking = Job.objects.using(alias).filter(Exists(free), name=name, lane_asked__isnull=True)
        query: Any = asking.query.chain(UpdateQuery)  # an UpdateQuery (the stubs type chain() as Query)
        query.add_update_values({"lane_asked": Now()})
        sql, params = query.get_compiler(alias).as_sql()
        _LANE_ASKS[key] = (sql, tuple(params))
    return _LANE_ASKS[key]


def is_pending(name: str) -> bool:
    """Whether the job was kicked: its flag, or a kick row no worker took yet (taken into the flag here).

    Called under the Job row's lock when a run starts or ends, so a kick committed during a run is seen as it
    ends also where no worker takes kick rows (``fabrika_job run`` from cron).
    """
    take_kicks([name])
    return Job.objects.filter(name=name, pending_since__isnull=False).exists()
