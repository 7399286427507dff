"""The claim: lease up to ``limit`` due rows of a queue table, for ``QueueQuerySet.claim()`` and the tasks' queue.

One pipeline, three ways to send it, chosen by what the rows are and where they live:

- PostgreSQL, the manager's own rows in the default claim order, no ``where``: one prepared statement in
  autocommit (``_claim_in_one``), the lane ask folded in.
- Any database with row locks, the manager's own rows: the locking read compiled once (``_compiled_claim``),
  then the lease's UPDATE (``_lease``), in one transaction.
- Anything else: the ORM's locking read, compiled each time, then the same UPDATE.

Whichever way, the rows are the oldest due first in the queryset's claim order, rows another session holds are
skipped, each claimed row gets one more attempt, a new version and ``due`` moved by its backoff
(``backoff.row_backoffs``, the one definition), and the claim's metric and a full claim's lane ask follow.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, models, router, transaction
from django.db.models import Q
from django.utils import timezone

from .. import _channel, _metrics
from .._queuestate import max_attempts_of, state_sql
from .._running import framework_write
from .._sql import SAMPLE_NOW, cache_dict, prepared, quoted
from .._sql import claim as claim_sql
from .._sql import rows as row_sql
from .._sql.rows import db_pks
from ..backoff import row_backoffs
from . import ratelimit

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .._running import ActiveRun

#: The order a queue table's claim takes due rows in (a queryset may set its own ``_claim_order``).
CLAIM_ORDER = ("due", "pk")


def claim(rows: Any, using: str, run: ActiveRun, where: Q | None, limit: int, *, plain: bool) -> list[Any]:
    """Claim for ``run`` up to ``limit`` due rows of the queryset ``rows`` on ``using``, in one of the three ways.

    ``plain``: ``rows`` is its model's whole table as the manager gives it (``queues._is_plain``), so its read
    may be compiled once.
    """
    connection = connections[using]
    run.claimed.add((using, rows.model._meta.label))  # a requeue of this table kicks the job (_claimers)
    if run.job.rate_limit is not None:
        return _claim_limited(rows, using, connection, run, where, limit, plain)
    now = run.now()
    claimed = _claim_in_one(rows, using, connection, run, now, where, limit, plain)
    if claimed is not None:
        return claimed
    with framework_write(), transaction.atomic(using=using):
        found = _claim_rows(rows, using, connection, now, where, limit, plain)
        if found:
            _lease(rows.model, using, found, run, now)
    _metrics.observe_claim(run.job.name, len(found))
    _note_backlog(run, len(found), limit)
    return found


def _claim_limited(
    rows: Any, using: str, connection: BaseDatabaseWrapper, run: ActiveRun, where: Q | None, limit: int, plain: bool
) -> list[Any]:
    """A rate-limited job's claim: the long way, inside its token bucket's transaction (``ratelimit``)."""
    asked = [limit]

    def take(allowed: int, now: datetime) -> list[Any]:
        asked[0] = allowed
        # The bucket's instant, so claims and tokens share one clock; a test kit's clock stays the rows' own.
        at = now if run.clock is timezone.now else run.now()
        # Inside the bucket's transaction: on the same database one commit for both, without a savepoint.
        with transaction.atomic(using=using, savepoint=False):
            found = _claim_rows(rows, using, connection, at, where, allowed, plain)
            if found:
                _lease(rows.model, using, found, run, at)
        return found

    def has_due() -> bool:
        return bool(rows._claim_query(using, run.now(), where).exists())

    found = ratelimit.claim(run, limit, take, has_due)
    _metrics.observe_claim(run.job.name, len(found))
    _note_backlog(run, len(found), asked[0])  # a claim the rate cut short still says the backlog is there
    return found


def _claim_rows(
    rows: Any, using: str, connection: BaseDatabaseWrapper, now: datetime, where: Q | None, limit: int, plain: bool
) -> list[Any]:
    """Read and lock the claim's rows, in the claim's transaction."""
    compiled = _compiled_claim(rows, using, connection, now, where, limit, plain)
    if compiled is not None:
        sql, params, names = compiled
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            found = cursor.fetchall()
        return [rows.model.from_db(using, names, values) for values in found]
    return _read_locked(_locked(rows._claim_query(using, now, where), connection)[:limit], connection)


def _note_backlog(run: ActiveRun, count: int, limit: int) -> None:
    """Tell the run what its claim said about the backlog; a full claim asks for one more lane ."""
    demand = run.state.demand if run.state is not None else None
    if demand is not None and demand.claimed(count, limit):
        from .pending import ask_for_lane  # on use: it imports the models, whose QueueModel imports this module

        ask_for_lane(run.job.name, run.job.lanes)


# On PostgreSQL a plain claim (the manager's own rows, no ``where``, the default claim order) is one statement in
# autocommit, run as a server-side prepared statement (``_sql.prepared``): the locking read, the lease's UPDATE and,
# for a run in lanes, the lane ask with its NOTIFY, gated on the claim being full. The long way is four round
# trips (BEGIN, the read, the UPDATE, COMMIT) and one more for the ask; after each one the lane needs the
# interpreter lock back, which every lane of the worker shares (bench/lanes.py).
# A claimed row's new ``due`` is one of a few instants the worker computes (``row_backoff`` by the row's attempts,
# the same for every count past the backoff's cap) and sends as an array, from which the UPDATE picks by the
# attempts it finds: the object gets exactly the instant written, without reading a datetime back.

#: By (model, alias, whether the statement carries the lane ask): the statement and the names of the fields its
#: answer's columns are, in order; None where the claim goes the long way (a field read through a converter, a
#: parent table).
_ONE_STATEMENT: dict[tuple[Any, ...], tuple[str, list[str]] | None] = cache_dict()
#: By (job period, max_attempts): ``row_backoffs``.
_BACKOFFS: dict[tuple[Any, int], list[Any]] = cache_dict()


def _claim_in_one(
    rows: Any,
    using: str,
    connection: BaseDatabaseWrapper,
    run: ActiveRun,
    now: datetime,
    where: Q | None,
    limit: int,
    plain: bool,
) -> list[Any] | None:
    """Claim in one statement where it can (see above); None where the claim must go the long way.

    Does what the claim does after its refusals: the metric, the run's note of a full claim and, for a full
    claim of a run in lanes, the lane ask (inside the statement when the job's table is on the same database).
    """
    if where is not None or connection.vendor != "postgresql" or not plain or rows._claim_order != CLAIM_ORDER:
        return None
    model = rows.model
    demand = run.state.demand if run.state is not None else None
    folds_ask = demand is not None and demand.lanes > 1 and _job_alias() == using
    key = (model, using, folds_ask)
    if key not in _ONE_STATEMENT:
        _ONE_STATEMENT[key] = _one_statement(model, connection, with_ask=folds_ask)
    built = _ONE_STATEMENT[key]
    if built is None:
        return None
    sql, names = built
    max_attempts = max_attempts_of(model)
    prepare = model._meta.get_field("due").get_db_prep_save
    dues = [now + backoff for backoff in backoffs(run.job.period, max_attempts)]
    last = len(dues) - 1
    params: list[Any] = [
        max_attempts,
        prepare(now, connection),
        limit,
        [prepare(due, connection) for due in dues],
        last,
    ]
    if folds_ask:
        from .pending import lane_ask  # on use: it imports the models, whose QueueModel imports this module

        params += [*lane_ask(using, run.job.name, run.job.lanes)[1], limit, _channel.CHANNEL, run.job.name]
    with framework_write(), transaction.mark_for_rollback_on_error(using):
        found = prepared.fetchall(connection, sql, params)
    claimed = [model.from_db(using, names, values) for values in found]
    for row in claimed:
        row.due = dues[min(row.attempts - 1, last)]
    _metrics.observe_claim(run.job.name, len(claimed))
    if demand is not None and demand.claimed(len(claimed), limit) and not folds_ask:
        from .pending import ask_for_lane  # as above

        ask_for_lane(run.job.name, run.job.lanes)
    return claimed


def _job_alias() -> str:
    """The database of the jobs' tables, where a lane ask writes."""
    from ..models._tables import Job  # on use, as above

    return router.db_for_write(Job)


def backoffs(period: Any, max_attempts: int) -> list[Any]:
    """``backoff.row_backoffs``, kept by its terms: every claim of a job asks again."""
    key = (period, max_attempts)
    if key not in _BACKOFFS:
        _BACKOFFS[key] = row_backoffs(period, max_attempts)
    return _BACKOFFS[key]


def _one_statement(
    model: type[models.Model], connection: BaseDatabaseWrapper, *, with_ask: bool
) -> tuple[str, list[str]] | None:
    """Build the one-statement claim of ``model`` (see above), or None where it must go the long way.

    Its parameters, in order: "due now"'s max_attempts and now, the limit, the array of new ``due`` instants and
    its last index; with the lane ask, the ask's own parameters, the limit again, the channel and the job's name.
    """
    opts = model._meta
    if opts.parents:
        return None
    fields = [field for field in opts.concrete_fields if field.attname != "due"]
    for field in fields:
        column = field.get_col(opts.db_table)
        if connection.ops.get_db_converters(column) + field.get_db_converters(connection):
            return None
    condition, values = state_sql(model, "due_now", SAMPLE_NOW, connection)
    # The condition's parameters must be max_attempts then now, as the claim sends them: else the long way.
    if values != [max_attempts_of(model), SAMPLE_NOW]:
        return None
    ask = None
    if with_ask:
        # The ask's UPDATE as ask_for_lane sends it (its WHERE in parentheses), written only for a full claim.
        from .pending import lane_ask  # as above

        ask = lane_ask(connection.alias, "", 2)[0]
    names = quoted(connection, model, "due", "attempts", "version", "pk")
    sql = claim_sql.in_one(connection, names, fields, condition, ask)
    return sql, [field.attname for field in fields]


def _locked(rows: Any, connection: BaseDatabaseWrapper) -> Any:
    """Lock the rows a claim reads, skipping those another session holds, as far as the backend can.

    Without row locks (SQLite) the claim takes the database write lock before it reads, so a second
    claimer waits for the first to commit instead of reading the same rows.
    """
    features = connection.features
    if features.has_select_for_update_skip_locked:
        # OF keeps a where=Q(...) across a relation from locking the related rows too.
        of = ("self",) if features.has_select_for_update_of else ()
        return rows.select_for_update(skip_locked=True, of=of)
    if features.has_select_for_update:
        return rows.select_for_update()  # correct, though a claimer then waits for rows another holds
    _take_write_lock(rows.model, connection)
    return rows


def _read_locked(rows: Any, connection: BaseDatabaseWrapper) -> list[Any]:
    """Read the claim's rows; on MariaDB/MySQL through the index in claim order, named in the statement.

    InnoDB locks every row a locking read examines, and keeps the lock on each row that matched even when
    ORDER BY ... LIMIT drops it after a sort. With a backlog (most rows due) the optimizer prefers a table scan
    and a filesort, so one claim would lock the whole backlog and every other claimer would skip it all.
    Walking the index in claim's order reads only the rows it returns (and dead ones it passes).
    """
    if connection.vendor != "mysql" or _claim_index(rows.model, type(rows)._claim_order) is None:
        return list(rows)
    return list(rows.model._base_manager.raw(*_locking_read(rows, connection), using=rows.db))


def _locking_read(rows: Any, connection: BaseDatabaseWrapper) -> tuple[str, tuple[Any, ...]]:
    """The claim's locking read as SQL and parameters (on MariaDB/MySQL with its index named: ``_read_locked``)."""
    sql, params = rows.query.get_compiler(connection=connection).as_sql()
    return _hinted(sql, rows, connection), tuple(params)


def _hinted(sql: str, rows: Any, connection: BaseDatabaseWrapper) -> str:
    """On MariaDB/MySQL, name the index in claim order in the claim's read (see ``_read_locked``)."""
    model = rows.model
    index = _claim_index(model, type(rows)._claim_order) if connection.vendor == "mysql" else None
    if index is None:
        return sql
    return claim_sql.force_index(sql, connection.ops.quote_name(model._meta.db_table), connection.ops.quote_name(index))


# The claim's locking read as compiled once, by what decides its text: the queryset's class (its claim order and
# filters), the model and its max_attempts, the database and the limit; with the position of ``now`` among its
# parameters. Compiling it took about a millisecond of the worker's Python a claim (as long as the rest of a
# claim of ten rows), under the interpreter lock every lane of the process shares. A claim with ``where``,
# or on a queryset that is not the manager's own (a filter, an annotation...), compiles every time.
# Its rows are made as the ORM makes them (``Model.from_db`` with the selected fields' names), fetched at once:
# a model whose selected fields convert values read from the database always goes the long way.
_CLAIM_READS: dict[tuple[Any, ...], tuple[str, tuple[Any, ...], int, list[str]] | None] = cache_dict()


def _compiled_claim(
    rows: Any,
    using: str,
    connection: BaseDatabaseWrapper,
    now: datetime,
    where: Q | None,
    limit: int,
    plain: bool,
) -> tuple[str, list[Any], list[str]] | None:
    """Return the claim's locking read for ``now`` from the cache, or None where it must be compiled."""
    # SQLite takes its write lock in _locked (a statement), not in the read: it always goes the long way.
    if where is not None or not connection.features.has_select_for_update or not plain:
        return None
    model = rows.model
    key = (type(rows), model, max_attempts_of(model), using, connection.vendor, limit)
    if key not in _CLAIM_READS:
        _CLAIM_READS[key] = _compile_claim(rows, using, connection, now, limit)
    compiled = _CLAIM_READS[key]
    if compiled is None:
        return None
    sql, params, at, names = compiled
    values = list(params)
    values[at] = _db_now(model, connection, now)
    return sql, values, names


def _compile_claim(
    rows: Any, using: str, connection: BaseDatabaseWrapper, now: datetime, limit: int
) -> tuple[str, tuple[Any, ...], int, list[str]] | None:
    """Compile the claim's locking read; None unless ``now`` is among its parameters exactly once and every
    column it reads is a field of the model read as it comes (no converter)."""
    queryset = _locked(rows._claim_query(using, now, None), connection)[:limit]
    compiler = queryset.query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()
    columns = [expression for expression, _sql, _alias in compiler.select]
    if compiler.annotation_col_map or compiler.get_converters(columns):
        return None
    read = [getattr(getattr(column, "target", None), "attname", None) for column in columns]
    names = [name for name in read if isinstance(name, str)]
    if len(names) != len(read) or len(set(names)) != len(names):
        return None
    db_now = _db_now(rows.model, connection, now)
    found = [index for index, value in enumerate(params) if type(value) is type(db_now) and value == db_now]
    if len(found) != 1:
        return None
    return _hinted(sql, rows, connection), tuple(params), found[0], names


def _db_now(model: type[models.Model], connection: BaseDatabaseWrapper, now: datetime) -> Any:
    """``now`` as the claim's comparison with ``due`` sends it (what the lookup prepares for the field)."""
    field: Any = model._meta.get_field("due")  # a concrete field: QueueModel's
    return field.get_db_prep_value(now, connection, prepared=False)


def _claim_index(model: type[models.Model], order: tuple[str, ...]) -> str | None:
    """Return the name of the model's index that ends in the claim's ``order`` (``pk`` as its field's name).

    A queue table's is ``(due, pk)`` (models.py gives every one); the tasks' is ``(backend, queue_name, -priority,
    due, id)``, which is in claim order where the claim names one backend's queue, as theirs always does. The
    shortest such index is taken: the one with fewest columns before the order.
    """
    wanted = [model._meta.pk.name if name == "pk" else name for name in order]
    ending = [index for index in model._meta.indexes if list(index.fields)[-len(wanted) :] == wanted]
    return min(ending, key=lambda index: len(index.fields)).name if ending else None


def _take_write_lock(model: type[models.Model], connection: BaseDatabaseWrapper) -> None:
    """Take SQLite's database write lock now, in the open transaction (a write that matches nothing does)."""
    with connection.cursor() as cursor:
        cursor.execute(row_sql.write_lock(*quoted(connection, model, "version")))


# The statements below are claim's and finish's hot path: they are written here, not by the ORM, because
# compiling an UPDATE (and, for a batch, a condition on 500 pks) cost more than running it. They write exactly
# what QuerySet.update() would; anything unusual (an expression, a parent model's field) goes to the ORM.


def _lease(model: type[models.Model], using: str, rows: list[Any], run: ActiveRun, now: datetime) -> None:
    """Add an attempt, a version and the backoff to every row in one UPDATE, and mirror it on the objects."""
    dues = [now + backoff for backoff in backoffs(run.job.period, max_attempts_of(model))]
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
