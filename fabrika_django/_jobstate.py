"""A job's run state: every write and query of the ``Job``, ``Lease`` and ``Attempt`` rows.

The runner orchestrates attempts, the worker loops, kicks mark jobs pending, the admin and the status
command report; all of them read and write a job's rows through the functions here, so the rules those rows
keep are written once:

- Starting and ending a run lock the job's ``Job`` row first, then its ``Lease`` row (SQLite: the database
  write lock), on every path: a kick is either seen by the run that ends or finds the lease free.
- The lease is free when its ``token`` is null; *active* when a token is set and ``expires`` is still ahead
  (``lease_active``); a token whose ``expires`` passed is a holder that vanished, taken over by the next start.
- A run's first attempt row is written in the start's own commit; a cut-off attempt is marked ``crashed``.

Hand-written SQL lives here (and in ``queues.py`` for queue tables) only where the ORM cost more than the
statement on a hot path: the kick, the one-statement start on PostgreSQL, the worker's scan, the fence.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection as default_connection
from django.db import connections, router, transaction
from django.db.models import BooleanField, Count, Exists, ExpressionWrapper, F, Min, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce, Now
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from . import _prepared
from ._caches import resets_with_settings
from ._channel import CHANNEL
from ._running import CLAIMS_AT_START, framework_write
from .conf import settings
from .jobs import registry
from .models import Attempt, Job, KickRequest, Lease, Outcome
from .ops import _digest

logger = logging.getLogger("fabrika_django.runner")


#: Outcomes of a run cut off: ending so with its lease still its own, the run leaves the job pending.
CUT_OFF = frozenset({Outcome.LEASE_LOST.value, Outcome.CRASHED.value})

_FREE = {"token": None, "holder": "", "run_id": None, "expires": None, "attempt": 0}


# -- what "active" means ----------------------------------------------------------------------------------


def lease_active(now: datetime) -> Q:
    """The condition on a ``Lease`` row of a job whose run is active at ``now``: a token, not yet expired."""
    return Q(token__isnull=False, expires__gt=now)


def job_states(names: list[str], now: datetime) -> dict[str, dict[str, Any]]:
    """Read the ``Job`` row of each named job with ``active``, ``active_lanes``, ``lanes`` and ``holder``.

    ``active_lanes`` counts the job's runs active now (one a lane); ``holder`` is one of their holders.

    Jobs without rows yet (never run, no worker started since they were declared) answer the defaults of a
    fresh row: nothing is written on a read.
    """
    fresh = {field.attname: field.get_default() for field in Job._meta.concrete_fields}
    rows = {row["name"]: row for row in Job.objects.filter(name__in=names).values()}
    active: dict[str, list[str]] = {}
    for row in Lease.objects.filter(lease_active(now), job__in=names).values("job", "holder").order_by("lane"):
        active.setdefault(row["job"], []).append(row["holder"])
    kicked = waiting_kicks(names)
    states = {}
    for name in names:
        state = dict(rows.get(name) or {**fresh, "name": name})
        state["active"] = name in active
        state["active_lanes"] = len(active.get(name, ()))
        state["lanes"] = _lanes_of(name)
        state["holder"] = active[name][0] if name in active else None
        # A kick no worker has taken yet is pending too.
        state["pending"] = state["pending_since"] is not None or name in kicked
        states[name] = state
    return states


def active_annotation(now: datetime) -> Any:
    """An ``Exists`` to annotate a ``Job`` queryset with ``active`` (the jobs admin)."""
    return Exists(Lease.objects.filter(lease_active(now), job=OuterRef("name")))


def active_lanes_annotation(now: datetime) -> Any:
    """A subquery to annotate a ``Job`` queryset with ``active_lanes``: its runs active now (the jobs admin)."""
    active = Lease.objects.filter(lease_active(now), job=OuterRef("name")).order_by()
    return Coalesce(Subquery(active.values("job").annotate(count=Count("pk")).values("count")), 0)


def kicked_annotation() -> Any:
    """An ``Exists`` to annotate a ``Job`` queryset with ``kicked``: a kick row no worker has taken yet."""
    return Exists(KickRequest.objects.filter(job=OuterRef("name")))


def job_names() -> set[str]:
    """Return the names of the jobs that have a ``Job`` row."""
    return set(Job.objects.values_list("name", flat=True))


def recent_attempts(name: str, count: int) -> list[Attempt]:
    """Return the job's last ``count`` attempts, newest first."""
    return list(Attempt.objects.filter(job=name)[:count])


# -- rows -----------------------------------------------------------------------------------------------


def ensure_rows(names: list[str]) -> None:
    """Make the ``Job`` and ``Lease`` rows of the named jobs that have none yet."""
    with framework_write():
        Job.objects.bulk_create([Job(name=name) for name in names], ignore_conflicts=True)
        leases = [Lease(job=name, lane=lane) for name in names for lane in range(_lanes_of(name))]
        Lease.objects.bulk_create(leases, ignore_conflicts=True)


def _lock_job(name: str) -> None:
    """Serialise starting and ending runs of one job on its Job row (SQLite: the database write lock).

    A job's rows are made here the first time it runs, so starting a run costs no statement for them.
    """
    if not _lock_job_row(name):
        ensure_rows([name])
        _lock_job_row(name)


def _lock_job_row(name: str) -> bool:
    connection = default_connection
    if connection.vendor == "postgresql" and len(connection.atomic_blocks) == 1:
        return _lock_job_row_bounded(connection, name)
    if connection.features.has_select_for_update:
        return bool(list(Job.objects.select_for_update().filter(name=name).values_list("name")))
    return bool(Job.objects.filter(name=name).update(failures_in_row=F("failures_in_row")))


