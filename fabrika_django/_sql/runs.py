"""The statements of a job's run state: kick rows and the pending flag, the start on a free lease, the Job
row's lock, the worker's scan and the history's hourly fold.

Each takes the connection it runs on and answers its SQL; parameters are named in its docstring.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..conf import settings
from . import table

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


def bookkeeping_commit() -> str:
    """A FROM item that lets this transaction's commit skip the WAL flush, where the settings allow it; else "".

    The commits that start a run, take kicks and start tasks count attempts. By default they are durable: a
    database crash never forgets an attempt that ran, so a task that crashes the server still reaches its
    ``max_attempts``. ``FABRIKA["ASYNC_BOOKKEEPING_COMMITS"] = True`` trades that for a flush less on the way
    from a kick to its handler (``synchronous_commit`` off for that transaction only): a crash within the WAL
    writer's delay may then rerun a job or task without counting the attempt. Read as the statement is built:
    the start's and take_kicks' at each call, the tasks' claim once per ``_sql.cache`` (emptied when settings
    change).
    """
    if not settings.ASYNC_BOOKKEEPING_COMMITS:
        return ""
    return ", (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"


def job_lock_bounded(connection: BaseDatabaseWrapper) -> str:
    """PostgreSQL: lock the Job row and bound how long this transaction may sit idle (``_runs.rows``).

    Parameters: the bound in milliseconds (text), the job's name. Answers a row when the job has one.
    """
    return (
        "SELECT set_config('idle_in_transaction_session_timeout', %s, true) "  # noqa: S608  quoted name
        f"FROM {table(connection, 'Job')} WHERE name = %s FOR UPDATE"
    )


def kick_insert(connection: BaseDatabaseWrapper) -> str:
    """A kick row on the databases other than PostgreSQL. Parameters: the job's name, the time."""
    return f"INSERT INTO {table(connection, 'KickRequest')} (job, created) VALUES (%s, %s)"  # noqa: S608  quoted name


def write_lock(connection: BaseDatabaseWrapper, quoted_table: str, quoted_column: str) -> str:
    """SQLite: a write that matches nothing, which takes the database write lock in the open transaction."""
    return f"UPDATE {quoted_table} SET {quoted_column} = {quoted_column} WHERE 1 = 0"  # noqa: S608  quoted names


def mark_pending_plain(connection: BaseDatabaseWrapper) -> str:
    """``mark_pending`` on the databases other than PostgreSQL: the flag alone. Parameters: the time, the name."""
    return (
        f"UPDATE {table(connection, 'Job')} SET pending_since = %s "  # noqa: S608  quoted name
        "WHERE name = %s AND pending_since IS NULL"
    )


#: PostgreSQL: wake the listening workers. Parameters: the channel, the payload (a job's name).
NOTIFY = "SELECT pg_notify(%s, %s)"


def kick(connection: BaseDatabaseWrapper) -> str:
    """PostgreSQL's kick: the row and the NOTIFY in one statement (bench/kick_latency.py runs it alone).

    Parameters: name, channel. ``kick_cte`` is the same row as a CTE, for a statement that inserts a queue row.
    """
    return f"WITH {kick_cte(connection)} SELECT pg_notify(%(channel)s, %(name)s)"


def kick_cte(connection: BaseDatabaseWrapper) -> str:
    """A ``WITH`` item that inserts a kick of ``%(name)s`` (PostgreSQL); the statement adds the NOTIFY."""
    kicks = table(connection, "KickRequest")
    return f"kick AS (INSERT INTO {kicks} (job, created) VALUES (%(name)s, statement_timestamp()))"  # noqa: S608


def take_kicks(connection: BaseDatabaseWrapper) -> str:
    """PostgreSQL's ``take_kicks`` in one statement: the jobs taken, and those of them with a ``Job`` row.

    Its commit is a bookkeeping commit (``bookkeeping_commit``): lost in a database crash, it comes back as the
    kick rows it deleted, which are taken again.
    """
    kicks, jobs = table(connection, "KickRequest"), table(connection, "Job")
    return (
        f"WITH taken AS (DELETE FROM {kicks} WHERE id IN (SELECT id FROM {kicks} "  # noqa: S608  quoted names
        "WHERE job = ANY(%(names)s) FOR UPDATE SKIP LOCKED) RETURNING job, created), "
        "firsts AS (SELECT job, min(created) AS created FROM taken GROUP BY job), "
        f"marked AS (UPDATE {jobs} AS job SET pending_since = firsts.created FROM firsts{bookkeeping_commit()} "
        "WHERE job.name = firsts.job AND job.pending_since IS NULL RETURNING job.name) "
        f"SELECT array_agg(firsts.job), array_agg(firsts.job) FILTER (WHERE EXISTS "
        f"(SELECT 1 FROM {jobs} WHERE name = firsts.job)) FROM firsts"
    )


