"""What a Django task queue's built-in job does: claim due task rows in claim order and run each.

One task, in the job's attempt:
1. RUNNING, with ``started_at``, ``last_attempted_at`` and the worker's id, while the job's lease holds;
2. the task's function, as plain Django code (no write guard, no fence: ``outside_run``);
3. SUCCESSFUL with its JSON return value, or the failed attempt's ``TaskError`` (class path and frames,
   no message unless ``STORE_ERROR_MESSAGES``): READY again after the claim's backoff while attempts remain,
   else FAILED, a dead row a person requeues.
A task whose worker died mid-task is RUNNING with its claim's backoff as ``due``: once the job's lease
expired, a later run claims it again (one more attempt), or gives it up when that was its last.
"""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db import connections, router
from django.db.models import Q
from django.utils import timezone
from django.utils.module_loading import import_string

from . import _metrics
from ._queuestate import state_sql
from ._running import active_run, framework_write, is_ctrl_c, outside_run
from ._sql import prepared
from ._tasks_compat import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from .backoff import MAX_ROW_BACKOFF
from .conf import settings
from .exceptions import VersionConflict
from .kicks import request_run

logger = logging.getLogger(__name__)

#: Rows a claim takes at once: few, because a claimed row counts an attempt even if the run ends before it.
_BATCH = 10
#: The class path recorded when an attempt never reported back (its worker was killed or cut off).
_LOST = "fabrika_django.exceptions.LeaseLost"


def serve_queue(ctx: Any, alias: str, queue: str) -> None:
    """Run the due tasks of one backend's queue, highest priority first, until none is due.

    A task is started only while the attempt has at least the backend's ``timeout`` left (the attempt has
    twice that); past it, the claimed rest is given back and the job marked pending, so the next run under
    the same lease goes on.
    """

    backend: Any = task_backends[alias]  # a FabrikaBackend: its timeout, max_attempts, worker_id
    minimum = backend.timeout.total_seconds()
    where = Q(backend=alias, queue_name=queue)
    first = _claimed_at_start(ctx)
    while True:
        # An empty first batch is claimed again at once: the start's ``now`` was read before its statement, so a
        # row made due between the two (a requeue, whose kick that statement took) was not due to it.
        rows = first or _claim(alias, queue, where)
        first = None
        if not rows:
            return
        for index, row in enumerate(rows):
            if ctx.signal.remaining() < minimum:
                ctx.signal.throw_if_aborted()
                _give_back(ctx, rows[index:])
                with framework_write():
                    request_run(ctx.job.name)
                return
            run_task(ctx, backend, row)


def _claim(alias: str, queue: str, where: Q) -> list[Any]:
    """Claim the queue's due tasks: on PostgreSQL one prepared statement in autocommit, elsewhere ``claim()``.

    It does what ``claim()`` does (the same rows, order, backoff, attempts and version; the table remembered for
    requeue kicks; the claim's metric) in one round trip instead of four (BEGIN, the locking read, the UPDATE,
    COMMIT) and without compiling a query: a task's start waits for its claim.
    """
    from .models import QueuedTask

    run = active_run()
    using = router.db_for_write(QueuedTask)
    connection = connections[using]
    if run is None or connection.vendor != "postgresql":
        return list(QueuedTask.objects.claim(limit=_BATCH, where=where))
    sql, fixed, _fields, _convert = _claim_sql(using)
    with framework_write():
        found = prepared.fetchall(connection, sql, {**fixed, **_claim_params(alias, queue, run.now(), run.job)})
    return _claimed_rows(run, using, found)


def _claim_params(alias: str, queue: str, now: datetime, job: Any) -> dict[str, Any]:
    """The claim's parameters that change: the queue, the run's ``now``, the batch and the backoff's terms."""
    return {
        "backend": alias,
        "queue": queue,
        "now": now,
        "limit": _BATCH,
        "period": job.period.total_seconds(),
        "cap": MAX_ROW_BACKOFF.total_seconds(),
    }


def _claimed_rows(run: Any, using: str, found: list[tuple[Any, ...]]) -> list[Any]:
    """The claimed rows as ``QueuedTask`` instances; the table remembered for requeue kicks; the claim's metric.

    A row whose columns cannot be decoded (JSON nested deeper than Python's decoder follows, written outside
    ``enqueue()``) is given up alone (``_give_up_undecodable``) and left out: its neighbours run.
    """
    from .models import QueuedTask

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
    from .models import TASK_ATTEMPTS_CEILING, QueuedTask, TaskStatus

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


