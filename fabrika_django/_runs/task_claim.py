"""The tasks' claim: due task rows of one backend's queue, in claim order, on PostgreSQL in one prepared
statement (alone, or riding in the start of a kicked run), elsewhere through ``claim()``.

It does what ``claim()`` does (the same rows, order, backoff, attempts and version; the table remembered for
requeue kicks; the claim's metric) in one round trip instead of four (BEGIN, the locking read, the UPDATE,
COMMIT) and without compiling a query: a task's start waits for its claim.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import connections, router
from django.db.models import Q
from django.utils import timezone

from .. import _metrics
from .._queuestate import max_attempts_of, state_sql
from .._running import active_run, framework_write
from .._sql import SAMPLE_NOW, Compiled, cache, prepared
from .._sql import tasks as task_sql
from .._tasks_compat import (
    task_backends,
)
from .claim import backoffs

logger = logging.getLogger(__name__)


#: Rows a claim takes at once: few, because a claimed row counts an attempt even if the run ends before it.
_BATCH = 10


def _claim(alias: str, queue: str, where: Q) -> list[Any]:
    """Claim the queue's due tasks: on PostgreSQL one prepared statement in autocommit, elsewhere ``claim()``.

    It does what ``claim()`` does (the same rows, order, backoff, attempts and version; the table remembered for
    requeue kicks; the claim's metric) in one round trip instead of four (BEGIN, the locking read, the UPDATE,
    COMMIT) and without compiling a query: a task's start waits for its claim.
    """
    from ..models import QueuedTask

    run = active_run()
    using = router.db_for_write(QueuedTask)
    connection = connections[using]
    # A rate-limited queue claims through claim(), where its token bucket is (``ratelimit``).
    if run is None or connection.vendor != "postgresql" or run.job.rate_limit is not None:
        return list(QueuedTask.objects.claim(limit=_BATCH, where=where))
    sql, fixed = _claim_sql(using)
    with framework_write():
        found = prepared.fetchall(connection, sql, {**fixed, **_claim_params(alias, queue, run.now(), run.job)})
    return _claimed_rows(run, using, found)


def _claim_params(alias: str, queue: str, now: datetime, job: Any) -> dict[str, Any]:
    """The claim's parameters that change: the queue, the run's ``now``, the batch and the backoff's instants."""
    from ..models import QueuedTask

    dues = [now + backoff for backoff in backoffs(job.period, max_attempts_of(QueuedTask))]
    return {"backend": alias, "queue": queue, "now": now, "limit": _BATCH, "dues": dues, "last": len(dues) - 1}


def _claimed_rows(run: Any, using: str, found: list[tuple[Any, ...]]) -> list[Any]:
    """The claimed rows as ``QueuedTask`` instances; the table remembered for requeue kicks; the claim's metric.

    A row whose columns cannot be decoded (JSON nested deeper than Python's decoder follows, written outside
    ``enqueue()``) is given up alone (``_give_up_undecodable``) and left out: its neighbours run.
    """
    from ..models import QueuedTask

    run.claimed.add((using, QueuedTask._meta.label))  # a requeue of this table kicks the job (_claimers)
    fields, convert = _claim_fields(using)
    names = [field.attname for field in fields]
    rows = []
    for values in found:
        try:
            row = QueuedTask.from_db(using, names, convert(values))
        except (RecursionError, ValueError):
            _give_up_undecodable(using, fields, values)
            continue
        rows.append(row)
    _metrics.observe_claim(run.job.name, len(found))
    return rows


def _give_up_undecodable(using: str, fields: list[Any], values: tuple[Any, ...]) -> None:
    """Give up a claimed task row the worker cannot decode: FAILED at once, by its id and claimed version.

    No retry can help (the row is the same on every claim), and it must not stay RUNNING when the run's start
    statement marked it so. Logged by id and a fixed code; the row's columns are never read into memory.
    """
    from ..models import TASK_ATTEMPTS_CEILING, QueuedTask, TaskStatus

    by_name = dict(zip((field.attname for field in fields), values, strict=True))
    with framework_write():
        QueuedTask.objects.using(using).filter(pk=by_name["id"], version=by_name["version"]).update(
            status=TaskStatus.FAILED,
            finished_at=timezone.now(),
            attempts=TASK_ATTEMPTS_CEILING,
            last_failure="task_undecodable",
            version=by_name["version"] + 1,
        )
    logger.warning("Task given up task=%s code=task_undecodable", by_name["result_id"])


