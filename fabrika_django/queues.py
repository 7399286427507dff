"""``QueueQuerySet`` / ``QueueManager``: the state filters, ``claim()`` which leases due rows, and
``finish_all()`` which finishes many claimed rows in one statement."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import reduce
from operator import or_
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models, router, transaction
from django.db.models import F, Q
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from . import _channel, _metrics

# Re-exported: projects and checks know them from here.
from ._queuestate import DEFAULT_MAX_ATTEMPTS as DEFAULT_MAX_ATTEMPTS
from ._queuestate import max_attempts_of as max_attempts_of
from ._queuestate import state_q, state_sql
from ._running import active_run, framework_write
from ._sql import prepared as _prepared_sql
from .backoff import MAX_ROW_BACKOFF, row_backoff
from .exceptions import ClaimInsideTransaction, ClaimOutsideJob

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from ._running import ActiveRun

MAX_CLAIM = 500
# The fields the framework writes itself: finish() clears due, requeue() resets attempts, every write bumps version.
_OWN_FIELDS = frozenset({"attempts", "due", "version"})

_M = TypeVar("_M", bound=models.Model)


def _now() -> datetime:
    """Return the active run's clock (a test's fixed one), or the wall clock outside a run."""
    run = active_run()
    return run.now() if run is not None else timezone.now()


class QueueQuerySet(models.QuerySet[_M]):
    """Rows of a queue table. The state filters narrow; ``claim()`` and ``finish_all()`` act."""

    #: The order claim() takes due rows in; a queue of its own (Django tasks: priority first) may change it.
    _claim_order: tuple[str, ...] = ("due", "pk")

    def waiting(self) -> QueueQuerySet[_M]:
        """Narrow to rows with ``due`` set and attempts below the model's ``max_attempts``."""
        return self.filter(state_q(self.model, "waiting"))

    def due_now(self, now: datetime | None = None) -> QueueQuerySet[_M]:
        """Narrow to waiting rows whose ``due`` has come (by ``now``, the run's clock by default)."""
        return self.filter(state_q(self.model, "due_now", now or _now()))

    def dead(self) -> QueueQuerySet[_M]:
        """Narrow to rows that reached ``max_attempts``: never claimed again, kept for a person to requeue."""
        return self.filter(state_q(self.model, "dead"))

    def done(self) -> QueueQuerySet[_M]:
        """Narrow to rows whose ``due`` is null."""
        return self.filter(state_q(self.model, "done"))

    def claim(self, limit: int = 50, where: Q | None = None) -> list[_M]:
        """Lease up to ``limit`` due rows and return them with their new attempts, due and version.

        Terminal. Takes the oldest due rows first (then by pk), skipping rows another session holds, in a
        short transaction of its own: two statements however many rows (three on SQLite, which takes its
        write lock first; on PostgreSQL one, for the manager's own rows without ``where``). Each claimed row
        gets one more attempt, a new version, and ``due`` moved by the backoff, so a crash leaves it due again
        later. Runs only inside a job run, never inside ``ctx.transaction()``.
        """
        run = _refuse_bad_claim(limit, where)
        using = self.db if self._db_given() else router.db_for_write(self.model)  # a claim always writes
        if run.opened_atomic(using):
            raise ClaimInsideTransaction(
                "claim() runs in a short transaction of its own and cannot run inside transaction.atomic(): "
                "its row locks would last as long as that block; claim outside it."
            )
        connection = connections[using]
        now = run.now()
        run.claimed.add((using, self.model._meta.label))  # a requeue of this table kicks the job (_claimers)
        claimed = _claim_in_one(self, using, connection, run, now, where, limit)
        if claimed is not None:
            return claimed
        with framework_write(), transaction.atomic(using=using):
            rows = self._claim_rows(using, connection, now, where, limit)
            if rows:
                _lease(self.model, using, rows, run, now)
        _metrics.observe_claim(run.job.name, len(rows))
        _note_backlog(run, len(rows), limit)
        return rows

    def _claim_rows(
        self, using: str, connection: BaseDatabaseWrapper, now: datetime, where: Q | None, limit: int
    ) -> list[_M]:
        """Read and lock the claim's rows, in the claim's transaction."""
        compiled = _compiled_claim(self, using, connection, now, where, limit)
        if compiled is not None:
            sql, params, names = compiled
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                found = cursor.fetchall()
            return [self.model.from_db(using, names, values) for values in found]
        return _read_locked(_locked(self._claim_query(using, now, where), connection)[:limit], connection)

    def _claim_query(self, using: str, now: datetime, where: Q | None) -> QueueQuerySet[_M]:
        """The claim's rows, in claim order, unlocked and unlimited."""
        # due is not read back: the claim writes it, and loading a datetime costs more than the rest of a row.
        return self.using(using).due_now(now).filter(where or Q()).order_by(*self._claim_order).defer("due")

    def finish_all(self, rows: Iterable[_M], /, **values: Any) -> list[_M]:
        """Finish many claimed rows in one statement; return the rows that changed since (the conflicts).

        Acts. Like ``row.finish(**values)`` for each row: writes ``values``, clears ``due`` and bumps the
        version, each row checked against the version it was claimed or read with. A row that changed
        since is left untouched and returned; every other row is written, and its object mirrors what was
        written (``due`` None, the next version, ``values``). Nothing is half-written: one UPDATE of the rows
        whose version still matches (on backends without UPDATE ... RETURNING: a locking read, then that
        UPDATE, in one transaction). Call it inside ``ctx.transaction()``, as ``finish()``.
        """
        batch = list(rows)
        _refuse_own_fields("finish_all", values)
        _refuse_bad_batch(self.model, batch)
        if not batch:
            return []
        using = self.db if self._db_given() else router.db_for_write(self.model)
        written = _update_versioned(self.model, using, batch, dict(values, due=None))
        keys = _db_pks(self.model, connections[using], [row.pk for row in batch])
        conflicts = []
        for row, key in zip(batch, keys, strict=True):
            if key in written:
                for name, value in values.items():
                    setattr(row, name, value)
                row.due = None  # type: ignore[attr-defined]
                row.version += 1  # type: ignore[attr-defined]
            else:
                conflicts.append(row)
        return conflicts

    def _db_given(self) -> bool:
        """Return whether the queryset was given a database (``using()``); else the router picks the writer."""
        return getattr(self, "_db", None) is not None