def _lock_job_row_bounded(connection: Any, name: str) -> bool:
    """PostgreSQL: lock the Job row, and end this transaction's session if it sits idle past two leases.

    Every start and end of a run holds the Job row for a few statements. A process stopped in between (SIGSTOP,
    a VM paused) would hold it for as long as it stays stopped, and every other start and end of the job would
    wait: with lanes, starts are frequent enough to meet it. The server ends such a session
    (``idle_in_transaction_session_timeout``, for this transaction only), which rolls the transaction back;
    its process, should it wake, finds its connection gone and takes the path of a cut connection. Only in a
    transaction of the framework's own (not inside a caller's, such as a TestCase's).
    """
    table = connection.ops.quote_name(Job._meta.db_table)
    bound = str(int(2000 * max(1.0, float(settings.LEASE_SECONDS))))
    sql = (
        "SELECT set_config('idle_in_transaction_session_timeout', %s, true) "  # noqa: S608  quoted name
        f"FROM {table} WHERE name = %s FOR UPDATE"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [bound, name])
        return cursor.fetchone() is not None


# -- kicks ----------------------------------------------------------------------------------------------
#
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
        _prepared.fetchone(connection, kick_sql(connection), {"name": name, "channel": CHANNEL})
        return
    table = connection.ops.quote_name(KickRequest._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (job, created) VALUES (%s, %s)",  # noqa: S608  quoted name
            [name, connection.ops.adapt_datetimefield_value(timezone.now())],
        )


def kick_sql(connection: Any) -> str:
    """PostgreSQL's kick: the row and the NOTIFY in one statement (bench/kick_latency.py runs it alone).

    Parameters: name, channel. ``kick_cte`` is the same row as a CTE, for a statement that inserts a queue row.
    """
    return f"WITH {kick_cte(connection)} SELECT pg_notify(%(channel)s, %(name)s)"


def kick_cte(connection: Any) -> str:
    """A ``WITH`` item that inserts a kick of ``%(name)s`` (PostgreSQL); the statement adds the NOTIFY."""
    table = connection.ops.quote_name(KickRequest._meta.db_table)
    return f"kick AS (INSERT INTO {table} (job, created) VALUES (%(name)s, statement_timestamp()))"  # noqa: S608


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
        row = _prepared.fetchone(connection, _take_kicks_sql(connection), {"names": list(names)})
        taken, known = (row[0] or [], row[1] or []) if row else ([], [])
    else:
        taken, known = _take_kicks_locked(connection, names)
    for name in set(taken) - set(known):
        _create_pending(name, connection.alias)  # a job whose row no worker has made yet
    return sorted(set(taken))


def _take_kicks_sql(connection: Any) -> str:
    """PostgreSQL's ``take_kicks`` in one statement: the jobs taken, and those of them with a ``Job`` row.

    Its commit does not wait for the WAL flush: lost in a database crash, it comes back as the kick rows it
    deleted, which are taken again.
    """
    quote = connection.ops.quote_name
    kicks, jobs = quote(KickRequest._meta.db_table), quote(Job._meta.db_table)
    return (
        f"WITH taken AS (DELETE FROM {kicks} WHERE id IN (SELECT id FROM {kicks} "  # noqa: S608  quoted names
        "WHERE job = ANY(%(names)s) FOR UPDATE SKIP LOCKED) RETURNING job, created), "
        "firsts AS (SELECT job, min(created) AS created FROM taken GROUP BY job), "
        f"marked AS (UPDATE {jobs} AS job SET pending_since = firsts.created FROM firsts, "
        "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit "
        "WHERE job.name = firsts.job AND job.pending_since IS NULL RETURNING job.name) "
        f"SELECT array_agg(firsts.job), array_agg(firsts.job) FILTER (WHERE EXISTS "
        f"(SELECT 1 FROM {jobs} WHERE name = firsts.job)) FROM firsts"
    )


def _take_kicks_locked(connection: Any, names: list[str]) -> tuple[list[str], list[str]]:
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
            with connection.cursor() as cursor:
                table = connection.ops.quote_name(KickRequest._meta.db_table)
                cursor.execute(f"UPDATE {table} SET job = job WHERE 1 = 0")  # noqa: S608  quoted name
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
        marked, exists = _prepared.fetchone(connection, _mark_pending_sql(connection), params) or (0, True)
    else:
        table = connection.ops.quote_name(Job._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET pending_since = %s WHERE name = %s AND pending_since IS NULL",  # noqa: S608
                [connection.ops.adapt_datetimefield_value(timezone.now()), name],
            )
            marked = cursor.rowcount
        # Zero rows: already pending (the common case under load), or no row yet (the rare miss).
        exists = marked or Job.objects.using(alias).filter(name=name, pending_since__isnull=False).exists()
    if not marked and not exists:
        marked = _create_pending(name, alias)
    return bool(marked)


def _mark_pending_sql(connection: Any) -> str:
    """PostgreSQL's ``mark_pending``: the flag and the NOTIFY in one round trip. Parameters: name, channel.

    The EXISTS reads the row as it was before the UPDATE, which tells "already pending" (nothing to do) from
    "no row yet".
    """
    table = connection.ops.quote_name(Job._meta.db_table)
    return (
        f"WITH k AS (UPDATE {table} SET pending_since = now() "  # noqa: S608  quoted name
        "WHERE name = %(name)s AND pending_since IS NULL RETURNING name) "
        f"SELECT count(pg_notify(%(channel)s, k.name)), EXISTS (SELECT 1 FROM {table} WHERE name = %(name)s) FROM k"
    )


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
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, name])


