"""Writes of queue rows checked against the version each was read with: one row's, shared by the row's own methods
(``models._queue``: ``finish()``, ``requeue()``, ``record_failure()``) and the queryset's ``finish_all()``; many
rows' each with its own values (a run of Django tasks: ``_runs.task_groups``); and the run's clock those writes
read "now" from."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models, transaction
from django.utils import timezone

from ._running import active_run
from ._sql import cache_dict, quoted
from ._sql import rows as row_sql
from ._sql.rows import db_pks

if TYPE_CHECKING:
    from collections.abc import Mapping

    from django.db.backends.base.base import BaseDatabaseWrapper

# The fields the framework writes itself: finish() clears due, requeue() resets attempts, every write bumps version.
OWN_FIELDS = frozenset({"attempts", "due", "version"})


def run_now() -> datetime:
    """Return the active run's clock (a test's fixed one), or the wall clock outside a run."""
    run = active_run()
    return run.now() if run is not None else timezone.now()


def refuse_own_fields(method: str, values: Mapping[str, object]) -> None:
    clash = OWN_FIELDS.intersection(values)
    if clash:
        raise TypeError(
            f"{method}() sets {', '.join(sorted(clash))} itself: pass only your own fields, "
            "or use requeue(at=...) to make a row due again."
        )


def update_row(model: type[models.Model], using: str, pk: Any, version: int, values: dict[str, Any]) -> bool:
    """Write ``values`` and the next version to the row if its version is still ``version``: one UPDATE."""
    connection = connections[using]
    built = _row_update(model, connection, tuple(values))
    if built is None or any(hasattr(value, "resolve_expression") for value in values.values()):
        mine = model._base_manager.using(using).filter(pk=pk, version=version)
        return bool(mine.update(**values, version=version + 1))
    sql, fields = built
    params = [prepared(field, value, connection) for field, value in zip(fields, values.values(), strict=True)]
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(sql, [*params, version + 1, *db_pks(model, connection, [pk]), version])
        return cursor.rowcount == 1


def update_rows(model: type[models.Model], using: str, writes: list[tuple[Any, int, dict[str, Any]]]) -> list[bool]:
    """Write each (pk, version read, values) its own values and the next version, if its version is still the one
    read; answer, in order, whether each was written. Every ``values`` names the same fields, in the same order.

    PostgreSQL, for fields whose values JSON carries as they are (``_AS_JSON``): one statement, whatever the number
    of rows. Elsewhere: ``update_row`` for each, in one transaction (one commit). Values are plain (no expressions).
    """
    if not writes:
        return []
    connection = connections[using]
    names = tuple(writes[0][2])
    sql = _rows_update(model, connection, names)
    if sql is None:
        with transaction.atomic(using=using, savepoint=False):
            return [update_row(model, using, pk, version, values) for pk, version, values in writes]
    rows = [
        {"pk_": _as_json(pk), "version_": version, **{f"c{i}_": _as_json(values[name]) for i, name in enumerate(names)}}
        for pk, version, values in writes
    ]
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(sql, [json.dumps(rows, allow_nan=False)])
        written = {row[0] for row in cursor.fetchall()}
    return [key in written for key in db_pks(model, connection, [pk for pk, _version, _values in writes])]


#: The fields whose values a JSON document carries as PostgreSQL reads them into the column (``update_rows``):
#: numbers, strings, booleans, JSON as itself, a datetime or UUID as its text.
_AS_JSON = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "SmallAutoField",
        "IntegerField",
        "BigIntegerField",
        "SmallIntegerField",
        "PositiveIntegerField",
        "PositiveBigIntegerField",
        "PositiveSmallIntegerField",
        "BooleanField",
        "CharField",
        "TextField",
        "DateTimeField",
        "UUIDField",
        "JSONField",
    }
)


def _as_json(value: Any) -> Any:
    """A value as ``update_rows``' JSON document holds it: a datetime or UUID as the text PostgreSQL casts back."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _rows_update(model: type[models.Model], connection: BaseDatabaseWrapper, names: tuple[str, ...]) -> str | None:
    """``update_rows``' one statement for ``names``, on PostgreSQL; None where each row is written alone."""
    if connection.vendor != "postgresql":
        return None
    key = ("rows", model, names)
    if key not in _ROWS_UPDATES:
        fields = [writable_field(model, name) for name in names]
        kinds = [field.cast_db_type(connection) if _carried_as_json(field) else None for field in fields]
        pk_kind = model._meta.pk.cast_db_type(connection) if _carried_as_json(model._meta.pk) else None
        if pk_kind is None or None in kinds:
            _ROWS_UPDATES[key] = None
        else:
            quote = connection.ops.quote_name
            table, version_c, pk_c = quoted(connection, model, "version", "pk")
            columns = [(quote(field.column), str(kind)) for field, kind in zip(fields, kinds, strict=True)]
            _ROWS_UPDATES[key] = row_sql.rows_update(table, (pk_c, pk_kind), version_c, columns)
    return _ROWS_UPDATES[key]


def _carried_as_json(field: Any) -> bool:
    """Whether ``update_rows``' JSON document carries the field's values as the database takes them: a field of a
    kind it knows, Django's own class (a subclass may convert its values its own way), without an encoder of its own
    (a JSONField's: the document is written by ``json.dumps``)."""
    return (
        field is not None
        and type(field).__module__.startswith("django.db.models.fields")
        and field.get_internal_type() in _AS_JSON
        and getattr(field, "encoder", None) is None
    )


_ROWS_UPDATES: dict[tuple[Any, ...], str | None] = cache_dict()


# A finish's UPDATE by (model, field names, vendor): the same few statements come back for every row, and
# looking up and quoting their fields cost as much Python as the rest of a finishing transaction.
_ROW_UPDATES: dict[tuple[Any, ...], tuple[str, list[Any]] | None] = cache_dict()


def _row_update(
    model: type[models.Model], connection: BaseDatabaseWrapper, names: tuple[str, ...]
) -> tuple[str, list[Any]] | None:
    """Return ``update_row``'s statement for ``names`` and their fields, or None where the ORM must write."""
    key = (model, names, connection.vendor)
    if key not in _ROW_UPDATES:
        fields = [writable_field(model, name) for name in names]
        if any(field is None for field in fields):
            _ROW_UPDATES[key] = None
        else:
            parts = [f"{connection.ops.quote_name(field.column)} = %s" for field in fields]
            table, version_c, pk_c = quoted(connection, model, "version", "pk")
            sql = row_sql.row_update(table, parts, version_c, pk_c)
            _ROW_UPDATES[key] = (sql, fields)
    return _ROW_UPDATES[key]


def writable_field(model: type[models.Model], name: str) -> Any:
    """Return the model's field ``name`` if a plain ``column = %s`` writes it, else None (the ORM must)."""
    opts = model._meta
    try:
        field: Any = opts.get_field(name)
    except FieldDoesNotExist:
        return None
    if not field.concrete or field.many_to_many or field.model._meta.concrete_model is not opts.concrete_model:
        return None
    return field


def prepared(field: Any, value: Any, connection: BaseDatabaseWrapper) -> Any:
    """Return ``value`` as the database takes it for ``field`` (a model instance as its key)."""
    if value is not None and field.remote_field and hasattr(value, "prepare_database_save"):
        value = value.prepare_database_save(field)
    return field.get_db_prep_save(value, connection)