class QueueManager(models.Manager.from_queryset(QueueQuerySet)):  # type: ignore[misc]
    """The manager of a queue table; a model's own manager must derive from it."""


def _note_backlog(run: ActiveRun, count: int, limit: int) -> None:
    """Tell the run what its claim said about the backlog; a full claim asks for one more lane (DESIGN §11)."""
    demand = getattr(run.context, "_demand", None)
    if demand is not None and demand.claimed(count, limit):
        # Imported here: _runs imports the models, which import this module.
        from ._runs.pending import ask_for_lane

        ask_for_lane(run.job.name, run.job.lanes)


# -- the claim in one statement (PostgreSQL) ----------------------------------------------------------------
#
# On PostgreSQL a plain claim (the manager's own rows, no ``where``, the default claim order) is one statement in
# autocommit, run as a server-side prepared statement (``_sql.prepared``): the locking read, the lease's UPDATE and,
# for a run in lanes, the lane ask with its NOTIFY, gated on the claim being full. The long way is four round
# trips (BEGIN, the read, the UPDATE, COMMIT) and one more for the ask; after each one the lane needs the
# interpreter lock back, which every lane of the worker shares (bench/lanes.py).
# A claimed row's new ``due`` is one of a few instants the worker computes (``row_backoff`` by the row's attempts,
# the same for every count past the backoff's cap) and sends as an array, from which the UPDATE picks by the
# attempts it finds: the object gets exactly the instant written, without reading a datetime back.

#: By (model, alias, job alias or None where the statement carries no lane ask): the statement and the names of
#: the fields its answer's columns are, in order; None where the claim goes the long way (a field read through a
#: converter, a parent table).
_ONE_STATEMENT: dict[tuple[Any, ...], tuple[str, list[str]] | None] = {}
#: By (job period, max_attempts): the backoff of a row claimed with 0, 1, ... attempts, up to the first capped one.
_BACKOFFS: dict[tuple[Any, int], list[Any]] = {}


