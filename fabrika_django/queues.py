"""``QueueQuerySet`` / ``QueueManager``: the state filters, ``claim()`` which leases due rows, and
``finish_all()`` which finishes many claimed rows in one statement."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import reduce
from operator import or_
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections, models, router, transaction
from django.db.models import F, Q
from django.db.models.sql import UpdateQuery

# Re-exported: projects and checks know them from here.
from ._queuestate import DEFAULT_MAX_ATTEMPTS as DEFAULT_MAX_ATTEMPTS
from ._queuestate import max_attempts_of as max_attempts_of
from ._queuestate import state_q
from ._row_writes import prepared, refuse_own_fields, run_now, writable_field
from ._running import active_run

# Up a floor, into the run machinery's folder: claim() is the queryset's verb, and its pipeline lives with
# the runs it serves (_runs/claim.py imports only fabrika's own tables, never this module's importers).
from ._runs import claim as run_claim
from ._sql import quoted
from ._sql import rows as row_sql
from ._sql.rows import db_pks
from .exceptions import ClaimInsideTransaction, ClaimOutsideJob

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from ._running import ActiveRun

logger = logging.getLogger(__name__)

MAX_CLAIM = 500

_M = TypeVar("_M", bound=models.Model)


class QueueQuerySet(models.QuerySet[_M]):
    """Rows of a queue table. The state filters narrow; ``claim()`` and ``finish_all()`` act."""

    #: The order claim() takes due rows in; a queue of its own (Django tasks: priority first) may change it.
    _claim_order: tuple[str, ...] = run_claim.CLAIM_ORDER
    #: On MariaDB/MySQL, a field whose every value the claim names, and those values: there the claim index is
    #: built whole (no partial indexes), and named one by one the values make one range of due rows each, read
    #: in the index's order (Django tasks: every priority, which the table's check constraint bounds).
    _claim_ranges: tuple[str, Sequence[Any]] | None = None

    def waiting(self) -> QueueQuerySet[_M]:
        """Narrow to rows with ``due`` set and attempts below the model's ``max_attempts``."""
        return self.filter(state_q(self.model, "waiting"))

    def due_now(self, now: datetime | None = None) -> QueueQuerySet[_M]:
        """Narrow to waiting rows whose ``due`` has come (by ``now``, the run's clock by default)."""
        return self.filter(state_q(self.model, "due_now", now or run_now()))

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
        write lock first; on PostgreSQL one, for the manager's own rows and a ``where`` on the table's own
        columns, such as ``Q(kind="welcome")``). Each claimed row
        gets one more attempt, a new version, and ``due`` moved by the backoff, so a crash leaves it due again
        later. A row whose columns cannot be read back (JSON nested deeper than Python decodes, written outside
        the ORM) is given up alone: dead at once, ``last_failure`` ``row_undecodable``. Runs only inside a job
        run, never inside ``ctx.transaction()``.
        """
        return self._claim(limit, where, whole_table=False)

    def _claim(self, limit: int, where: Q | None, *, whole_table: bool) -> list[_M]:
        """``claim()``; ``whole_table``: the queryset is its manager's own, untouched (``QueueManager.claim``)."""
        run = _refuse_bad_claim(limit, where)
        using = self.db if self._db_given() else router.db_for_write(self.model)  # a claim always writes
        if run.opened_atomic(using):
            raise ClaimInsideTransaction(
                "claim() runs in a short transaction of its own and cannot run inside transaction.atomic(): "
                "its row locks would last as long as that block; claim outside it."
            )
        return run_claim.claim(self._claimable(whole_table), using, run, where, limit)

    def _claimable(self, whole_table: bool) -> run_claim.Claimable:
        """What claim() hands the pipeline: these rows, their claim order, how to read them and give them up;
        ``whole_table``: the queryset is its manager's own, untouched (``QueueManager.claim``)."""
        plain = whole_table and _is_plain(self)
        return run_claim.Claimable(self, self._claim_order, self._claim_query, plain, self._give_up)

    def _claim_query(self, using: str, now: datetime, where: Q | None) -> QueueQuerySet[_M]:
        """The claim's rows, in claim order, unlocked and unlimited."""
        # due is not read back: the claim writes it, and loading a datetime costs more than the rest of a row.
        rows = self.using(using).due_now(now).filter(where or Q()).order_by(*self._claim_order).defer("due")
        if self._claim_ranges is not None and connections[using].vendor == "mysql":
            field, values = self._claim_ranges
            rows = rows.filter(**{f"{field}__in": values})
        return rows

    def _give_up(self, using: str, rows: list[tuple[Any, int]]) -> None:
        """Give up claimed rows that could not be decoded, by (pk, version): dead at once, since no retry helps.

        Logged by id and a fixed code; the row's columns are never read into memory.
        """
        for pk, version in rows:
            given_up = self.model._base_manager.using(using).filter(pk=pk, version=version)
            given_up.update(attempts=max_attempts_of(self.model), last_failure="row_undecodable", version=version + 1)
            logger.warning("Row given up model=%s id=%s code=row_undecodable", self.model._meta.label, pk)

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
        refuse_own_fields("finish_all", values)
        _refuse_bad_batch(self.model, batch)
        if not batch:
            return []
        using = self.db if self._db_given() else router.db_for_write(self.model)
        written = _update_versioned(self.model, using, batch, dict(values, due=None))
        keys = db_pks(self.model, connections[using], [row.pk for row in batch])
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

    def claim(self, limit: int = 50, where: Q | None = None) -> list[Any]:
        """Lease up to ``limit`` of the table's due rows (``QueueQuerySet.claim``)."""
        # Only here is the queryset known to be the whole table, untouched, so that its read may be compiled
        # once: a queryset's own claim() (after filter(), all(), using()...) cannot tell, as Django has no public
        # way to ask whether a queryset was changed. A manager that narrows get_queryset() (a related manager
        # among them) is not the whole table either.
        whole_table = type(self).get_queryset is models.Manager.get_queryset
        rows: QueueQuerySet[Any] = self.get_queryset()
        return rows._claim(limit, where, whole_table=whole_table)


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


