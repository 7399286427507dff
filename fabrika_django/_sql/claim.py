"""The claim's statements: PostgreSQL's claim in one statement, the lease's UPDATE is ``rows``', and the index
named in MariaDB's locking read.

PostgreSQL's claim is one set of WITH items for every queue table, Django tasks' included (``_runs.claim``):
``picked``, the locking read in claim order with SKIP LOCKED, and ``leased``, its UPDATE: one more attempt, a
new version and ``due`` picked from the array of the backoff's instants by the attempts before the claim (the
last for any count past it: ``backoff.row_backoffs``). A run in lanes adds ``asked`` (the lane ask with its
NOTIFY, written only for a full claim); a task queue's first claim in its run's start adds ``first_claimed``
and the task's start (``tasks.START_FIRST``). Parameters are named: the condition's own, ``now``, ``limit``,
``backoffs`` (each attempt's backoff in microseconds) and ``last`` (the array's last index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .runs import bookkeeping_commit

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

#: The claim order's columns as ``picked`` and ``leased`` answer them, numbered: ``claim_order_0_``...
ORDER_ALIAS = "claim_order_{}_"


@dataclass(frozen=True)
class Table:
    """The quoted names a claim's statement uses: the table, then its ``due``, ``attempts``, ``version`` and pk."""

    table: str
    due: str
    attempts: str
    version: str
    pk: str


@dataclass(frozen=True)
class Extra:
    """What a claim riding in a run's start adds (``tasks.START_FIRST``): a WITH item over ``picked`` (before
    ``leased``), the join it makes in the UPDATE's FROM, more of the SET and of the RETURNING; and the gate on the
    read (the start took the lease)."""

    cte: str
    join: str
    sets: str
    returning: str
    gate: str


def ctes(
    connection: BaseDatabaseWrapper,
    names: Table,
    condition: str,
    order: list[tuple[str, bool]],
    returned: list[str],
    *,
    ask: str | None = None,
    extra: Extra | None = None,
) -> str:
    """The claim's WITH items (see the module's docstring).

    ``condition``: "due now" and the claim's ``where``, on unqualified columns, with named parameters;
    ``order``: the quoted claim-order columns, each with whether it runs descending; ``returned``: the quoted
    columns the claim answers; ``ask``: the lane ask's UPDATE, whose own parameters it names, to which the
    statement adds ``channel`` and ``job``.
    """
    ordered = [f"{column} AS {ORDER_ALIAS.format(index)}" for index, (column, _desc) in enumerate(order)]
    by_order = ", ".join(f"{column}{' DESC' if desc else ''}" for column, desc in order)
    gate = f" AND {extra.gate}" if extra is not None else ""
    items = [
        f"picked AS (SELECT {names.pk} AS claim_pk_, {', '.join(ordered)} "  # noqa: S608  quoted names
        f"FROM {names.table}{bookkeeping_commit()} WHERE {condition}{gate} "
        f"ORDER BY {by_order} LIMIT %(limit)s FOR UPDATE OF {names.table} SKIP LOCKED)"
    ]
    if extra is not None:
        items.append(extra.cte)
    answers = [f"claimed.{column}" for column in returned]
    answers += [f"picked.{ORDER_ALIAS.format(index)}" for index in range(len(order))]
    if extra is not None:
        answers.append(extra.returning)
    sets = (
        # The backoff of the row's attempt, in whole microseconds, after the claim's now: exactly the instants
        # the worker computes (``claim_params``), without sending each one.
        f"{names.due} = %(now)s::timestamptz + "
        f"(%(backoffs)s::bigint[])[LEAST(claimed.{names.attempts}, %(last)s) + 1] * interval '1 microsecond', "
        f"{names.attempts} = claimed.{names.attempts} + 1, {names.version} = claimed.{names.version} + 1"
    )
    items.append(
        f"leased AS (UPDATE {names.table} AS claimed SET {sets}{extra.sets if extra else ''} "  # noqa: S608
        f"FROM picked{extra.join if extra else ''} WHERE claimed.{names.pk} = picked.claim_pk_ "
        f"RETURNING {', '.join(answers)})"
    )
    if ask is not None:
        full = "(SELECT count(*) FROM picked) >= %(limit)s"
        items.append(f"asked AS ({ask} AND {full} RETURNING pg_notify(%(channel)s, %(job)s))")
    return ", ".join(items)


def answer(returned: list[str], order: list[tuple[str, bool]]) -> tuple[str, str]:
    """The claimed rows' columns as ``leased`` answers them, and their order: the claim's."""
    columns = ", ".join(f"leased.{column}" for column in returned)
    by_order = ", ".join(
        f"leased.{ORDER_ALIAS.format(index)}{' DESC' if desc else ''}" for index, (_column, desc) in enumerate(order)
    )
    return columns, by_order


def alone(items: str, columns: str, by_order: str) -> str:
    """The claim as a statement of its own: its WITH items, the claimed rows in claim order."""
    return f"WITH {items} SELECT {columns} FROM leased ORDER BY {by_order}"  # noqa: S608  quoted names


def force_index(sql: str, table: str, index: str) -> str:
    """MariaDB/MySQL: the claim's locking read as the ORM compiled it, with its index in claim order named.

    Django has no public API for an index hint, so the one hint is written into the compiled SQL: after the
    first ``FROM <table>``, which the compiler writes exactly so for a query on one table (its own quoting of the
    name). ``tests/test_django_seams.py`` checks that a compiled claim still reads so, on every Django the suite
    runs.
    """
    return sql.replace(f"FROM {table}", f"FROM {table} FORCE INDEX ({index})", 1)
