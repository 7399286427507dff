"""The statements of Django tasks on PostgreSQL: a task's INSERT with its kick, and the tasks' claim, alone or
riding in a run's start (``_runs.task_claim``)."""

from __future__ import annotations

from typing import Any

from . import table
from .runs import bookkeeping_commit, kick_cte

#: The claim's order of the rows it answers: the claim index's (higher priority, then due, then enqueue order).
CLAIM_ORDER = "picked.priority DESC, picked.due, picked.id"


def insert(connection: Any, columns: list[str], pk: str, *, with_kick: bool) -> str:
    """A task row's INSERT, answering its pk; ``with_kick``: the kick's row and NOTIFY in the same statement.

    ``columns``: quoted, in the order of the parameters ``v0``, ``v1``…; then ``name`` (the job), ``channel``.
    """
    values = ", ".join(f"%(v{index})s" for index in range(len(columns)))
    sql = (
        f"INSERT INTO {table(connection, 'QueuedTask')} ({', '.join(columns)}) VALUES ({values}) "  # noqa: S608
        f"RETURNING {pk}"
    )
    if not with_kick:
        return sql
    notify = "SELECT task.*, pg_notify(%(channel)s, %(name)s) FROM task"
    return f"WITH task AS ({sql}), {kick_cte(connection)} {notify}"  # noqa: S608  quoted names


def claim_ctes(connection: Any, due_now: str, *, start: bool) -> str:
    """The tasks' claim as WITH items: ``picked`` (the locking read) and ``leased`` (its UPDATE).

    ``due_now``: the state's condition with ``%(now)s`` and its fixed parameters by name. The read takes due rows
    in claim order with SKIP LOCKED through the claim index; the UPDATE gives each one more attempt, a new
    version and ``due`` from the array of the backoff's instants (``%(dues)s``, by the attempts before the claim,
    the last for any count past it: ``backoff.row_backoffs``). Its commit does not wait for the WAL flush.

    ``start``: the claim rides in a run's start. Its read is gated on the start having taken the lease
    (``taken``), and its UPDATE also starts the first task in claim order unless that claim was past
    ``%(max_attempts)s``: ``%(running)s``, ``started_at`` (kept from an earlier attempt) and ``last_attempted_at``
    the statement's time, ``%(worker)s`` appended to ``worker_ids``. ``leased.started_now`` tells which row.
    Other parameters: ``backend``, ``queue``, ``limit``, ``last`` (the array's last index).
    """
    tasks = table(connection, "QueuedTask")
    gate, starts, returning = "", "", "task.*"
    if start:
        gate = "AND EXISTS (SELECT 1 FROM taken) "
        # The task's attempts left (max_attempts - attempts after the claim) >= 0, from the attempts before it.
        first = "(first_task.id = task.id AND %(max_attempts)s > task.attempts)"
        starts = (
            f", status = CASE WHEN {first} THEN %(running)s ELSE task.status END, "
            f"started_at = CASE WHEN {first} THEN COALESCE(task.started_at, statement_timestamp()) "
            "ELSE task.started_at END, "
            f"last_attempted_at = CASE WHEN {first} THEN statement_timestamp() ELSE task.last_attempted_at END, "
            f"worker_ids = CASE WHEN {first} THEN task.worker_ids || jsonb_build_array(%(worker)s::text) "
            "ELSE task.worker_ids END"
        )
        # RETURNING reads the row as updated: one attempt more than the SET's ``task.attempts``.
        returning = (
            "task.*, COALESCE(first_task.id = task.id AND %(max_attempts)s >= task.attempts, false) AS started_now"
        )
    joined = "picked LEFT JOIN first_task ON first_task.id = picked.id" if start else "picked"
    return (
        f"picked AS (SELECT id, priority, due FROM {tasks}{bookkeeping_commit()} "  # noqa: S608  quoted names
        f"WHERE backend = %(backend)s AND queue_name = %(queue)s AND {due_now} {gate}"
        f"ORDER BY priority DESC, due, id LIMIT %(limit)s FOR UPDATE OF {tasks} SKIP LOCKED), "
        + ("first_task AS (SELECT id FROM picked ORDER BY priority DESC, due, id LIMIT 1), " if start else "")
        + f"leased AS (UPDATE {tasks} AS task SET "  # noqa: S608  quoted names
        "due = (%(dues)s::timestamptz[])[LEAST(task.attempts, %(last)s) + 1], "
        f"attempts = task.attempts + 1, version = task.version + 1{starts} FROM {joined} "
        f"WHERE task.id = picked.id RETURNING {returning})"
    )


def claim_alone(ctes: str, columns: str) -> str:
    """The tasks' claim as a statement of its own: its WITH items and the claimed rows' ``columns``."""
    return f"WITH {ctes} SELECT {columns} FROM leased JOIN picked ON picked.id = leased.id ORDER BY {CLAIM_ORDER}"  # noqa: S608


def claim_at_start_tail(columns: str) -> str:
    """The tail of a start's answer when the tasks' claim rides in it: one row a claimed task (nulls for none)."""
    joins = "FROM recorded, taken LEFT JOIN (leased JOIN picked ON picked.id = leased.id) ON true"
    return f"{columns}, leased.started_now {joins} ORDER BY {CLAIM_ORDER}"
