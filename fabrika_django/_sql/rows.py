"""The statements on a queue table's rows that the claim and the finishes send by hand.

They are written here, not by the ORM, because compiling an UPDATE (and, for a batch, a condition on 500 pks)
cost more than running it. They write exactly what ``QuerySet.update()`` would; anything unusual (an
expression, a parent model's field) goes to the ORM. Every name passed in is quoted already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models import Model

    from . import SQLParam


def write_lock(quoted_table: str, quoted_column: str) -> str:
    """SQLite: a write that matches nothing, which takes the database write lock in the open transaction."""
    return f"UPDATE {quoted_table} SET {quoted_column} = {quoted_column} WHERE 1 = 0"  # noqa: S608  quoted names


def pks_in(connection: BaseDatabaseWrapper, column: str, pks: list[SQLParam]) -> tuple[str, list[SQLParam]]:
    """``column`` in ``pks`` as SQL and parameters."""
    if connection.vendor == "postgresql":
        # One array parameter, not a placeholder a row: psycopg's client-side binding parses a statement of
        # 500 placeholders again on every execution, which costs more than PostgreSQL takes to run it.
        return f"{column} = ANY(%s)", [pks]
    return f"{column} IN ({', '.join(['%s'] * len(pks))})", pks


def lease(table: str, due: str, attempts: str, version: str, due_sql: str, where: str) -> str:
    """A claim's lease of its rows: ``due`` set to ``due_sql``, one more attempt and version each.

    ``due`` comes first: MySQL and MariaDB evaluate a single-table UPDATE's assignments left to right, each
    seeing the ones before it, so a CASE on attempts placed after "attempts = attempts + 1" would match no WHEN.
    """
    return (
        f"UPDATE {table} SET {due} = {due_sql}, {attempts} = {attempts} + 1, {version} = {version} + 1 "  # noqa: S608
        f"WHERE {where}"
    )


def due_by_attempts(attempts: str, count: int) -> str:
    """A CASE on ``attempts`` with ``count`` pairs of parameters (attempts, due)."""
    return f"CASE {attempts}{' WHEN %s THEN %s' * count} END"


def row_update(table: str, parts: list[str], version: str, pk: str) -> str:
    """One row's versioned write. Parameters: the parts' values, the next version, the pk, the version read."""
    return f"UPDATE {table} SET {', '.join(parts)}, {version} = %s WHERE {pk} = %s AND {version} = %s"  # noqa: S608


def versioned_update(table: str, parts: list[str], version: str, where: str, returning: str | None) -> str:
    """A batch's write of ``parts`` with the version bumped, where ``where`` holds; answering ``returning``."""
    sql = f"UPDATE {table} SET {', '.join(parts)}, {version} = {version} + 1 WHERE {where}"  # noqa: S608
    return f"{sql} RETURNING {returning}" if returning else sql


def returning(sql: str, column: str) -> str:
    """An UPDATE the ORM compiled, answering ``column`` of each row it wrote (PostgreSQL, SQLite 3.35+)."""
    return f"{sql} RETURNING {column}"


def db_pks(model: type[Model], connection: BaseDatabaseWrapper, pks: list[SQLParam]) -> list[SQLParam]:
    """``pks`` as the database takes and answers them (integers as they are)."""
    from django.db import models

    field = model._meta.pk
    if isinstance(field, models.IntegerField):
        return list(pks)
    return [field.get_db_prep_value(pk, connection) for pk in pks]


def rows_update(table: str, pk: tuple[str, str], version: str, columns: list[tuple[str, str]]) -> str:
    """PostgreSQL: many rows' versioned writes in one statement, each row its own values.

    ``pk``: the quoted pk column and its type; ``columns``: each written column, quoted, and its type. One
    parameter, the rows as a JSON array of objects: each its pk (``pk_``), the version read (``version_``) and
    each column's value (``c0_``, ``c1_``...) as the column's type reads it from JSON. One JSON document, not a
    placeholder a value: psycopg's client-side binding quotes every value of every row on each execution, which
    cost more than the statement. Answers the pks written: a row whose version changed since is left as it is.
    """
    pk_column, pk_type = pk
    kinds = [f"pk_ {pk_type}", "version_ integer", *(f"c{index}_ {kind}" for index, (_c, kind) in enumerate(columns))]
    sets = [f"{column} = given.c{index}_" for index, (column, _kind) in enumerate(columns)]
    return (
        f"UPDATE {table} SET {', '.join(sets)}, {version} = given.version_ + 1 "  # noqa: S608  quoted names
        f"FROM jsonb_to_recordset(%s::jsonb) AS given({', '.join(kinds)}) "
        f"WHERE {table}.{pk_column} = given.pk_ AND {table}.{version} = given.version_ RETURNING {table}.{pk_column}"
    )