def ask_for_lane(name: str, lanes: int) -> bool:
    """Ask for one more run of ``name`` in a free lane (a run's claim came back full); True if this asked.

    One statement, which writes only while the flag is down and a lane of the job is free: a job whose every
    lane is busy costs its runs' full claims a read, not a write. Workers hear it as a kick.
    """
    alias = router.db_for_write(Job)
    sql, params = _lane_ask(alias, name, lanes)
    with framework_write():
        with transaction.mark_for_rollback_on_error(alias), connections[alias].cursor() as cursor:
            cursor.execute(sql, params)
            asked = cursor.rowcount
        if asked:
            notify(name)
    return bool(asked)


# ask_for_lane's UPDATE by (database alias, job, lanes), compiled by the ORM once: every full claim of a run in
# lanes sends it, and compiling it again each time cost more of the worker's Python than the claim's own SQL.
_LANE_ASKS: dict[tuple[str, str, int], tuple[str, tuple[Any, ...]]] = resets_with_settings({})


def _lane_ask(alias: str, name: str, lanes: int) -> tuple[str, tuple[Any, ...]]:
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


def _is_pending(name: str) -> bool:
    """Whether the job was kicked: its flag, or a kick row no worker took yet (taken into the flag here).

    Called under the Job row's lock when a run starts or ends, so a kick committed during a run is seen as it
    ends also where no worker takes kick rows (``fabrika_job run`` from cron).
    """
    take_kicks([name])
    return Job.objects.filter(name=name, pending_since__isnull=False).exists()


# -- starting a run -------------------------------------------------------------------------------------


@dataclass
class Start:
    """What starting a run asks for; both ways of starting take their values from here, by name."""

    job: str
    trigger: str
    holder: str
    #: How long the lease is granted for, in seconds.
    seconds: float
    #: A run resumed after a takeover stops resuming past this attempt number.
    max_attempt: int
    #: False for a worker serving the pending flag: start only while it is up (see ``start_or_join``).
    mark_pending: bool = True
    #: The job's lanes: how many runs of it may be active at once.
    lanes: int = 1
    #: The run's clock at its start: the ``now`` of a first claim made in the start's statement
    #: (``_running.CLAIMS_AT_START``).
    now: datetime | None = None
    token: uuid.UUID = field(default_factory=uuid.uuid4)
    run_id: uuid.UUID = field(default_factory=uuid.uuid4)

    def params(self) -> dict[str, Any]:
        """The named parameters of ``free_lease_start_sql``."""
        return {
            "name": self.job,
            "token": self.token,
            "holder": self.holder,
            "run_id": self.run_id,
            "seconds": self.seconds,
            "trigger": self.trigger,
            "outcome": Outcome.RUNNING.value,
        }


@dataclass
class Started:
    """The lease a run holds: its token, run, trigger and attempt number (rotated per attempt)."""

    job: str
    token: uuid.UUID
    run_id: uuid.UUID
    trigger: str
    attempt: int
    holder: str
    #: The Attempt row of the attempt, inserted in the start's own commit.
    attempt_id: int
    #: The lane (0-based) whose lease this is, and that Lease row's id.
    lane: int = 0
    lease_id: int = 0
    #: The job's lanes when the run started.
    lanes: int = 1
    #: (database alias, rows) of the first claim made in the start's own statement
    #: (``_running.CLAIMS_AT_START``), else None.
    claimed: tuple[str, list[tuple[Any, ...]]] | None = None


def start_or_join(start: Start) -> Started | None:
    """Take a lease of the job for a new run, or mark the job pending if it is busy (None).

    Which lane (``_pick_lane``): a lease left expired by a holder that vanished (a crash, SIGKILL) is taken
    over first: the cut-off attempt is recorded ``crashed``, and its run goes on with its next attempt while
    it has retries left. Else a free lane, when no run of the job is active (the seed's rule: kicks coalesce
    into one pending run), or when a run whose claim came back full asked for one more lane (``ask_for_lane``).

    ``mark_pending=False`` is a worker serving the flags (a kick it heard): with the flags already cleared, a
    run that started after the kick served it (another worker heard it too), so nothing starts.
    """
    with framework_write():
        started = _start_on_free_lease(start)
        if started is not None:
            return started
        with transaction.atomic():
            return _start_under_job_lock(start)


def _start_on_free_lease(start: Start) -> Started | None:
    """PostgreSQL: start a run on a free lease in one statement, its first Attempt row included.

    It does what ``_start_under_job_lock`` does when the lease is free, in the same order of locks (the Job
    row, then the Lease row), so the two never deadlock: a kick's run starts one commit after the worker heard
    it, not three. Anything else (a held or expired lease, a resumed run, rows not made yet) answers None,
    and the general path decides under the Job row's lock.
    """
    connection = default_connection
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return None
    params = start.params()
    claim = CLAIMS_AT_START.get(start.job)
    pieces = None
    if claim is not None:
        ctes, tail, claim_params = claim(connection, start.now or timezone.now(), registry.get(start.job))
        pieces, params = (ctes, tail), {**params, **claim_params}
    sql = free_lease_start_sql(connection, require_pending=not start.mark_pending, lanes=start.lanes, claim=pieces)
    rows = _prepared.fetchall(connection, sql, params)
    if not rows:
        return None
    row = rows[0]
    started = Started(
        start.job, start.token, start.run_id, start.trigger, 1, start.holder, int(row[0]), 0, int(row[1]), start.lanes
    )
    if pieces is not None:
        started.claimed = (connection.alias, [found[2:] for found in rows if found[2] is not None])
    return started