def _claim_in_one(
    rows: QueueQuerySet[Any],
    using: str,
    connection: BaseDatabaseWrapper,
    run: ActiveRun,
    now: datetime,
    where: Q | None,
    limit: int,
) -> list[Any] | None:
    """Claim in one statement where it can (see above); None where the claim must go the long way.

    Does what the claim does after its refusals: the metric, the run's note of a full claim and, for a full
    claim of a run in lanes, the lane ask (inside the statement when the job's table is on the same database).
    """
    if (
        where is not None
        or connection.vendor != "postgresql"
        or type(rows)._claim_order != QueueQuerySet._claim_order
        or not _is_plain(rows)
    ):
        return None
    model = rows.model
    demand = getattr(run.context, "_demand", None)
    folds_ask = demand is not None and demand.lanes > 1 and _job_alias() == using
    key = (model, using, folds_ask)
    if key not in _ONE_STATEMENT:
        _ONE_STATEMENT[key] = _one_statement(model, connection, with_ask=folds_ask)
    built = _ONE_STATEMENT[key]
    if built is None:
        return None
    sql, names = built
    max_attempts = max_attempts_of(model)
    backoffs = _backoffs(run.job.period, max_attempts)
    prepare = model._meta.get_field("due").get_db_prep_save
    dues = [now + backoff for backoff in backoffs]
    last = len(dues) - 1
    params: list[Any] = [
        max_attempts,
        prepare(now, connection),
        limit,
        [prepare(due, connection) for due in dues],
        last,
    ]
    if folds_ask:
        from ._runs.pending import lane_ask

        params += [*lane_ask(using, run.job.name, run.job.lanes)[1], limit, _channel.CHANNEL, run.job.name]
    with framework_write(), transaction.mark_for_rollback_on_error(using):
        found = _prepared_sql.fetchall(connection, sql, params)
    claimed = [model.from_db(using, names, values) for values in found]
    for row in claimed:
        row.due = dues[min(row.attempts - 1, last)]
    _metrics.observe_claim(run.job.name, len(claimed))
    if demand is not None and demand.claimed(len(claimed), limit) and not folds_ask:
        from ._runs.pending import ask_for_lane

        ask_for_lane(run.job.name, run.job.lanes)
    return claimed


def _job_alias() -> str:
    """The database of the jobs' tables, where a lane ask writes."""
    from .models import Job  # here: the models import this module

    return router.db_for_write(Job)


def _backoffs(period: Any, max_attempts: int) -> list[Any]:
    """``row_backoff`` of a row claimed with 0, 1, ... attempts before, up to its first capped value."""
    key = (period, max_attempts)
    if key not in _BACKOFFS:
        found: list[Any] = []
        for before in range(max(max_attempts, 1)):
            found.append(row_backoff(period, before + 1))
            if found[-1] >= MAX_ROW_BACKOFF:
                break
        _BACKOFFS[key] = found
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
    quote = connection.ops.quote_name
    fields = [field for field in opts.concrete_fields if field.attname != "due"]
    for field in fields:
        column = field.get_col(opts.db_table)
        if connection.ops.get_db_converters(column) + field.get_db_converters(connection):
            return None
    condition, values = state_sql(model, "due_now", _SAMPLE_NOW, connection)
    # The condition's parameters must be max_attempts then now, as the claim sends them: else the long way.
    if values != [max_attempts_of(model), _SAMPLE_NOW]:
        return None
    table, due_c, attempts_c, version_c, pk_c = _quoted(connection, model, "due", "attempts", "version", "pk")
    returned = ", ".join(f"claimed.{quote(str(field.column))}" for field in fields)
    ctes = (
        f"picked AS (SELECT {pk_c} AS pk_, {due_c} AS due_ FROM {table} WHERE {condition} "  # noqa: S608  quoted names
        f"ORDER BY {due_c}, {pk_c} LIMIT %s FOR UPDATE OF {table} SKIP LOCKED), "
        f"leased AS (UPDATE {table} AS claimed "
        f"SET {due_c} = (%s::timestamptz[])[LEAST(claimed.{attempts_c}, %s) + 1], "
        f"{attempts_c} = claimed.{attempts_c} + 1, {version_c} = claimed.{version_c} + 1 "
        f"FROM picked WHERE claimed.{pk_c} = picked.pk_ RETURNING {returned}, picked.due_, picked.pk_)"
    )
    if with_ask:
        from ._runs.pending import lane_ask

        # The ask's UPDATE as ask_for_lane sends it (its WHERE in parentheses), written only for a full claim.
        ask_sql = lane_ask(connection.alias, "", 2)[0]
        ctes += f", asked AS ({ask_sql} AND (SELECT count(*) FROM picked) >= %s RETURNING pg_notify(%s, %s))"  # noqa: S608
    answer = ", ".join(f"leased.{quote(str(field.column))}" for field in fields)
    sql = f"WITH {ctes} SELECT {answer} FROM leased ORDER BY leased.due_, leased.pk_"  # noqa: S608  quoted names
    return sql, [field.attname for field in fields]