def claimed_at_start() -> list[Any] | None:
    """The first batch, when the run's start claimed it in its own statement (``claim_at_start``); else None.

    Each row the start answered ends with its ``started_now`` flag: true for the first task, which that
    statement marked RUNNING (``run_task`` does not mark it again).
    """
    run = active_run()
    found = run.state.claimed_at_start if run is not None and run.state is not None else None
    if run is None or run.state is None or found is None:
        return None
    run.state.claimed_at_start = None  # the first attempt's only: a retry claims afresh
    alias, answered = found
    rows = _claimed_rows(run, alias, [values[:-1] for values in answered])
    started = {values[0]: bool(values[-1]) for values in answered}  # by id, the answer's first column
    for row in rows:
        row._started_now = started[row.pk]
    return rows


def claim_at_start(alias: str, queue: str) -> Callable[[Any, datetime, Any], tuple[str, str, dict[str, Any]]]:
    """The first claim of a kicked run of the queue's job, to ride in its start's statement on PostgreSQL
    (``_running.CLAIMS_AT_START``): one statement from a kick's NOTIFY to the first task marked RUNNING, where
    there were three (the start, the claim, the task's RUNNING).

    The answer, for the connection, the run's ``now`` and the job: the claim's WITH items, gated on the start
    having taken the lease (``taken``: a start that finds the job busy claims nothing), the tail of its answer
    (columns, joins and order) and its parameters. The statement also marks the first claimed task RUNNING as
    ``run_task`` would (``_sql.tasks.claim_ctes``' ``start``): the lease it took in the same statement is the fence.
    """

    def claim(connection: Any, now: datetime, job: Any) -> tuple[str, str, dict[str, Any]]:
        from ..models import TaskStatus

        backend: Any = task_backends[alias]
        ctes, columns, fixed = _claim_pieces(connection.alias, start=True)
        params = {"max_attempts": backend.max_attempts, "worker": backend.worker_id, "running": TaskStatus.RUNNING}
        return ctes, task_sql.claim_at_start_tail(columns), {**fixed, **_claim_params(alias, queue, now, job), **params}

    return claim


@cache(maxsize=4)
def _claim_sql(using: str) -> tuple[str, dict[str, Any]]:
    """The claim as a statement of its own, and the values of its fixed parameters."""
    ctes, columns, fixed = _claim_pieces(using)
    return task_sql.claim_alone(ctes, columns), fixed


@cache(maxsize=8)
def _claim_pieces(using: str, start: bool = False) -> tuple[str, str, dict[str, Any]]:
    """The tasks' claim on PostgreSQL (``_sql.tasks.claim_ctes``): its WITH items, its answer's columns and the
    values of its fixed parameters. "Due now" is ``_queuestate``'s, compiled once with ``%(now)s`` in it.

    Its commit does not wait for the WAL flush (for its own transaction only). Alone, a task's start is a durable
    commit (``RUNNING``, ``_start``) that follows before the task's function runs and flushes the claim with it,
    the WAL being written in order; a claim lost in a database crash before that left no trace the task ran: its
    rows are due again with the attempt not counted, as if never claimed. In a start statement the first task's
    RUNNING is in that commit too: a crash within the WAL writer's delay (``wal_writer_delay``, 200 ms by
    default) after it may forget that the task started, and the task then runs again with that attempt not
    counted, as a task whose worker was killed runs again; its first durable write (its own, or its
    SUCCESSFUL) flushes the start with it.
    """
    from ..models import QueuedTask

    connection = connections[using]
    quote = connection.ops.quote_name
    columns = ", ".join(f"leased.{quote(str(field.column))}" for field in QueuedTask._meta.concrete_fields)
    due_now, fixed = Compiled(*state_sql(QueuedTask, "due_now", SAMPLE_NOW, connection), SAMPLE_NOW).named()
    return task_sql.claim_ctes(connection, due_now, start=start), columns, fixed


@cache(maxsize=4)
def _claim_fields(using: str) -> tuple[list[Any], Callable[[tuple[Any, ...]], list[Any]]]:
    """The claim's answer: its fields in column order, and the converter of a row it answers."""
    from ..models import QueuedTask

    connection = connections[using]
    fields = list(QueuedTask._meta.concrete_fields)
    # Only the columns that have converters, each with its expression made once: a task's start waits for this.
    converting: list[tuple[int, Any, list[Any]]] = []
    for index, field in enumerate(fields):
        column = field.get_col(QueuedTask._meta.db_table)
        field_converters = connection.ops.get_db_converters(column) + field.get_db_converters(connection)
        if field_converters:
            converting.append((index, column, field_converters))

    def convert(values: tuple[Any, ...]) -> list[Any]:
        converted = list(values)
        for index, column, field_converters in converting:
            value = converted[index]
            for converter in field_converters:
                value = converter(value, column, connection)
            converted[index] = value
        return converted

    return fields, convert
