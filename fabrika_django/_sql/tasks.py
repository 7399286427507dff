"""The statements of Django tasks on PostgreSQL: a task's INSERT with its kick, and what the claim (``claim``,
every queue table's) adds when it rides in a run's start (``_runs.task_claim``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import table
from .claim import ORDER_ALIAS, Extra
from .runs import kick_cte

if TYPE_CHECKING:
    from . import SQLParam


def insert(
    connection: Any, columns: list[str], pk: str, *, with_kick: bool, fixed: Mapping[int, SQLParam] | None = None
) -> str:
    """A task row's INSERT, answering its pk; ``with_kick``: the kick's row and NOTIFY in the same statement.

    ``columns``: quoted, in the order of the parameters ``v0``, ``v1``…; then ``name`` (the job), ``channel``.
    ``fixed``: by column index, a database value the same for every row, written into the text as a literal
    (quoted by psycopg, as Django's schema editor quotes a default): a prepared statement takes it once, where a
    parameter is quoted into each ``EXECUTE`` (a client-side binding cursor's cost, about 2 µs a value).
    """
    fixed = fixed or {}
    context = connection.connection  # the values are quoted for this session (its encoding, string settings)
    values = ", ".join(
        _literal(fixed[index], context) if index in fixed else f"%(v{index})s" for index in range(len(columns))
    )
    sql = (
        f"INSERT INTO {table(connection, 'QueuedTask')} ({', '.join(columns)}) VALUES ({values}) "  # noqa: S608
        f"RETURNING {pk}"
    )
    if not with_kick:
        return sql
    notify = "SELECT task.*, pg_notify(%(channel)s, %(name)s) FROM task"
    return f"WITH task AS ({sql}), {kick_cte(connection)} {notify}"  # noqa: S608  quoted names


def _literal(value: SQLParam, context: Any) -> str:
    from psycopg.sql import quote  # the postgres extra's: not installed for SQLite-only projects

    # A literal's "%" would read as a placeholder: doubled, as the cursor's binding undoes it.
    return quote(value, context).replace("%", "%%")


def start_first(descending: list[bool]) -> Extra:
    """What the tasks' claim adds when it rides in a kicked run's start (``_runs.task_claim.claim_at_start``).

    The read is gated on the start having taken the lease (``taken``: a start that finds the job busy claims
    nothing), and the UPDATE also starts the first task in claim order unless that claim was past
    ``%(max_attempts)s``: ``%(running)s``, ``started_at`` (kept from an earlier attempt) and ``last_attempted_at``
    the statement's time, ``%(worker)s`` appended to ``worker_ids``. ``leased.started_now`` tells which row.
    ``descending``: for each column of the claim order, whether it runs descending.
    """
    # The task's attempts left (max_attempts - attempts after the claim) >= 0, from the attempts before it.
    first = "(first_claimed.claim_pk_ = claimed.id AND %(max_attempts)s > claimed.attempts)"
    order = ", ".join(f"{ORDER_ALIAS.format(index)}{' DESC' if desc else ''}" for index, desc in enumerate(descending))
    sets = (
        f", status = CASE WHEN {first} THEN %(running)s ELSE claimed.status END, "
        f"started_at = CASE WHEN {first} THEN COALESCE(claimed.started_at, statement_timestamp()) "
        "ELSE claimed.started_at END, "
        f"last_attempted_at = CASE WHEN {first} THEN statement_timestamp() ELSE claimed.last_attempted_at END, "
        f"worker_ids = CASE WHEN {first} THEN claimed.worker_ids || jsonb_build_array(%(worker)s::text) "
        "ELSE claimed.worker_ids END"
    )
    return Extra(
        cte=f"first_claimed AS (SELECT claim_pk_ FROM picked ORDER BY {order} LIMIT 1)",  # noqa: S608
        join=" LEFT JOIN first_claimed ON first_claimed.claim_pk_ = picked.claim_pk_",
        sets=sets,
        # RETURNING reads the row as updated: one attempt more than the SET's ``claimed.attempts``.
        returning=(
            "COALESCE(first_claimed.claim_pk_ = claimed.id AND "
            "%(max_attempts)s >= claimed.attempts, false) AS started_now"
        ),
        gate="EXISTS (SELECT 1 FROM taken)",
    )


def at_start_tail(columns: str, by_order: str) -> str:
    """The tail of a start's answer when the tasks' claim rides in it: one row a claimed task (nulls for none)."""
    return f"{columns}, leased.started_now FROM recorded, taken LEFT JOIN leased ON true ORDER BY {by_order}"