#: Stands for the claim's ``now`` while its condition is compiled once (``_one_statement``).
_SAMPLE_NOW = datetime(2000, 1, 1, tzinfo=UTC)


def _refuse_bad_claim(limit: object, where: object) -> ActiveRun:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_CLAIM:
        raise ValueError(f"claim(limit={limit!r}) is out of bounds: give a whole number from 1 to {MAX_CLAIM}.")
    if where is not None and not isinstance(where, Q):
        raise TypeError(f"claim(where={type(where).__name__}) is not a Q: give e.g. where=Q(kind='welcome').")
    run = active_run()
    if run is None:
        raise ClaimOutsideJob(
            "claim() runs only inside a job run: call it from a @cron job's handler "
            "(or run_job() in tests); outside a job, read rows with the state filters such as due_now()."
        )
    if run.in_transaction:
        raise ClaimInsideTransaction(
            "claim() runs in a short transaction of its own and cannot run inside ctx.transaction(): "
            "claim before the work, then finish each row inside its own ctx.transaction()."
        )
    return run


def _refuse_own_fields(method: str, values: dict[str, Any]) -> None:
    clash = _OWN_FIELDS.intersection(values)
    if clash:
        raise TypeError(
            f"{method}() sets {', '.join(sorted(clash))} itself: pass only your own fields, "
            "or use requeue(at=...) to make a row due again."
        )


def _refuse_bad_batch(model: type[models.Model], batch: list[Any]) -> None:
    seen = set()
    for row in batch:
        if not isinstance(row, model):
            raise TypeError(
                f"finish_all() got a {type(row).__name__}, not a {model._meta.label} row: "
                f"finish each model's rows through its own manager."
            )
        if row.pk is None or row.pk in seen:
            raise ValueError(
                f"finish_all() got {'an unsaved row' if row.pk is None else f'row {row.pk} twice'}: "
                "pass each claimed row once."
            )
        seen.add(row.pk)


def _locked(rows: QueueQuerySet[Any], connection: BaseDatabaseWrapper) -> QueueQuerySet[Any]:
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


def _read_locked(rows: QueueQuerySet[Any], connection: BaseDatabaseWrapper) -> list[Any]:
    """Read the claim's rows; on MariaDB/MySQL through the index in claim order, named in the statement.

    InnoDB locks every row a locking read examines, and keeps the lock on each row that matched even when
    ORDER BY ... LIMIT drops it after a sort. With a backlog (most rows due) the optimizer prefers a table scan
    and a filesort, so one claim would lock the whole backlog and every other claimer would skip it all.
    Walking the index in claim's order reads only the rows it returns (and dead ones it passes).
    """
    if connection.vendor != "mysql" or _claim_index(rows.model, type(rows)._claim_order) is None:
        return list(rows)
    return list(rows.model._base_manager.raw(*_locking_read(rows, connection), using=rows.db))


def _locking_read(rows: QueueQuerySet[Any], connection: BaseDatabaseWrapper) -> tuple[str, tuple[Any, ...]]:
    """The claim's locking read as SQL and parameters (on MariaDB/MySQL with its index named: ``_read_locked``)."""
    sql, params = rows.query.get_compiler(connection=connection).as_sql()
    return _hinted(sql, rows, connection), tuple(params)


def _hinted(sql: str, rows: QueueQuerySet[Any], connection: BaseDatabaseWrapper) -> str:
    """On MariaDB/MySQL, name the index in claim order in the claim's read (see ``_read_locked``)."""
    model = rows.model
    index = _claim_index(model, type(rows)._claim_order) if connection.vendor == "mysql" else None
    if index is None:
        return sql
    table = connection.ops.quote_name(model._meta.db_table)
    return sql.replace(f"FROM {table}", f"FROM {table} FORCE INDEX ({connection.ops.quote_name(index)})", 1)


