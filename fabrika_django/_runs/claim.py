"""The claim: lease up to ``limit`` due rows of a queue table for ``QueueQuerySet.claim()``, Django tasks'
queue included: one pipeline, sent one of two ways.

- PostgreSQL, the manager's own rows (``plain``) with a plain ``where`` on the table's own columns: one prepared
  statement in autocommit (``statement``), the lane ask folded in for a run in lanes.
- Anything else: the locking read in one transaction (compiled once for the manager's own rows, ``_CLAIM_READS``),
  then the lease's UPDATE (``_lease``); SQLite takes its write lock first. A rate-limited job's claim goes this
  way inside its token bucket's transaction (``ratelimit``).

Whichever way, the rows are the oldest due first in the queryset's claim order, rows another session holds are
skipped, each claimed row gets one more attempt, a new version and ``due`` moved by its backoff
(``backoff.row_backoffs``, the one definition), rows are decoded one by one (``statement.Decoder``: one that cannot
be is given up alone), and the claim's metric and a full claim's lane ask follow.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import EmptyResultSet
from django.db import connections, models, router, transaction
from django.db.models import Q
from django.utils import timezone

from .. import _channel, _metrics
from .._queuestate import max_attempts_of
from .._running import framework_write
from .._sql import cache_dict, prepared, quoted
from .._sql import rows as row_sql
from .._sql.rows import db_pks
from ..backoff import row_backoffs
from . import ratelimit
from .locked_read import compiled_claim, locked, read_locked, take_write_lock
from .statement import Claimable, Decoder, statement

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .._running import ActiveRun

#: The order a queue table's claim takes due rows in (a queryset may set its own claim order).
CLAIM_ORDER = ("due", "pk")


def claim(of: Claimable, using: str, run: ActiveRun, where: Q | None, limit: int) -> list[Any]:
    """Claim for ``run`` up to ``limit`` due rows of ``of`` on ``using``, in one statement where it can."""
    connection = connections[using]
    run.claimed.add((using, of.rows.model._meta.label))  # a requeue of this table kicks the job (_claimers)
    if run.job.rate_limit is not None:
        return _claim_limited(of, using, connection, run, where, limit)
    now = run.now()
    claimed = _claim_in_one(of, using, connection, run, now, where, limit)
    if claimed is not None:
        return claimed
    with framework_write(), transaction.atomic(using=using):
        found = _claim_rows(of, using, connection, now, where, limit)
        if found:
            _lease(of.rows.model, using, found, run, now)
    _metrics.observe_claim(run.job.name, len(found))
    _note_backlog(run, len(found), limit)
    return found


def _claim_limited(
    of: Claimable, using: str, connection: BaseDatabaseWrapper, run: ActiveRun, where: Q | None, limit: int
) -> list[Any]:
    """A rate-limited job's claim: the long way, inside its token bucket's transaction (``ratelimit``)."""
    asked = [limit]

    def take(allowed: int, now: datetime) -> list[Any]:
        asked[0] = allowed
        # The bucket's instant, so claims and tokens share one clock; a test kit's clock stays the rows' own.
        at = now if run.clock is timezone.now else run.now()
        # Inside the bucket's transaction: on the same database one commit for both, without a savepoint.
        with transaction.atomic(using=using, savepoint=False):
            found = _claim_rows(of, using, connection, at, where, allowed)
            if found:
                _lease(of.rows.model, using, found, run, at)
        return found

    def has_due() -> bool:
        return bool(of.query(using, run.now(), where).exists())

    found = ratelimit.claim(run, limit, take, has_due)
    _metrics.observe_claim(run.job.name, len(found))
    _note_backlog(run, len(found), asked[0])  # a claim the rate cut short still says the backlog is there
    return found


def _claim_rows(
    of: Claimable, using: str, connection: BaseDatabaseWrapper, now: datetime, where: Q | None, limit: int
) -> list[Any]:
    """Read and lock the claim's rows, in the claim's transaction; rows that cannot be decoded are given up."""
    model = of.rows.model
    if not connection.features.has_select_for_update:
        take_write_lock(model, connection)
    try:
        compiled = compiled_claim(of, using, connection, now, where, limit)
    except EmptyResultSet:  # a where no row can match (``n__in=[]``)
        return []
    if compiled is None:  # the ORM's own objects (an annotated or related queryset)
        return read_locked(locked(of.query(using, now, where), connection)[:limit], of.order, connection)
    sql, params, decoder = compiled
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    rows, undecodable = decoder.rows(using, found)
    if undecodable:
        of.give_up(using, undecodable)
    return rows


def _note_backlog(run: ActiveRun, count: int, limit: int) -> None:
    """Tell the run what its claim said about the backlog; a full claim asks for one more lane ."""
    demand = run.state.demand if run.state is not None else None
    if demand is not None and demand.claimed(count, limit):
        from .pending import ask_for_lane  # on use: it imports the models, whose QueueModel imports this module

        ask_for_lane(run.job.name, run.job.lanes)


# On PostgreSQL a plain claim is one statement in autocommit, run as a server-side prepared statement
# (``_sql.prepared``): the locking read, the lease's UPDATE and, for a run in lanes, the lane ask with its NOTIFY,
# gated on the claim being full. The long way is four round trips (BEGIN, the read, the UPDATE, COMMIT) and one
# more for the ask; after each one the lane needs the interpreter lock back, which every lane of the worker shares
# (bench/lanes.py).


def _claim_in_one(
    of: Claimable,
    using: str,
    connection: BaseDatabaseWrapper,
    run: ActiveRun,
    now: datetime,
    where: Q | None,
    limit: int,
) -> list[Any] | None:
    """Claim in one statement where it can (``statement``); None where the claim must go the long way.

    Does what the claim does after its refusals: the metric, the run's note of a full claim and, for a full
    claim of a run in lanes, the lane ask (inside the statement when the job's table is on the same database).
    """
    if connection.vendor != "postgresql" or not of.plain:
        return None
    demand = run.state.demand if run.state is not None else None
    folds_ask = demand is not None and demand.lanes > 1 and _job_alias() == using
    ask = None
    if folds_ask:
        from .pending import lane_ask  # on use: it imports the models, whose QueueModel imports this module

        ask = lane_ask(using, run.job.name, run.job.lanes)
    model = of.rows.model
    built = statement(model, connection, of.order, where, ask=ask)
    if built is None:
        return None
    params = claim_params(model, connection, run.job.period, now, limit)
    if folds_ask:
        params.update(channel=_channel.CHANNEL, job=run.job.name)
    with framework_write(), transaction.mark_for_rollback_on_error(using):
        found = prepared.fetchall(connection, built.sql, {**built.fixed, **params})
    claimed = claimed_rows(of, using, built.decode, found, dues_of(model, run.job.period, now))
    _metrics.observe_claim(run.job.name, len(found))
    if demand is not None and demand.claimed(len(found), limit) and not folds_ask:
        from .pending import ask_for_lane  # as above

        ask_for_lane(run.job.name, run.job.lanes)
    return claimed


def claim_params(
    model: type[models.Model], connection: BaseDatabaseWrapper, period: Any, now: datetime, limit: int
) -> dict[str, Any]:
    """The parameters of a claim's statement that change: ``now``, ``limit``, each attempt's backoff in microseconds
    ``backoffs`` and the array's ``last`` index (the instants they give: ``dues_of``)."""
    due: Any = model._meta.get_field("due")  # a concrete field: QueueModel's
    max_attempts = max_attempts_of(model)
    microseconds = backoff_microseconds(period, max_attempts)
    return {
        "now": due.get_db_prep_value(now, connection, prepared=False),
        "limit": limit,
        "backoffs": microseconds,
        "last": len(microseconds) - 1,
    }


def dues_of(model: type[models.Model], period: Any, now: datetime) -> list[datetime]:
    """The instants a claim at ``now`` makes its rows due again at, by attempt (the backoff's)."""
    return [now + backoff for backoff in backoffs(period, max_attempts_of(model))]


def claimed_rows(
    of: Claimable, using: str, decoder: Decoder, found: list[tuple[Any, ...]], dues: list[datetime]
) -> list[Any]:
    """The rows a claim's statement answered, each with the ``due`` it wrote; those undecodable given up."""
    rows, undecodable = decoder.rows(using, found)
    if undecodable:
        with framework_write():
            of.give_up(using, undecodable)
    last = len(dues) - 1
    for row in rows:
        row.due = dues[min(row.attempts - 1, last)]
    return rows


def _job_alias() -> str:
    """The database of the jobs' tables, where a lane ask writes."""
    from ..models._tables import Job  # on use, as above

    return router.db_for_write(Job)


#: By (job period, max_attempts): ``row_backoffs``.
_BACKOFFS: dict[tuple[Any, int], list[Any]] = cache_dict()


def backoffs(period: Any, max_attempts: int) -> list[Any]:
    """``backoff.row_backoffs``, kept by its terms: every claim of a job asks again."""
    key = (period, max_attempts)
    if key not in _BACKOFFS:
        _BACKOFFS[key] = row_backoffs(period, max_attempts)
    return _BACKOFFS[key]


_BACKOFF_MICROSECONDS: dict[tuple[Any, int], list[int]] = cache_dict()


def backoff_microseconds(period: Any, max_attempts: int) -> list[int]:
    """``backoffs`` in whole microseconds (a timedelta's own resolution), as the claim's statement adds them."""
    key = (period, max_attempts)
    if key not in _BACKOFF_MICROSECONDS:
        _BACKOFF_MICROSECONDS[key] = [
            backoff // timedelta(microseconds=1) for backoff in backoffs(period, max_attempts)
        ]
    return _BACKOFF_MICROSECONDS[key]


# The statements below are claim's and finish's hot path: they are written here, not by the ORM, because
# compiling an UPDATE (and, for a batch, a condition on 500 pks) cost more than running it. They write exactly
# what QuerySet.update() would; anything unusual (an expression, a parent model's field) goes to the ORM.


def _lease(model: type[models.Model], using: str, rows: list[Any], run: ActiveRun, now: datetime) -> None:
    """Add an attempt, a version and the backoff to every row in one UPDATE, and mirror it on the objects."""
    dues = dues_of(model, run.job.period, now)
    last = len(dues) - 1
    due_by_attempts = {attempts: dues[min(attempts, last)] for attempts in {row.attempts for row in rows}}
    connection = connections[using]
    due_field: Any = model._meta.get_field("due")
    prepare = due_field.get_db_prep_save
    table, attempts_c, due_c, version_c, pk_c = quoted(connection, model, "attempts", "due", "version", "pk")
    if len(due_by_attempts) == 1:
        due_sql, params = "%s", [prepare(next(iter(due_by_attempts.values())), connection)]
    else:
        # The rows are locked (SQLite: the database is), so their attempts are still what was read.
        due_sql = row_sql.due_by_attempts(attempts_c, len(due_by_attempts))
        params = [value for attempts, due in due_by_attempts.items() for value in (attempts, prepare(due, connection))]
    in_sql, in_params = row_sql.pks_in(connection, pk_c, db_pks(model, connection, [row.pk for row in rows]))
    sql = row_sql.lease(table, due_c, attempts_c, version_c, due_sql, in_sql)
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(sql, [*params, *in_params])
    for row in rows:
        row.due = due_by_attempts[row.attempts]
        row.attempts += 1
        row.version += 1