def _claimed_at_start(ctx: Any) -> list[Any] | None:
    """The first batch, when the run's start claimed it in its own statement (``claim_at_start``); else None.

    Each row the start answered ends with its ``started_now`` flag: true for the first task, which that
    statement marked RUNNING (``run_task`` does not mark it again).
    """
    found = ctx._claimed_at_start
    run = active_run()
    if found is None or run is None:
        return None
    ctx._claimed_at_start = None  # the first attempt's only: a retry claims afresh
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
    ``run_task`` would (``_claim_pieces``' ``start``): the lease it took in the same statement is the fence.
    """

    def claim(connection: Any, now: datetime, job: Any) -> tuple[str, str, dict[str, Any]]:
        backend: Any = task_backends[alias]
        ctes, columns, order, fixed = _claim_pieces(connection.alias, start=True)
        joins = "FROM recorded, taken LEFT JOIN (leased JOIN picked ON picked.id = leased.id) ON true"
        tail = f"{columns}, leased.started_now {joins} ORDER BY {order}"
        params = {"max_attempts": backend.max_attempts, "worker": backend.worker_id}
        return ctes, tail, {**fixed, **_claim_params(alias, queue, now, job), **params}

    return claim


#: Stands for the claim's ``now`` while its condition is compiled once (``_claim_sql``).
_NOW = datetime(2000, 1, 1, tzinfo=UTC)


@functools.lru_cache(maxsize=4)
def _claim_sql(using: str) -> tuple[str, dict[str, Any], list[Any], Callable[[tuple[Any, ...]], list[Any]]]:
    """The claim as a statement of its own: ``_claim_pieces`` put together (see there)."""
    ctes, columns, order, fixed = _claim_pieces(using)
    fields, convert = _claim_fields(using)
    sql = f"WITH {ctes} SELECT {columns} FROM leased JOIN picked ON picked.id = leased.id ORDER BY {order}"  # noqa: S608
    return sql, fixed, fields, convert


@functools.lru_cache(maxsize=8)
def _claim_pieces(using: str, start: bool = False) -> tuple[str, str, str, dict[str, Any]]:
    """The tasks' claim on PostgreSQL: its WITH items, its answer's columns, its order, and the values of its fixed
    parameters. "Due now" is ``_queuestate``'s, compiled once with ``%(now)s`` in it.

    The locking read takes due rows in claim order (higher priority, then due, then enqueue order) with SKIP
    LOCKED through the claim index; the UPDATE gives each one more attempt, a new version and ``due`` moved by
    the backoff ``min(period * 2**attempts_before, cap)``, as ``backoff.row_backoff``; the answer keeps claim order.

    ``start``: the claim rides in a run's start statement (``claim_at_start``). Its locking read is gated on the
    start having taken the lease, and its UPDATE also starts the first task in claim order, as ``run_task``
    would: RUNNING, ``started_at`` (kept from an earlier attempt) and ``last_attempted_at`` the statement's time,
    the worker's id appended, unless that claim was past ``%(max_attempts)s`` (``run_task`` gives such a task
    up). ``leased.started_now`` tells which row it started.

    Its commit does not wait for the WAL flush (for its own transaction only). Alone, a task's start is a durable
    commit (``RUNNING``, ``_start``) that follows before the task's function runs and flushes the claim with it,
    the WAL being written in order; a claim lost in a database crash before that left no trace the task ran: its
    rows are due again with the attempt not counted, as if never claimed. In a start statement the first task's
    RUNNING is in that commit too: a crash within the WAL writer's delay (``wal_writer_delay``, 200 ms by
    default) after it may forget that the task started, and the task then runs again with that attempt not
    counted, as a task whose worker was killed runs again; its first durable write (its own, or its
    SUCCESSFUL) flushes the start with it.
    """
    from .models import QueuedTask, TaskStatus

    connection = connections[using]
    quote = connection.ops.quote_name
    table = quote(QueuedTask._meta.db_table)
    columns = ", ".join(f"leased.{quote(str(field.column))}" for field in QueuedTask._meta.concrete_fields)
    condition, values = state_sql(QueuedTask, "due_now", _NOW, connection)
    pieces = condition.split("%s")
    fixed: dict[str, Any] = {}
    due_now = pieces[0]
    for index, value in enumerate(values):
        key = "now" if value == _NOW else f"state{index}"
        if key != "now":
            fixed[key] = value
        due_now += f"%({key})s{pieces[index + 1]}"
    gate, starts, returning = "", "", "task.*"
    if start:
        gate = "AND EXISTS (SELECT 1 FROM taken) "
        # ``_attempts_left`` of the claimed row >= 0, from the attempts before the claim (the SET's).
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
        fixed["running"] = TaskStatus.RUNNING.value
    joined = "picked LEFT JOIN first_task ON first_task.id = picked.id" if start else "picked"
    ctes = (
        f"picked AS (SELECT id, priority, due FROM {table}, "  # noqa: S608  quoted names
        "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit "
        f"WHERE backend = %(backend)s AND queue_name = %(queue)s AND {due_now} {gate}"
        f"ORDER BY priority DESC, due, id LIMIT %(limit)s FOR UPDATE OF {table} SKIP LOCKED), "
        + ("first_task AS (SELECT id FROM picked ORDER BY priority DESC, due, id LIMIT 1), " if start else "")
        + f"leased AS (UPDATE {table} AS task SET "  # noqa: S608  quoted names
        "due = %(now)s + LEAST(%(period)s * power(2, task.attempts), %(cap)s) * interval '1 second', "
        f"attempts = task.attempts + 1, version = task.version + 1{starts} FROM {joined} "
        f"WHERE task.id = picked.id RETURNING {returning})"
    )
    return ctes, columns, "picked.priority DESC, picked.due, picked.id", fixed


@functools.lru_cache(maxsize=4)
def _claim_fields(using: str) -> tuple[list[Any], Callable[[tuple[Any, ...]], list[Any]]]:
    """The claim's answer: its fields in column order, and the converter of a row it answers."""
    from .models import QueuedTask

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