# The claim's locking read as compiled once, by what decides its text: the queryset's class (its claim order and
# filters), the model and its max_attempts, the database and the limit; with the position of ``now`` among its
# parameters. Compiling it took about a millisecond of the worker's Python a claim (as long as the rest of a
# claim of ten rows), under the interpreter lock every lane of the process shares. A claim with ``where``,
# or on a queryset that is not the manager's own (a filter, an annotation...), compiles every time.
# Its rows are made as the ORM makes them (``Model.from_db`` with the selected fields' names), fetched at once:
# a model whose selected fields convert values read from the database always goes the long way.
_CLAIM_READS: dict[tuple[Any, ...], tuple[str, tuple[Any, ...], int, list[str]] | None] = {}


def _compiled_claim(
    rows: QueueQuerySet[Any], using: str, connection: BaseDatabaseWrapper, now: datetime, where: Q | None, limit: int
) -> tuple[str, list[Any], list[str]] | None:
    """Return the claim's locking read for ``now`` from the cache, or None where it must be compiled."""
    # SQLite takes its write lock in _locked (a statement), not in the read: it always goes the long way.
    if where is not None or not connection.features.has_select_for_update or not _is_plain(rows):
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
    rows: QueueQuerySet[Any], using: str, connection: BaseDatabaseWrapper, now: datetime, limit: int
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


# A manager's own queryset of each model, to tell a claim's queryset from one with filters or other changes.
_PLAIN_QUERIES: dict[type[models.Model], Any] = {}


def _is_plain(rows: QueueQuerySet[Any]) -> bool:
    """Whether ``rows`` is its model's whole table as a plain manager gives it, reading model instances.

    Its query must be a fresh ``Query`` of the model, attribute for attribute (a filter, an exclusion, an
    annotation, an ordering, ``defer``, ``select_related``, ``distinct`` or ``extra`` each set one), and the
    claim must not be overridden in the state filter it reads through (``due_now``).
    """
    state: Any = rows  # QuerySet's private attributes, which the stubs leave out
    if (
        state._iterable_class is not models.query.ModelIterable
        or state._fields
        or state._prefetch_related_lookups
        or state._deferred_filter is not None
        or type(rows).due_now is not QueueQuerySet.due_now
        or type(rows)._claim_query is not QueueQuerySet._claim_query
    ):
        return False
    model = rows.model
    if model not in _PLAIN_QUERIES:
        _PLAIN_QUERIES[model] = models.sql.Query(model)
    return bool(rows.query.__dict__ == _PLAIN_QUERIES[model].__dict__)


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
    table, version = _quoted(connection, model, "version")
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {version} = {version} WHERE 1 = 0")  # noqa: S608  quoted names


# The statements below are claim's and finish's hot path: they are written here, not by the ORM, because
# compiling an UPDATE (and, for a batch, a condition on 500 pks) cost more than running it. They write exactly
# what QuerySet.update() would; anything unusual (an expression, a parent model's field) goes to the ORM.


def _lease(model: type[models.Model], using: str, rows: list[Any], run: ActiveRun, now: datetime) -> None:
    """Add an attempt, a version and the backoff to every row in one UPDATE, and mirror it on the objects."""
    period = run.job.period
    due_by_attempts = {attempts: now + row_backoff(period, attempts + 1) for attempts in {row.attempts for row in rows}}
    connection = connections[using]
    due_field: Any = model._meta.get_field("due")
    prepare = due_field.get_db_prep_save
    table, attempts_c, due_c, version_c, pk_c = _quoted(connection, model, "attempts", "due", "version", "pk")
    if len(due_by_attempts) == 1:
        due_sql, params = "%s", [prepare(next(iter(due_by_attempts.values())), connection)]
    else:
        # The rows are locked (SQLite: the database is), so their attempts are still what was read.
        due_sql = f"CASE {attempts_c}{' WHEN %s THEN %s' * len(due_by_attempts)} END"
        params = [value for attempts, due in due_by_attempts.items() for value in (attempts, prepare(due, connection))]
    in_sql, in_params = _pks_in(connection, pk_c, _db_pks(model, connection, [row.pk for row in rows]))
    # due first: MySQL and MariaDB evaluate a single-table UPDATE's assignments left to right, each seeing the
    # ones before it, so a CASE on attempts placed after "attempts = attempts + 1" would match no WHEN.
    sql = (
        f"UPDATE {table} SET {due_c} = {due_sql}, {attempts_c} = {attempts_c} + 1, {version_c} = {version_c} + 1 "  # noqa: S608
        f"WHERE {in_sql}"
    )
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(sql, [*params, *in_params])
    for row in rows:
        row.due = due_by_attempts[row.attempts]
        row.attempts += 1
        row.version += 1