def _refuse_bad_batch(model: type[models.Model], batch: Sequence[object]) -> None:
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


def _is_plain(rows: QueueQuerySet[Any]) -> bool:
    """Whether ``rows``, a manager's own queryset (``QueueManager.claim``), reads the claim's rows as
    ``QueueQuerySet`` declares it (``due_now`` and ``_claim_query`` not overridden): then its read compiled once
    is the one it would compile each time."""
    return type(rows).due_now is QueueQuerySet.due_now and type(rows)._claim_query is QueueQuerySet._claim_query


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
        table, version_c, pk_c = quoted(connection, model, "version", "pk")
        # Rows claimed together share a version or a few, so this stays a short condition, not one per row.
        conditions = []
        for version, pks in by_version.items():
            in_sql, in_params = row_sql.pks_in(connection, pk_c, db_pks(model, connection, pks))
            conditions.append(f"({version_c} = %s AND {in_sql})")
            params += [version, *in_params]
        sql = row_sql.versioned_update(table, parts, version_c, " OR ".join(conditions), pk_c)
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
                cursor.execute(row_sql.returning(sql, pk_column), params)
                return {row[0] for row in cursor.fetchall()}
    # No UPDATE ... RETURNING (MariaDB, MySQL): lock the unchanged rows, then write exactly those, in one
    # transaction. Reading which rows changed after the UPDATE instead would be wrong: a row another writer
    # moved to the version this UPDATE writes would look written.
    with transaction.atomic(using=using):
        locked = _locked_for_update(matching, connection)
        pks = list(locked.values_list("pk", flat=True))
        if pks and assigned is not None:
            parts, params = assigned
            table, version_c, pk_c = quoted(connection, model, "version", "pk")
            in_sql, in_params = row_sql.pks_in(connection, pk_c, db_pks(model, connection, pks))
            sql = row_sql.versioned_update(table, parts, version_c, in_sql, None)
            with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
                cursor.execute(sql, [*params, *in_params])
        elif pks:
            model._base_manager.using(using).filter(pk__in=pks).update(**values)
    return set(db_pks(model, connection, pks))


def _assignments(
    model: type[models.Model], connection: BaseDatabaseWrapper, values: dict[str, Any]
) -> tuple[list[str], list[Any]] | None:
    """Return ``column = %s`` parts and their prepared values, or None where the ORM must write (see above)."""
    parts, params = [], []
    for name, value in values.items():
        field = writable_field(model, name)
        if field is None or hasattr(value, "resolve_expression"):
            return None
        parts.append(f"{connection.ops.quote_name(field.column)} = %s")
        params.append(prepared(field, value, connection))
    return parts, params


def _locked_for_update(rows: models.QuerySet[Any], connection: BaseDatabaseWrapper) -> models.QuerySet[Any]:
    if connection.features.has_select_for_update:
        return rows.select_for_update()
    with connection.cursor() as cursor:
        cursor.execute(row_sql.write_lock(*quoted(connection, rows.model, "version")))
    return rows


def _can_update_returning(connection: BaseDatabaseWrapper) -> bool:
    # Django has no feature flag for UPDATE ... RETURNING (can_return_columns_from_insert is true on MariaDB,
    # which has INSERT ... RETURNING but no UPDATE ... RETURNING), so this one asks the vendor.
    if connection.vendor == "postgresql":
        return True
    if connection.vendor == "sqlite":
        return bool(connection.Database.sqlite_version_info >= (3, 35))  # type: ignore[attr-defined]
    return False