def free_lease_start_sql(
    connection: Any, *, require_pending: bool, lanes: int = 1, claim: tuple[str, str] | None = None
) -> str:
    """The statement of ``_start_on_free_lease`` (bench/kick_latency.py runs it alone, as the database's floor).

    Parameters by name: ``Start.params()``. It answers the Attempt row's id and the Lease row's id. It starts
    only an idle job (no lane holds a token), in lane 0: every other start of a job with lanes decides under
    the Job row's lock.

    It takes the job's kick rows too (``take_kicks``, for this job): a worker that heard a kick's NOTIFY starts
    its run in this one round trip, without taking the kick first. A run that starts serves them; when none
    starts (the job is busy), they become the job's pending flag in the same commit, which the busy run sees as
    it ends. Kick rows are taken only under the Job row's lock (the ``EXISTS`` on ``locked``): a job without a
    row yet keeps them for the general path.

    Its commit does not wait for the WAL to reach the disk (``synchronous_commit`` off for this transaction
    only), which saves a flush on the path from a kick to its handler. Losing it in a database crash loses
    nothing: the kick rows it took come back, as does the pending flag, with the lease free, so the job runs
    again; and every later durable commit (the handler's first ``ctx.transaction()``, a mail's ledger row)
    flushes this one first, since the WAL is written in order.

    ``claim``: a first claim's WITH items and answer (``_running.CLAIMS_AT_START``); the statement then answers
    one row per row claimed (one with nulls when none was), each with the Attempt and Lease ids first.
    """
    quote = connection.ops.quote_name
    job_table, lease_table = quote(Job._meta.db_table), quote(Lease._meta.db_table)
    attempt_table, kick_table = quote(Attempt._meta.db_table), quote(KickRequest._meta.db_table)
    # Serving a kick: only while its flag is up (read again after the row lock is granted) or a kick row waits.
    pending = " AND (locked.pending_since IS NOT NULL OR EXISTS (SELECT 1 FROM kicks))" if require_pending else ""
    # With lanes, only an idle job: no other lane's run is active or left expired.
    idle = (
        f" AND NOT EXISTS (SELECT 1 FROM {lease_table} AS other WHERE other.job = locked.name "  # noqa: S608
        "AND other.token IS NOT NULL)"
        if lanes > 1
        else ""
    )
    return (
        f"WITH locked AS (SELECT name, pending_since FROM {job_table}, "  # noqa: S608  quoted names
        "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit "
        f"WHERE name = %(name)s FOR UPDATE OF {job_table}), "
        f"kicks AS (DELETE FROM {kick_table} WHERE id IN (SELECT id FROM {kick_table} WHERE job = %(name)s "
        "FOR UPDATE SKIP LOCKED) AND EXISTS (SELECT 1 FROM locked) RETURNING created), "
        f"taken AS (UPDATE {lease_table} AS lease SET token = %(token)s, holder = %(holder)s, run_id = %(run_id)s, "
        "attempt = 1, expires = statement_timestamp() + %(seconds)s * interval '1 second' "
        f"FROM locked WHERE lease.job = locked.name AND lease.lane = 0 AND lease.token IS NULL{pending}{idle} "
        "RETURNING lease.job, lease.id), "
        f"started AS (UPDATE {job_table} SET pending_since = NULL, lane_asked = NULL, last_run_id = %(run_id)s, "
        "last_trigger = %(trigger)s, last_started = statement_timestamp() "
        "WHERE name IN (SELECT job FROM taken) RETURNING name), "
        # Not started: the kicks taken become the flag (exclusive with ``started``: a row is updated once). A
        # data-modifying WITH item runs whether or not the answer reads it.
        f"marked AS (UPDATE {job_table} SET pending_since = (SELECT min(created) FROM kicks) "
        "WHERE name = %(name)s AND pending_since IS NULL AND EXISTS (SELECT 1 FROM kicks) "
        "AND NOT EXISTS (SELECT 1 FROM taken) RETURNING name), "
        f"recorded AS (INSERT INTO {attempt_table} (job, run_id, trigger, number, lane, holder, started, outcome, "
        "error_class, frames, message) SELECT name, %(run_id)s, %(trigger)s, 1, 0, %(holder)s, "
        "statement_timestamp(), %(outcome)s, '', '', '' FROM started RETURNING id)"
        + (
            f", {claim[0]} SELECT recorded.id, taken.id, {claim[1]}"
            if claim
            else " SELECT recorded.id, taken.id FROM recorded, taken"
        )
    )


