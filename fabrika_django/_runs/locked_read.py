"""The claim's long way: the locking read of the rows it claims, in the claim's transaction, on any database
with row locks (and on SQLite after its write lock); the lease's UPDATE follows (``claim._lease``)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Q

from .._queuestate import max_attempts_of
from .._sql import cache_dict, quoted
from .._sql import claim as claim_sql
from .._sql import rows as row_sql
from .statement import Claimable, Decoder

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


def locked(rows: Any, connection: BaseDatabaseWrapper) -> Any:
    """Lock the rows a claim reads, skipping those another session holds, as far as the backend can.

    Without row locks (SQLite) the claim took the database write lock before it reads (``take_write_lock``), so
    a second claimer waits for the first to commit instead of reading the same rows.
    """
    features = connection.features
    if features.has_select_for_update_skip_locked:
        # OF keeps a where=Q(...) across a relation from locking the related rows too.
        of = ("self",) if features.has_select_for_update_of else ()
        return rows.select_for_update(skip_locked=True, of=of)
    if features.has_select_for_update:
        return rows.select_for_update()  # correct, though a claimer then waits for rows another holds
    return rows


def read_locked(rows: Any, order: tuple[str, ...], connection: BaseDatabaseWrapper) -> list[Any]:
    """Read an annotated or related claim's rows as the ORM makes them (on MariaDB/MySQL, its index named)."""
    if connection.vendor != "mysql" or _claim_index(rows.model, order) is None:
        return list(rows)
    sql, params = rows.query.get_compiler(connection=connection).as_sql()
    hinted = _hinted(sql, rows.model, order, connection)
    return list(rows.model._base_manager.raw(hinted, tuple(params), using=rows.db))


def _hinted(sql: str, model: type[models.Model], order: tuple[str, ...], connection: BaseDatabaseWrapper) -> str:
    """On MariaDB/MySQL, name the index in claim order in the claim's locking read.

    InnoDB locks every row a locking read examines, and keeps the lock on each row that matched even when
    ORDER BY ... LIMIT drops it after a sort. With a backlog (most rows due) the optimizer prefers a table scan
    and a filesort, so one claim would lock the whole backlog and every other claimer would skip it all.
    Walking the index in claim's order reads only the rows it returns (and dead ones it passes).
    """
    index = _claim_index(model, order) if connection.vendor == "mysql" else None
    if index is None:
        return sql
    return claim_sql.force_index(sql, connection.ops.quote_name(model._meta.db_table), connection.ops.quote_name(index))


# The claim's locking read as compiled once, by what decides its text: the queryset's class (its claim order and
# filters), the model and its max_attempts, the database, the limit and the ``where``; with the position of ``now``
# among its parameters. Compiling it took about a millisecond of the worker's Python a claim (as long as the rest
# of a claim of ten rows), under the interpreter lock every lane of the process shares. A claim on a queryset that
# is not the manager's own (a filter, an annotation...) compiles every time. Emptied past ``_MAX_READS`` (a
# ``where`` with a new value each time would grow it without end).
_CLAIM_READS: dict[tuple[Any, ...], tuple[str, tuple[Any, ...], int, Decoder] | None] = cache_dict()
_MAX_READS = 256


def compiled_claim(
    of: Claimable, using: str, connection: BaseDatabaseWrapper, now: datetime, where: Q | None, limit: int
) -> tuple[str, list[Any], Decoder] | None:
    """The claim's locking read for ``now`` (from the cache where it can be), its parameters and the decoder of
    its rows; None where the ORM must make the rows (an annotated or related queryset)."""
    model = of.rows.model
    key = (type(of.rows), model, max_attempts_of(model), using, connection.vendor, limit, where)
    reused = None
    if of.plain and _hashable(key):
        if key not in _CLAIM_READS:
            if len(_CLAIM_READS) >= _MAX_READS:
                _CLAIM_READS.clear()
            _CLAIM_READS[key] = _compile_claim(of, using, connection, now, where, limit, once=True)
        reused = _CLAIM_READS[key]
    if reused is None:
        compiled = _compile_claim(of, using, connection, now, where, limit)
        return None if compiled is None else (compiled[0], list(compiled[1]), compiled[3])
    sql, params, at, decoder = reused
    values = list(params)
    values[at] = _db_now(model, connection, now)
    return sql, values, decoder


def _hashable(key: tuple[Any, ...]) -> bool:
    try:
        hash(key)
    except TypeError:  # a where= value that cannot be a key (a list in a set...): compiled each time
        return False
    return True


def _compile_claim(
    of: Claimable,
    using: str,
    connection: BaseDatabaseWrapper,
    now: datetime,
    where: Q | None,
    limit: int,
    *,
    once: bool = False,
) -> tuple[str, tuple[Any, ...], int, Decoder] | None:
    """Compile the claim's locking read; None unless every column it reads is a field of the model's table.

    ``once``: for the cache, also None unless ``now`` is among its parameters exactly once (its position is
    answered, to bind a later claim's own).
    """
    model = of.rows.model
    queryset = locked(of.query(using, now, where), connection)[:limit]
    compiler = queryset.query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()
    columns = [expression for expression, _sql, _alias in compiler.select]
    if compiler.annotation_col_map or (compiler.klass_info or {}).get("related_klass_infos"):
        return None
    fields = [getattr(column, "target", None) for column in columns]
    if any(getattr(column, "alias", None) != model._meta.db_table for column in columns):
        return None
    names = [getattr(field, "attname", None) for field in fields]
    if None in names or len(set(names)) != len(names):
        return None
    at = 0
    if once:
        db_now = _db_now(model, connection, now)
        found = [index for index, value in enumerate(params) if type(value) is type(db_now) and value == db_now]
        if len(found) != 1:
            return None
        at = found[0]
    return _hinted(sql, model, of.order, connection), tuple(params), at, Decoder(model, fields, connection)


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


def take_write_lock(model: type[models.Model], connection: BaseDatabaseWrapper) -> None:
    """Take SQLite's database write lock now, in the open transaction (a write that matches nothing does)."""
    with connection.cursor() as cursor:
        cursor.execute(row_sql.write_lock(*quoted(connection, model, "version")))