def _update_row(model: type[models.Model], using: str, pk: Any, version: int, values: dict[str, Any]) -> bool:
    """Write ``values`` and the next version to the row if its version is still ``version``: one UPDATE."""
    connection = connections[using]
    built = _row_update(model, connection, tuple(values))
    if built is None or any(hasattr(value, "resolve_expression") for value in values.values()):
        mine = model._base_manager.using(using).filter(pk=pk, version=version)
        return bool(mine.update(**values, version=version + 1))
    sql, fields = built
    params = [_prepared(field, value, connection) for field, value in zip(fields, values.values(), strict=True)]
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(sql, [*params, version + 1, *_db_pks(model, connection, [pk]), version])
        return cursor.rowcount == 1


# A finish's UPDATE by (model, field names, vendor): the same few statements come back for every row, and
# looking up and quoting their fields cost as much Python as the rest of a finishing transaction.
_ROW_UPDATES: dict[tuple[Any, ...], tuple[str, list[Any]] | None] = {}


def _row_update(
    model: type[models.Model], connection: BaseDatabaseWrapper, names: tuple[str, ...]
) -> tuple[str, list[Any]] | None:
    """Return ``_update_row``'s statement for ``names`` and their fields, or None where the ORM must write."""
    key = (model, names, connection.vendor)
    if key not in _ROW_UPDATES:
        fields = [_writable_field(model, name) for name in names]
        if any(field is None for field in fields):
            _ROW_UPDATES[key] = None
        else:
            parts = [f"{connection.ops.quote_name(field.column)} = %s" for field in fields]
            table, version_c, pk_c = _quoted(connection, model, "version", "pk")
            sql = f"UPDATE {table} SET {', '.join(parts)}, {version_c} = %s WHERE {pk_c} = %s AND {version_c} = %s"  # noqa: S608
            _ROW_UPDATES[key] = (sql, fields)
    return _ROW_UPDATES[key]


def _update_versioned(model: type[models.Model], using: str, rows: list[Any], values: dict[str, Any]) -> set[Any]:
    """Write ``values`` and the next version to each row whose version is still the one read.

    Returns the written rows' pks as the database answers them (``_db_pks``).
    """
    by_version: dict[int, list[Any]] = defaultdict(list)
    for row in rows:
        by_version[row.version].append(row.pk)
    connection = connections[using]
    assigned = _assignments(model, connection, values)
    if assigned is not None and _can_update_returning(connection):
        parts, params = assigned
        table, version_c, pk_c = _quoted(connection, model, "version", "pk")
        # Rows claimed together share a version or a few, so this stays a short condition, not one per row.
        conditions = []
        for version, pks in by_version.items():
            in_sql, in_params = _pks_in(connection, pk_c, _db_pks(model, connection, pks))
            conditions.append(f"({version_c} = %s AND {in_sql})")
            params += [version, *in_params]
        sql = (
            f"UPDATE {table} SET {', '.join(parts)}, {version_c} = {version_c} + 1 "  # noqa: S608
            f"WHERE {' OR '.join(conditions)} RETURNING {pk_c}"
        )
        with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
            cursor.execute(sql, params)
            return {row[0] for row in cursor.fetchall()}
    unchanged = reduce(or_, (Q(version=version, pk__in=pks) for version, pks in by_version.items()))
    matching = model._base_manager.using(using).filter(unchanged)
    values = dict(values, version=F("version") + 1)
    if _can_update_returning(connection):
        query: Any = matching.query.chain(UpdateQuery)
        query.add_update_values(values)
        if not query.related_updates:  # a field of a parent model (multi-table inheritance) needs two UPDATEs
            sql, params = query.get_compiler(using).as_sql()
            pk_column = connection.ops.quote_name(str(model._meta.pk.column))
            with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
                cursor.execute(f"{sql} RETURNING {pk_column}", params)
                return {row[0] for row in cursor.fetchall()}
    # No UPDATE ... RETURNING (MariaDB, MySQL): lock the unchanged rows, then write exactly those, in one
    # transaction. Reading which rows changed after the UPDATE instead would be wrong: a row another writer
    # moved to the version this UPDATE writes would look written.
    with transaction.atomic(using=using):
        locked = _locked_for_update(matching, connection)
        pks = list(locked.values_list("pk", flat=True))
        if pks and assigned is not None:
            parts, params = assigned
            table, version_c, pk_c = _quoted(connection, model, "version", "pk")
            in_sql, in_params = _pks_in(connection, pk_c, _db_pks(model, connection, pks))
            sql = f"UPDATE {table} SET {', '.join(parts)}, {version_c} = {version_c} + 1 WHERE {in_sql}"  # noqa: S608
            with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
                cursor.execute(sql, [*params, *in_params])
        elif pks:
            model._base_manager.using(using).filter(pk__in=pks).update(**values)
    return set(_db_pks(model, connection, pks))