def _start_under_job_lock(start: Start) -> Started | None:
    """The general start, in the caller's transaction: the Job row's lock, then a lease (any backend)."""
    name, trigger, run_id, attempt = start.job, start.trigger, start.run_id, 1
    _lock_job(name)
    take_kicks([name])  # kick rows no worker took yet: a run that starts serves them, else they make the flag
    flags: dict[str, Any] = dict(Job.objects.filter(name=name).values("pending_since", "lane_asked").first() or {})
    pending, asked = flags.get("pending_since") is not None, flags.get("lane_asked") is not None
    lanes = _lanes_of(name, start.lanes)
    previous = _pick_lane(name, lanes, serving=start.mark_pending or pending, asked=asked)
    if previous is None:
        # Busy: the job is pending (an active run serves the flag as it ends); an ask found no lane free: it lapses
        # (the next full claim asks again).
        if start.mark_pending and not pending:
            Job.objects.filter(name=name).update(pending_since=Now())
        if asked:
            Job.objects.filter(name=name).update(lane_asked=None)
        return None
    held = previous["token"] is not None
    resumed = bool(held and previous["run_id"] and previous["attempt"] < start.max_attempt)
    if resumed:
        run_id, attempt = previous["run_id"], previous["attempt"] + 1
        trigger = Job.objects.filter(name=name).values_list("last_trigger", flat=True).first() or trigger
    if held:
        # A frozen holder's fenced transactions end first, else the fence's lock below would wait for them.
        _end_frozen_fences(previous["id"])
        lock_fences(Lease.objects.filter(pk=previous["id"]))
    taken = Lease.objects.filter(Q(token__isnull=True) | Q(expires__lt=Now()), id=previous["id"]).update(
        token=start.token, holder=start.holder, run_id=run_id, attempt=attempt, expires=_expires(start.seconds)
    )
    if not taken:
        # The holder came back and renewed after all.
        if start.mark_pending:
            Job.objects.filter(name=name, pending_since__isnull=True).update(pending_since=Now())
        return None
    lane = previous["lane"]
    if held:
        mark_crashed(name, [previous["run_id"]])
        logger.warning("Lease taken over job=%s lane=%d run=%s resumed=%d", name, lane, previous["run_id"], resumed)
    if not resumed:
        # A run that starts now serves every kick and ask so far; one after this point makes one more run.
        Job.objects.filter(name=name).update(
            pending_since=None, lane_asked=None, last_run_id=run_id, last_trigger=trigger, last_started=Now()
        )
    # The attempt's row in the same commit: one commit less before the handler starts.
    first = Attempt.objects.create(
        job=name, run_id=run_id, trigger=trigger, number=attempt, lane=lane, holder=start.holder
    )
    return Started(name, start.token, run_id, trigger, attempt, start.holder, first.pk, lane, previous["id"], lanes)


def _pick_lane(name: str, lanes: int, *, serving: bool, asked: bool) -> dict[str, Any] | None:
    """Choose the lease a start takes, under the Job row's lock; None: the job is busy.

    A lane left expired first (its run is cut off and resumes); else a free lane when the job is idle and the
    start serves a kick, a fire or a hand (``serving``), or when a run asked for one more lane (``asked``).
    """
    leases = _lanes_rows(name, lanes)
    expired = [row for row in leases if row["token"] is not None and row["expired"]]
    if expired:
        return expired[0]
    free = [row for row in leases if row["token"] is None]
    idle = len(free) == len(leases)
    if free and ((serving and idle) or asked):
        return free[0]
    return None


def _lanes_rows(name: str, lanes: int) -> list[dict[str, Any]]:
    """Read the job's lanes ``0..lanes-1`` (making rows missing: a job that gained lanes), lowest first."""
    gone = ExpressionWrapper(Q(expires__lt=Now()), output_field=BooleanField())
    fields = ("id", "lane", "token", "run_id", "attempt", "expired")
    rows = list(Lease.objects.filter(job=name, lane__lt=lanes).annotate(expired=gone).values(*fields))
    if len(rows) < lanes:
        # A kick makes the Job row alone; without its Lease rows no run could ever take a lease.
        Lease.objects.bulk_create([Lease(job=name, lane=lane) for lane in range(lanes)], ignore_conflicts=True)
        rows = list(Lease.objects.filter(job=name, lane__lt=lanes).annotate(expired=gone).values(*fields))
    return sorted(rows, key=lambda row: row["lane"])


def _lanes_of(name: str, default: int = 1) -> int:
    """The lanes ``name`` declares (``default`` for a name no ``@cron`` declares, e.g. a removed job)."""
    return registry.get(name).lanes if name in registry else default


def _expires(seconds: float) -> Any:
    return Now() + Value(timedelta(seconds=seconds))


# -- the fence's lock, and a holder frozen inside a fenced transaction --------------------------------------
#
# PostgreSQL fences each ``ctx.transaction()`` with a shared advisory lock named after its lease, (FENCE_LOCK_CLASS,
# the Lease row's id): one per (job, lane), so one lane's changes never wait for another lane's transactions.
# The fence takes it in the transaction's first statement and checks the token in the next (``_fence``). Every
# path that changes or clears a token that a fenced transaction could still hold (a takeover, ``rotate``,
# ``end_run``, ``release``, ``release_all``) first takes the same lock exclusively in its own transaction
# (``lock_fences``), before its UPDATE, and keeps it until its commit. So a token change waits for every open
# fenced transaction of the old token (a stale attempt never commits after its replacement started), and a
# fenced transaction that asks for the lock meanwhile waits for the change's commit, after which its check
# finds the new token and refuses. A renewal changes only ``expires``, takes nothing and never waits. The free
# lease's one-statement start (``free_lease_start_sql``) sets a token over a null one, and no fenced
# transaction holds a null token (the path that cleared it waited for them all, and any later check finds
# null), so it takes nothing either. The lock replaced a ``FOR KEY SHARE`` row lock, which wrote the lease
# row's xmax (a dirtied page, WAL) in every fenced transaction: about a quarter millisecond of the server's.
#
# A stopped process (SIGSTOP, a long GC pause, a VM migration) never ends its fenced transaction, and the
# takeover would wait for as long as the process stays frozen, where a frozen holder may block its job for about
# a lease at most. The shared lock names the sessions that hold a lane's fence in pg_locks, so a takeover of an
# *expired* lease ends those sessions (pg_terminate_backend) before it asks for the exclusive lock: their
# transactions roll back,
# which the fence would have done at their commit anyway, since an attempt whose lease expired may not commit;
# the exclusive lock then waits only for those sessions to exit. A live holder keeps renewing, so its lease
# never expires and its transactions are never touched.

#: The fence's advisory lock's first key: "fabr" in ASCII, apart from an application's own keys.
FENCE_LOCK_CLASS = 0x66616272


