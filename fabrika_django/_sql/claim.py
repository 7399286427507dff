"""The claim's statements: the one-statement claim on PostgreSQL, and the index named in MariaDB's read.

The lease's UPDATE and the finishes' writes are ``rows``'; the tasks' claim is ``tasks``'.
"""

from __future__ import annotations

from typing import Any


def in_one(connection: Any, names: list[str], fields: list[Any], condition: str, ask: str | None) -> str:
    """PostgreSQL's claim of a queue table in one statement (``_runs.claim``): the locking read, the lease's
    UPDATE and, with ``ask`` (the lane ask's UPDATE), the ask with its NOTIFY, written only for a full claim.

    ``names``: the quoted table, ``due``, ``attempts``, ``version`` and pk columns; ``fields``: those answered, in
    order; ``condition``: "due now" with its two parameters. Parameters, in order: "due now"'s max_attempts and
    now, the limit, the array of new ``due`` instants and its last index; with the ask, the ask's own
    parameters, the limit again, the channel and the job's name.
    """
    quote = connection.ops.quote_name
    table, due_c, attempts_c, version_c, pk_c = names
    returned = ", ".join(f"claimed.{quote(str(field.column))}" for field in fields)
    ctes = (
        f"picked AS (SELECT {pk_c} AS pk_, {due_c} AS due_ FROM {table} WHERE {condition} "  # noqa: S608  quoted names
        f"ORDER BY {due_c}, {pk_c} LIMIT %s FOR UPDATE OF {table} SKIP LOCKED), "
        f"leased AS (UPDATE {table} AS claimed "
        f"SET {due_c} = (%s::timestamptz[])[LEAST(claimed.{attempts_c}, %s) + 1], "
        f"{attempts_c} = claimed.{attempts_c} + 1, {version_c} = claimed.{version_c} + 1 "
        f"FROM picked WHERE claimed.{pk_c} = picked.pk_ RETURNING {returned}, picked.due_, picked.pk_)"
    )
    if ask is not None:
        ctes += f", asked AS ({ask} AND (SELECT count(*) FROM picked) >= %s RETURNING pg_notify(%s, %s))"  # noqa: S608
    answer = ", ".join(f"leased.{quote(str(field.column))}" for field in fields)
    return f"WITH {ctes} SELECT {answer} FROM leased ORDER BY leased.due_, leased.pk_"  # noqa: S608  quoted names


def force_index(sql: str, table: str, index: str) -> str:
    """MariaDB/MySQL: the claim's locking read as the ORM compiled it, with its index in claim order named.

    Django has no public API for an index hint, so the one hint is written into the compiled SQL: after the
    first ``FROM <table>``, which the compiler writes exactly so for a query on one table (its own quoting of the
    name). ``tests/test_layout.py`` checks that a compiled claim still reads so, on every Django the suite runs.
    """
    return sql.replace(f"FROM {table}", f"FROM {table} FORCE INDEX ({index})", 1)