def run_task(ctx: Any, backend: Any, row: Any) -> None:
    """Run one claimed task row and record how it ended (see the module's docstring)."""
    from .models import TASK_ATTEMPTS_CEILING, TaskStatus

    now = timezone.now()
    if _attempts_left(row, backend) < 0:
        # Its last attempt never reported back: give it up rather than run it past max_attempts.
        lost = {"exception_class_path": _LOST, "traceback": ""}
        _record(
            ctx,
            row,
            status=TaskStatus.FAILED,
            finished_at=now,
            errors=[*row.errors, lost],
            attempts=TASK_ATTEMPTS_CEILING,
            last_failure="task_lost",
        )
        logger.warning("Task given up task=%s attempts=%d code=task_lost", row.result_id, row.attempts - 1)
        _send_finished(backend, row)
        return
    if getattr(row, "_started_now", False):  # the run's start statement marked it RUNNING (claim_at_start)
        _check_started(ctx, row)
    else:
        started = _start(
            ctx,
            row,
            status=TaskStatus.RUNNING,
            started_at=row.started_at or now,
            last_attempted_at=now,
            worker_ids=[*row.worker_ids, backend.worker_id],
        )
        if not started:
            return
    try:
        task = task_of(row)
        result = result_of(row, task)
        task_started.send(type(backend), task_result=result)
        with outside_run():
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *row.args, **row.kwargs)
            else:
                value = task.call(*row.args, **row.kwargs)
        value = _json(value, row)
    except BaseException as exc:  # noqa: B036  what the task raised is its failed attempt, SystemExit too
        if is_ctrl_c(exc):
            raise
        _fail(ctx, backend, row, exc)
    else:
        _finish(ctx, row, value)
    _send_finished(backend, row)


def _json(value: Any, row: Any) -> Any:
    try:
        return normalize_json(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"Task {row.task_path} returned a {type(value).__name__}, which is not JSON: "
            "return None, a bool, number, string, list or dict."
        ) from exc


def _finish(ctx: Any, row: Any, value: Any) -> None:
    from .models import TaskStatus

    _record(ctx, row, status=TaskStatus.SUCCESSFUL, finished_at=timezone.now(), return_value=value, due=None)


def _fail(ctx: Any, backend: Any, row: Any, exc: BaseException) -> None:
    from .models import TASK_ATTEMPTS_CEILING, TaskStatus

    error = {"exception_class_path": _class_path(type(exc)), "traceback": _traceback(exc)}
    values: dict[str, Any] = {"errors": [*row.errors, error], "last_failure": "task_failed"}
    if _attempts_left(row, backend) <= 0:
        values.update(status=TaskStatus.FAILED, finished_at=timezone.now(), attempts=TASK_ATTEMPTS_CEILING)
    else:
        values["status"] = TaskStatus.READY  # due again after the claim's backoff
    logger.warning("Task attempt failed task=%s attempt=%d error=%s", row.result_id, row.attempts, type(exc).__name__)
    _record(ctx, row, **values)