def _fence_mark_sql(id_column: str) -> str:
    """The select-list expression the fence's lock statement adds on PostgreSQL (see above)."""
    return f"pg_advisory_xact_lock_shared({FENCE_LOCK_CLASS}, {id_column})"


def fence_lock_sql() -> str:
    """The fence's shared lock (PostgreSQL), the first statement of a fenced transaction. Parameter: the Lease id."""
    return f"SELECT {_fence_mark_sql('%s')}"


def lock_fences(leases: Any) -> list[int] | None:
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
        lock = f"SELECT held.id, pg_advisory_xact_lock({FENCE_LOCK_CLASS}, held.id) FROM ({sql}) AS held"  # noqa: S608
        cursor.execute(lock, params)
        return [row[0] for row in cursor.fetchall()]


def _end_frozen_fences(lease_id: int) -> int:
    """End the sessions holding fenced transactions under the lease ``lease_id`` if it expired; return how many.

    Runs in the takeover's transaction (under the Job row's lock), before ``lock_fences`` and its UPDATE.
    """
    connection = default_connection
    if connection.vendor != "postgresql":
        return 0
    lease = connection.ops.quote_name(Lease._meta.db_table)
    sql = (
        "SELECT count(pg_terminate_backend(locks.pid)) FROM pg_locks AS locks "  # noqa: S608  quoted name
        f"WHERE locks.locktype = 'advisory' AND locks.classid = {FENCE_LOCK_CLASS} "
        "AND locks.objid = %s::oid AND locks.objsubid = 2 AND locks.granted "
        "AND locks.pid <> pg_backend_pid() "
        # pg_locks is the whole server's: lease ids repeat in every database that has fabrika's tables.
        "AND locks.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        f"AND EXISTS (SELECT 1 FROM {lease} WHERE id = %s AND token IS NOT NULL AND expires < now())"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [lease_id, lease_id])
        row = cursor.fetchone()
    ended = int(row[0]) if row else 0
    if ended:
        logger.warning("Ended the fenced transactions of a frozen holder lease=%d sessions=%d", lease_id, ended)
    return ended


# -- during a run ---------------------------------------------------------------------------------------


def rotate(lease: Started, number: int, seconds: float) -> bool:
    """Give attempt ``number`` a token of its own and its Attempt row, so a stale earlier one is fenced off."""
    token = uuid.uuid4()
    with framework_write(), transaction.atomic():
        lock_fences(_mine(lease))  # a fenced transaction of the earlier attempt may still be open
        moved = _mine(lease).update(token=token, attempt=number, expires=_expires(seconds))
        if not moved:
            return False
        record = Attempt.objects.create(
            job=lease.job,
            run_id=lease.run_id,
            trigger=lease.trigger,
            number=number,
            lane=lease.lane,
            holder=lease.holder,
        )
    lease.token, lease.attempt, lease.attempt_id = token, number, record.pk
    return True


def renew(lease: Started, seconds: float) -> bool:
    """Extend the lease to ``seconds`` from now; False if it is no longer this run's (a database error raises)."""
    with framework_write():
        if default_connection.vendor == "mysql":
            return _renew_by_primary_key(lease, seconds)
        return bool(_mine(lease).update(expires=_expires(seconds)))


def _renew_by_primary_key(lease: Started, seconds: float) -> bool:
    """MariaDB/MySQL: the renewal through the primary key only (see ``_mine``), which the optimizer is told.

    Given both the id and the token, it may pick the token's unique index for the UPDATE, whose exclusive lock
    on that entry would wait for the fence's shared one: a renewal under an open ``ctx.transaction()`` would
    wait for the transaction's end, and a handler that ignores its deadline would block its own cut-off.
    """
    connection = default_connection
    table = connection.ops.quote_name(Lease._meta.db_table)
    token = Lease._meta.get_field("token").get_db_prep_value(lease.token, connection)
    sql = (
        f"UPDATE {table} FORCE INDEX (PRIMARY) SET expires = CURRENT_TIMESTAMP(6) + INTERVAL %s MICROSECOND "  # noqa: S608
        "WHERE id = %s AND token = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [int(seconds * 1_000_000), lease.lease_id, token])
        return cursor.rowcount == 1


def _mine(lease: Started) -> Any:
    """The lease's row while it is this attempt's (its token), found by its primary key.

    By the key, not the token: on MariaDB/MySQL a statement that found the row through the token's index would
    lock that index entry, which the fence holds shared for a whole ``ctx.transaction()``, so a renewal (which
    changes only ``expires``) would wait for it.
    """
    return Lease.objects.filter(pk=lease.lease_id, token=lease.token)


def end_attempt(lease: Started, outcome: str, fields: dict[str, str]) -> None:
    """Write how the lease's current attempt ended: its outcome, when, and ``fields`` (the error's class…)."""
    with framework_write():
        Attempt.objects.filter(pk=lease.attempt_id).update(outcome=outcome, finished=timezone.now(), **fields)


def end_run(lease: Started, outcome: str, *, again: bool, seconds: float, backlog: bool = True) -> bool:
    """End the run: start one more if ``again`` and the job was kicked meanwhile (True), else free the lease.

    Both happen under the Job row's lock, the one a starter takes, so a kick is either seen here or finds the
    lease free and starts its own run: never lost between the two. With lanes, a run whose last claim came back
    short (``backlog`` false: the queue is drained) leaves the kick to the job's other active runs, so an empty
    queue drains down to one run: the last one to end serves it.
    """
    summary: dict[str, Any] = {"last_outcome": outcome, "last_finished": Now()}
    if outcome == Outcome.SUCCEEDED:
        summary.update(last_success=Now(), failures_in_row=0)
    else:
        summary["failures_in_row"] = F("failures_in_row") + 1
    token, run_id = uuid.uuid4(), uuid.uuid4()
    with framework_write(), transaction.atomic():
        _lock_job(lease.job)
        mine = _mine(lease)
        lock_fences(mine)  # both ends below change the token
        # A stale attempt (its lease taken over, maybe by the same run resumed elsewhere) does not speak for the
        # job any more: only the lease's holder writes the summary (with one lane, only the job's latest run).
        latest = {"last_run_id": lease.run_id} if lease.lanes == 1 else {}
        Job.objects.filter(Exists(mine), name=lease.job, **latest).update(**summary)
        again = again and _is_pending(lease.job)
        if again and not backlog and lease.lanes > 1:
            others = Lease.objects.filter(lease_active(timezone.now()), job=lease.job).exclude(pk=lease.lease_id)
            again = not others.exists()
        if not again:
            freed = mine.update(**_FREE)
            if freed and outcome in CUT_OFF:
                # Cut off, and nobody took over: the job must not sit idle with its work left, so it is left pending.
                Job.objects.filter(name=lease.job, pending_since__isnull=True).update(pending_since=Now())
                notify(lease.job)  # PostgreSQL sends it when this transaction commits
            return False
        if not mine.update(token=token, run_id=run_id, attempt=1, expires=_expires(seconds)):
            return False
        Job.objects.filter(name=lease.job).update(
            pending_since=None, lane_asked=None, last_run_id=run_id, last_trigger="kick", last_started=Now()
        )
        record = Attempt.objects.create(
            job=lease.job, run_id=run_id, trigger="kick", number=1, lane=lease.lane, holder=lease.holder
        )
    lease.token, lease.run_id, lease.trigger, lease.attempt, lease.attempt_id = token, run_id, "kick", 1, record.pk
    return True


def mark_crashed(name: str, run_ids: list[uuid.UUID]) -> None:
    """Mark the attempts of these runs still ``running`` as ``crashed``: they never got to record their end."""
    Attempt.objects.filter(job=name, run_id__in=run_ids, outcome=Outcome.RUNNING).update(
        outcome=Outcome.CRASHED, finished=Now()
    )


def release(name: str, holder: str) -> bool:
    """Free the job's lease if ``holder`` holds it, marking its running attempt crashed; True if it did."""
    held = Lease.objects.filter(job=name, holder=holder, token__isnull=False)
    with framework_write(), transaction.atomic():
        locked = lock_fences(held)
        if locked is not None:
            held = held.filter(pk__in=locked)
        run_ids = [run for run in held.values_list("run_id", flat=True) if run is not None]
        freed = held.update(**_FREE)
        mark_crashed(name, run_ids)
    return bool(freed)


def release_all(holder_prefix: str) -> list[str]:
    """Free every lease held by a holder whose name starts with ``holder_prefix``; return their jobs."""
    with framework_write(), transaction.atomic():
        held = Lease.objects.filter(holder__startswith=holder_prefix, token__isnull=False)
        locked = lock_fences(held)
        if locked is not None:
            held = held.filter(pk__in=locked)
        names = list(held.values_list("job", flat=True))
        held.update(**_FREE)
    return names


def hold_lease_sql(connection: Any) -> str:
    """The fence's lock of the lease row (``_fence.LeaseFence.hold``). Parameters: the Lease row's id, token."""
    table = connection.ops.quote_name(Lease._meta.db_table)
    if connection.vendor == "sqlite":
        return f"UPDATE {table} SET token = token WHERE id = %s AND token = %s"  # noqa: S608  quoted name
    if connection.vendor == "mysql":
        # InnoDB's FOR KEY SHARE: a shared lock read through the unique token index alone (the index covers the
        # query, the id being its primary key, so the table's row is not locked). A takeover or release changes
        # the token and must lock that index entry, so it waits; a renewal changes only expires and never touches
        # the index, so it does not. The id is compared in the answer, not the WHERE, which would let the
        # optimizer pick the primary key and lock the row. A locking read is a current read at any isolation.
        return f"SELECT id = %s FROM {table} WHERE token = %s LOCK IN SHARE MODE"  # noqa: S608  quoted name
    if connection.vendor == "postgresql":
        # The token check alone, run after fence_lock_sql (see _fence.LeaseFence._begin_with): it answers the
        # transaction's isolation level, at which the check holds only under READ COMMITTED.
        return f"SELECT current_setting('transaction_isolation') FROM {table} WHERE id = %s AND token = %s"  # noqa: S608
    return f"SELECT 1 FROM {table} WHERE id = %s AND token = %s FOR UPDATE"  # noqa: S608  quoted name


def hold_lease_locked_sql(connection: Any) -> str:
    """PostgreSQL, above READ COMMITTED: the token check that also locks the row (see ``_fence``). Id, token."""
    table = connection.ops.quote_name(Lease._meta.db_table)
    return f"SELECT 1 FROM {table} WHERE id = %s AND token = %s FOR KEY SHARE"  # noqa: S608  quoted name


# -- the worker's scan and fires --------------------------------------------------------------------------


def take_fire(name: str, read: datetime | None, following: datetime) -> bool:
    """Move the job's next fire from the value ``read`` to ``following``; True if this call moved it.

    A compare-and-set: of all workers that read the same fire, exactly one owns it.
    """
    return bool(Job.objects.filter(name=name, next_fire=read).update(next_fire=following))


class StateReader:
    """The worker's scan: every served job's pending flag, next fire and lease, in one query."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        self._sql: tuple[str, Callable[[Any], datetime | None]] | None = None

    def read(self) -> dict[str, dict[str, Any]]:
        if self._sql is None:
            self._sql = _states_sql(len(self.names))
        sql, convert_fire = self._sql
        with default_connection.cursor() as cursor:
            cursor.execute(sql, self.names)
            rows = cursor.fetchall()
        return {
            name: {
                "pending": bool(pending),
                "asked": bool(asked),
                "next_fire": convert_fire(fire),
                "held": bool(active),
                "active": int(active or 0),
                "orphaned": int(orphaned or 0),
            }
            for name, pending, asked, fire, active, orphaned in rows
        }


def _states_sql(count: int) -> tuple[str, Callable[[Any], datetime | None]]:
    """The scan's query, built once per worker, and the converter of its ``next_fire`` column.

    A scan runs on every poll, and the ORM spent most of its time compiling the lease subqueries (a
    millisecond on SQLite, more than the query). This is the same query written out: one row per job
    with its pending flag, next fire, and whether its lease is active (``lease_active``) or was left
    expired (by the database's clock, ``Now()``), counted over the job's lanes. Parameters: the job names.
    """
    connection = default_connection
    quote = connection.ops.quote_name
    compiler = Job.objects.none().query.get_compiler(connection=connection)
    now, _ = compiler.compile(Now())
    job_table, lease_table = quote(Job._meta.db_table), quote(Lease._meta.db_table)
    names = ", ".join(["%s"] * count)
    sql = (
        "SELECT job.name, job.pending_since IS NOT NULL, job.lane_asked IS NOT NULL, job.next_fire, "  # noqa: S608
        f"SUM(CASE WHEN lease.token IS NOT NULL AND lease.expires > {now} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN lease.token IS NOT NULL AND lease.expires <= {now} THEN 1 ELSE 0 END) "
        f"FROM {job_table} AS job LEFT JOIN {lease_table} AS lease ON lease.job = job.name "
        f"WHERE job.name IN ({names}) GROUP BY job.name, job.pending_since, job.lane_asked, job.next_fire"
    )
    column = Job._meta.get_field("next_fire").get_col(Job._meta.db_table)
    converters = connection.ops.get_db_converters(column) + column.get_db_converters(connection)

    def convert_fire(value: Any) -> datetime | None:
        for converter in converters:
            value = converter(value, column, connection)
        return value

    return sql, convert_fire


# -- history --------------------------------------------------------------------------------------------


def prune_attempts(cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` attempt rows started before ``cutoff``, oldest first; return how many."""
    pks = list(Attempt.objects.filter(started__lt=cutoff).order_by("pk").values_list("pk", flat=True)[:batch])
    if not pks:
        return 0
    return int(Attempt.objects.filter(pk__in=pks).delete()[0])


# -- what operators read: health, metrics, the overview's charts ----------------------------------------------


def expired_leases(now: datetime) -> list[tuple[str, str, datetime | None]]:
    """Return (job, holder, expires) of each lease with a token whose expiry passed: held by nobody alive."""
    held = Lease.objects.filter(token__isnull=False, expires__lt=now).order_by("job")
    return [(job, holder, expires) for job, holder, expires in held.values_list("job", "holder", "expires")]


def pending_since(name: str) -> datetime | None:
    """Return when the job was first kicked without a run serving it yet (None: not pending)."""
    return Job.objects.filter(name=name).values_list("pending_since", flat=True).first()


def kicked_since(name: str) -> datetime | None:
    """Return when the job was first kicked without a run serving it yet: its pending flag, else its oldest kick
    row (a kick whose NOTIFY a worker heard is taken by the run's start itself, so it never became the flag)."""
    flag = pending_since(name)
    if flag is not None:
        return flag
    oldest: datetime | None = KickRequest.objects.filter(job=name).aggregate(oldest=Min("created"))["oldest"]
    return oldest


def first_attempt_started(name: str, holder: str, since: datetime) -> datetime | None:
    """Return the start of ``holder``'s first attempt of a run of ``name`` that started at ``since`` or later."""
    started = Attempt.objects.filter(job=name, holder=holder, number=1, started__gte=since).order_by("started")
    return started.values_list("started", flat=True).first()


def attempt_hours_sql(connection: Any, since: datetime, until: datetime) -> tuple[str, list[Any]]:
    """PostgreSQL's one statement of an hour's fold (``_history``; bench/overview.py explains it).

    Per job, hour (UTC) of the start, outcome and duration bucket (``_digest.bucket_sql``; null while running) of
    the attempts started in ``[since, until)``: how many. Through the index on ``started``; over every job:
    filtering by name costs more than the rows of jobs no longer registered.
    """
    table = connection.ops.quote_name(Attempt._meta.db_table)
    bucket = _digest.bucket_sql("greatest(extract(epoch FROM finished - started)::float8, 0)")
    sql = (
        f"SELECT job, date_trunc('hour', started AT TIME ZONE 'UTC'), outcome, "  # noqa: S608  quoted name
        f"CASE WHEN finished IS NULL OR outcome = %s THEN NULL ELSE {bucket} END, count(*) "
        f"FROM {table} WHERE started >= %s AND started < %s GROUP BY 1, 2, 3, 4"
    )
    return sql, [Outcome.RUNNING.value, since, until]


def attempt_ends(since: datetime, until: datetime) -> Any:
    """(job, started, finished, outcome) of the attempts started in ``[since, until)``, read in chunks."""
    started = Attempt.objects.filter(started__gte=since, started__lt=until)
    return started.values_list("job", "started", "finished", "outcome").iterator(chunk_size=2000)