def _assignments(
    model: type[models.Model], connection: BaseDatabaseWrapper, values: dict[str, Any]
) -> tuple[list[str], list[Any]] | None:
    """Return ``column = %s`` parts and their prepared values, or None where the ORM must write (see above)."""
    parts, params = [], []
    for name, value in values.items():
        field = _writable_field(model, name)
        if field is None or hasattr(value, "resolve_expression"):
            return None
        parts.append(f"{connection.ops.quote_name(field.column)} = %s")
        params.append(_prepared(field, value, connection))
    return parts, params


def _writable_field(model: type[models.Model], name: str) -> Any:
    """Return the model's field ``name`` if a plain ``column = %s`` writes it, else None (the ORM must)."""
    opts = model._meta
    try:
        field: Any = opts.get_field(name)
    except FieldDoesNotExist:
        return None
    if not field.concrete or field.many_to_many or field.model._meta.concrete_model is not opts.concrete_model:
        return None
    return field


def _prepared(field: Any, value: Any, connection: BaseDatabaseWrapper) -> Any:
    """Return ``value`` as the database takes it for ``field`` (a model instance as its key)."""
    if value is not None and field.remote_field and hasattr(value, "prepare_database_save"):
        value = value.prepare_database_save(field)
    return field.get_db_prep_save(value, connection)


def _quoted(connection: BaseDatabaseWrapper, model: type[models.Model], *names: str) -> list[str]:
    """Return the model's quoted table name, then the quoted column of each field named ("pk" too)."""
    opts = model._meta
    fields: list[Any] = [opts.pk if name == "pk" else opts.get_field(name) for name in names]
    return [connection.ops.quote_name(opts.db_table), *(connection.ops.quote_name(f.column) for f in fields)]


def _pks_in(connection: BaseDatabaseWrapper, column: str, pks: list[Any]) -> tuple[str, list[Any]]:
    """Return ``column`` in ``pks`` as SQL and parameters."""
    if connection.vendor == "postgresql":
        # One array parameter, not a placeholder a row: psycopg's client-side binding parses a statement of
        # 500 placeholders again on every execution, which costs more than PostgreSQL takes to run it.
        return f"{column} = ANY(%s)", [pks]
    return f"{column} IN ({', '.join(['%s'] * len(pks))})", pks


def _db_pks(model: type[models.Model], connection: BaseDatabaseWrapper, pks: list[Any]) -> list[Any]:
    """Return ``pks`` as the database takes and answers them (integers as they are)."""
    field = model._meta.pk
    if isinstance(field, models.IntegerField):
        return list(pks)
    return [field.get_db_prep_value(pk, connection) for pk in pks]


def _locked_for_update(rows: models.QuerySet[Any], connection: BaseDatabaseWrapper) -> models.QuerySet[Any]:
    if connection.features.has_select_for_update:
        return rows.select_for_update()
    _take_write_lock(rows.model, connection)
    return rows


def _can_update_returning(connection: BaseDatabaseWrapper) -> bool:
    # Django has no feature flag for UPDATE ... RETURNING (can_return_columns_from_insert is true on MariaDB,
    # which has INSERT ... RETURNING but no UPDATE ... RETURNING), so this one asks the vendor.
    if connection.vendor == "postgresql":
        return True
    if connection.vendor == "sqlite":
        return bool(connection.Database.sqlite_version_info >= (3, 35))  # type: ignore[attr-defined]
    return False