def _attempts_left(row: Any, backend: Any) -> int:
    """Return the claims the task has left under its backend's ``max_attempts`` (below 0: one more than allowed).

    The task's own limit: the table's (``Queue.max_attempts``) is the ceiling a given-up task jumps to.
    """
    return int(backend.max_attempts - row.attempts)


def _record(ctx: Any, row: Any, **values: Any) -> bool:
    """Write ``values`` to the claimed row in one UPDATE checked against its version; False if it changed.

    Not a fenced transaction (three round trips): the version is the guard. A replacement run claims the row
    again (a new version) before it touches it, so a stale attempt's write then matches nothing; before
    that, what it writes is the truth about the attempt it made. Starting a task is fenced (``_start``).
    """
    with framework_write():
        try:
            row._write_versioned(values)
        except VersionConflict:
            logger.warning("Task changed since it was claimed task=%s code=version_conflict", row.result_id)
            return False
    return True


def _start(ctx: Any, row: Any, **values: Any) -> bool:
    """Mark the row RUNNING, unless the attempt's lease may have ended: a stale run never starts a task.

    The fence's own local check (the signal, and the time the last renewal is known to cover; no round trip):
    the lease cannot be taken over before it expires, and the UPDATE follows at once.
    """
    ctx._fence.check()
    return _record(ctx, row, **values)


def _check_started(ctx: Any, row: Any) -> None:
    """The fence's local check ``_start`` makes, for a task the run's start statement marked RUNNING: an attempt
    that ended since (a shutdown, its deadline) leaves the task READY, its claimed attempt counted as for any
    claimed row it does not start, rather than RUNNING with nobody running it until its backoff ends."""
    from .models import TaskStatus

    try:
        ctx._fence.check()
    except BaseException:
        _record(ctx, row, status=TaskStatus.READY)
        raise


def _give_back(ctx: Any, rows: list[Any]) -> None:
    """Undo the claim of rows this run will not start: due now, the claimed attempt not counted (READY again,
    for a task the run's start statement marked RUNNING)."""
    from .models import TaskStatus

    now = timezone.now()
    for row in rows:
        values: dict[str, Any] = {"due": now, "attempts": row.attempts - 1}
        if getattr(row, "_started_now", False):
            values["status"] = TaskStatus.READY
        _record(ctx, row, **values)


def _send_finished(backend: Any, row: Any) -> None:
    from .models import TaskStatus

    if row.status not in (TaskStatus.SUCCESSFUL, TaskStatus.FAILED):
        return  # an attempt failed, another follows: the task has not finished
    try:
        result = result_of(row)
    except Exception as exc:  # its function no longer imports: nobody can listen for it
        logger.warning("Task finished without its signal task=%s error=%s", row.result_id, type(exc).__name__)
        return
    task_finished.send(type(backend), task_result=result)


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _traceback(exc: BaseException) -> str:
    """Return the exception's traceback: its frames and class path, without its message unless stored."""
    if settings.STORE_ERROR_MESSAGES:
        return "".join(traceback.format_exception(exc))
    frames = "".join(traceback.format_list(traceback.extract_tb(exc.__traceback__)))
    return f"Traceback (most recent call last):\n{frames}{_class_path(type(exc))}\n"


def result_of(row: Any, task: Task | None = None) -> TaskResult:
    """Return the ``TaskResult`` a task row stands for (``task``: the enqueued one, else imported by path)."""
    result: TaskResult = TaskResult(
        task=task if task is not None else task_of(row),
        id=str(row.result_id),
        status=TaskResultStatus(row.status),
        enqueued_at=row.enqueued_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_attempted_at=row.last_attempted_at,
        args=row.args,
        kwargs=row.kwargs,
        backend=row.backend,
        errors=[TaskError(**error) for error in row.errors],
        worker_ids=list(row.worker_ids),
    )
    # The return value is the one field of Django's frozen TaskResult without an __init__ argument; its own
    # backends set it this way too.
    object.__setattr__(result, "_return_value", row.return_value)
    return result


def task_of(row: Any) -> Task:
    """Import the row's task by path, with the priority, queue, backend and run_after it was enqueued with."""
    from django.core.exceptions import SuspiciousOperation

    task = import_string(row.task_path)
    if not isinstance(task, Task):
        raise SuspiciousOperation(f"Task {row.result_id} names {row.task_path!r}, which is not a @task function.")
    return task.using(priority=row.priority, queue_name=row.queue_name, backend=row.backend, run_after=row.run_after)