def mark_pending(connection: BaseDatabaseWrapper) -> str:
    """PostgreSQL's ``mark_pending``: the flag and the NOTIFY in one round trip. Parameters: name, channel.

    The EXISTS reads the row as it was before the UPDATE, which tells "already pending" (nothing to do) from
    "no row yet".
    """
    jobs = table(connection, "Job")
    return (
        f"WITH k AS (UPDATE {jobs} SET pending_since = now() "  # noqa: S608  quoted name
        "WHERE name = %(name)s AND pending_since IS NULL RETURNING name) "
        f"SELECT count(pg_notify(%(channel)s, k.name)), EXISTS (SELECT 1 FROM {jobs} WHERE name = %(name)s) FROM k"
    )


def free_lease_start(
    connection: BaseDatabaseWrapper, *, require_pending: bool, lanes: int = 1, claim: tuple[str, str] | None = None
) -> str:
    """The start of a run on a free lease in one statement (``_runs.start``; bench/kick_latency.py runs it alone,
    as the database's floor).

    Parameters by name: ``Start.params()``. It answers the Attempt row's id and the Lease row's id. It starts
    only an idle job (no lane holds a token), in lane 0: every other start of a job with lanes decides under
    the Job row's lock.

    It takes the job's kick rows too (``take_kicks``, for this job): a worker that heard a kick's NOTIFY starts
    its run in this one round trip, without taking the kick first. A run that starts serves them; when none
    starts (the job is busy), they become the job's pending flag in the same commit, which the busy run sees as
    it ends. Kick rows are taken only under the Job row's lock (the ``EXISTS`` on ``locked``): a job without a
    row yet keeps them for the general path.

    Its commit counts the run's first attempt, so it waits for the WAL flush like any other commit unless
    ``ASYNC_BOOKKEEPING_COMMITS`` says otherwise (``bookkeeping_commit``).

    ``claim``: a first claim's WITH items and answer (``_running.CLAIMS_AT_START``); the statement then answers
    one row per row claimed (one with nulls when none was), each with the Attempt and Lease ids first.
    """
    job_table, lease_table = table(connection, "Job"), table(connection, "Lease")
    attempt_table, kick_table = table(connection, "Attempt"), table(connection, "KickRequest")
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
        f"WITH locked AS (SELECT name, pending_since FROM {job_table}{bookkeeping_commit()} "  # noqa: S608
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


def job_states(connection: BaseDatabaseWrapper, count: int, now: str) -> str:
    """The worker's scan (``_runs.reads.StateReader``): per job its pending flag, lane ask, next fire, and its
    lanes' leases counted active (a token, ``expires`` ahead) and left expired, by the database's clock ``now``
    (an SQL expression). Parameters: the ``count`` job names."""
    names = ", ".join(["%s"] * count)
    return (
        "SELECT job.name, job.pending_since IS NOT NULL, job.lane_asked IS NOT NULL, job.next_fire, "  # noqa: S608
        f"SUM(CASE WHEN lease.token IS NOT NULL AND lease.expires > {now} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN lease.token IS NOT NULL AND lease.expires <= {now} THEN 1 ELSE 0 END) "
        f"FROM {table(connection, 'Job')} AS job LEFT JOIN {table(connection, 'Lease')} AS lease "
        f"ON lease.job = job.name WHERE job.name IN ({names}) "
        "GROUP BY job.name, job.pending_since, job.lane_asked, job.next_fire"
    )


def attempt_hours(connection: BaseDatabaseWrapper, bucket: str) -> str:
    """PostgreSQL's one statement of an hour's fold (``_history``; bench/overview.py explains it).

    Per job, hour (UTC) of the start, outcome and duration bucket (``bucket``, an SQL expression; null while
    running) of the attempts started in ``[since, until)``: how many. Parameters: the running outcome, since,
    until.
    """
    return (
        f"SELECT job, date_trunc('hour', started AT TIME ZONE 'UTC'), outcome, "  # noqa: S608  quoted name
        f"CASE WHEN finished IS NULL OR outcome = %s THEN NULL ELSE {bucket} END, count(*) "
        f"FROM {table(connection, 'Attempt')} WHERE started >= %s AND started < %s GROUP BY 1, 2, 3, 4"
    )
