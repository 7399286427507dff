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

import json
import logging
import traceback
from typing import Any

from django.core.exceptions import SuspiciousOperation
from django.utils import timezone

from .._running import active_run, framework_write, is_ctrl_c, outside_run
from .._task_paths import TaskNotRegistered, task_of
from .._tasks_compat import (
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
from ..conf import settings
from ..exceptions import VersionConflict

# Up a floor: a task run that leaves tasks behind asks for another run, as a kick does (kicks.py sits on the
# run machinery's pending flag, so the folder stands under it).
from ..kicks import request_run
from .task_claim import BATCH, claimed_at_start, where_of

logger = logging.getLogger(__name__)


#: The class path recorded when an attempt never reported back (its worker was killed or cut off).
_LOST = "fabrika_django.exceptions.LeaseLost"


def serve_queue(ctx: Any, alias: str, queue: str) -> None:
    """Run the due tasks of one backend's queue, highest priority first, until none is due.

    A task is started only while the attempt has at least the backend's ``timeout`` left (the attempt has
    twice that); past it, the claimed rest is given back and the job marked pending, so the next run under
    the same lease goes on.
    """

    from ..models import QueuedTask

    backend: Any = task_backends[alias]  # a FabrikaBackend: its timeout, max_attempts, worker_id
    minimum = backend.timeout.total_seconds()
    where = where_of(alias, queue)
    first = claimed_at_start(alias, queue)
    # The task the run's start statement marked RUNNING (claim_at_start), if any: run_task does not mark it again.
    started = first.started if first is not None else None
    while True:
        # An empty first batch is claimed again at once: the start's ``now`` was read before its statement, so a
        # row made due between the two (a requeue, whose kick that statement took) was not due to it.
        rows = (first.rows if first is not None else []) or QueuedTask.objects.claim(limit=BATCH, where=where)
        first = None
        if not rows:
            return
        for index, row in enumerate(rows):
            if ctx.signal.remaining() < minimum:
                ctx.signal.throw_if_aborted()
                _give_back(ctx, rows[index:], started)
                with framework_write():
                    request_run(ctx.job.name)
                return
            run_task(ctx, backend, row, started_now=row.pk == started)


def run_task(ctx: Any, backend: Any, row: Any, *, started_now: bool = False) -> None:
    """Run one claimed task row and record how it ended (see the module's docstring).

    ``started_now``: the run's start statement marked it RUNNING already (``task_claim.claim_at_start``).
    """
    from ..models import TASK_ATTEMPTS_CEILING, TaskStatus

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
    if started_now:
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


class _ReturnValueNotJSON(TypeError):
    """The task returned a value JSON cannot hold (recorded as the TypeError it is, with its code)."""

    code = "return_value_not_json"


def _json(value: Any, row: Any) -> Any:
    try:
        normalized = normalize_json(value)
        json.dumps(normalized, allow_nan=False)  # NaN and Infinity: no JSON, and no value of the database's
    except (TypeError, ValueError) as exc:
        raise _ReturnValueNotJSON(
            f"Task {row.task_path} returned a {type(value).__name__}, which is not JSON: "
            "return None, a bool, number, string, list or dict."
        ) from exc
    return normalized


#: What a failed attempt's ``last_failure`` says, by the error fabrika raised; "task_failed" for the task's own.
_FAILURE_CODES: dict[type[BaseException], str] = {
    _ReturnValueNotJSON: _ReturnValueNotJSON.code,
    TaskNotRegistered: TaskNotRegistered.code,
}
#: The class a failure of fabrika's own is recorded as: the one Django's errors name (``TaskError``).
_RECORDED_AS: dict[type[BaseException], type[BaseException]] = {
    _ReturnValueNotJSON: TypeError,
    TaskNotRegistered: SuspiciousOperation,
}


def _finish(ctx: Any, row: Any, value: Any) -> None:
    from ..models import TaskStatus

    _record(ctx, row, status=TaskStatus.SUCCESSFUL, finished_at=timezone.now(), return_value=value, due=None)


def _fail(ctx: Any, backend: Any, row: Any, exc: BaseException) -> None:
    from ..models import TASK_ATTEMPTS_CEILING, TaskStatus

    code = _FAILURE_CODES.get(type(exc), "task_failed")
    recorded = _RECORDED_AS.get(type(exc), type(exc))
    error = {"exception_class_path": _class_path(recorded), "traceback": _traceback(exc, recorded, code)}
    values: dict[str, Any] = {"errors": [*row.errors, error], "last_failure": code}
    if _attempts_left(row, backend) <= 0:
        values.update(status=TaskStatus.FAILED, finished_at=timezone.now(), attempts=TASK_ATTEMPTS_CEILING)
    else:
        values["status"] = TaskStatus.READY  # due again after the claim's backoff
    logger.warning(
        "Task attempt failed task=%s attempt=%d error=%s code=%s", row.result_id, row.attempts, recorded.__name__, code
    )
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
    from ..models._queue import write_versioned

    with framework_write():
        try:
            write_versioned(row, values)
        except VersionConflict:
            logger.warning("Task changed since it was claimed task=%s code=version_conflict", row.result_id)
            return False
    return True


def _start(ctx: Any, row: Any, **values: Any) -> bool:
    """Mark the row RUNNING, unless the attempt's lease may have ended: a stale run never starts a task.

    The fence's own local check (the signal, and the time the last renewal is known to cover; no round trip):
    the lease cannot be taken over before it expires, and the UPDATE follows at once.
    """
    _check_fence()
    return _record(ctx, row, **values)


def _check_started(ctx: Any, row: Any) -> None:
    """The fence's local check ``_start`` makes, for a task the run's start statement marked RUNNING: an attempt
    that ended since (a shutdown, its deadline) leaves the task READY, its claimed attempt counted as for any
    claimed row it does not start, rather than RUNNING with nobody running it until its backoff ends."""
    from ..models import TaskStatus

    try:
        _check_fence()
    except BaseException:
        _record(ctx, row, status=TaskStatus.READY)
        raise


def _check_fence() -> None:
    """The attempt's fence's local check (``LeaseFence.check``), through the thread's active run."""
    run = active_run()
    if run is not None and run.state is not None:
        run.state.fence.check()


def _give_back(ctx: Any, rows: list[Any], started: Any) -> None:
    """Undo the claim of rows this run will not start: due now, the claimed attempt not counted (READY again,
    for a task the run's start statement marked RUNNING)."""
    from ..models import TaskStatus

    now = timezone.now()
    for row in rows:
        values: dict[str, Any] = {"due": now, "attempts": row.attempts - 1}
        if row.pk == started:
            values["status"] = TaskStatus.READY
        _record(ctx, row, **values)


def _send_finished(backend: Any, row: Any) -> None:
    from ..models import TaskStatus

    if row.status not in (TaskStatus.SUCCESSFUL, TaskStatus.FAILED):
        return  # an attempt failed, another follows: the task has not finished
    try:
        result = result_of(row)
    except Exception as exc:  # its path is no registered task (any longer): nobody can listen for it
        logger.warning("Task finished without its signal task=%s error=%s", row.result_id, type(exc).__name__)
        return
    task_finished.send(type(backend), task_result=result)


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _traceback(exc: BaseException, recorded: type[BaseException], code: str) -> str:
    """Return the exception's traceback: its frames and class path (with fabrika's code for a failure of its
    own), without its message unless stored."""
    if settings.STORE_ERROR_MESSAGES:
        return "".join(traceback.format_exception(exc))
    frames = "".join(traceback.format_list(traceback.extract_tb(exc.__traceback__)))
    suffix = f": {code}" if code != "task_failed" else ""
    return f"Traceback (most recent call last):\n{frames}{_class_path(recorded)}{suffix}\n"


def result_of(row: Any, task: Task | None = None) -> TaskResult:
    """Return the ``TaskResult`` a task row stands for (``task``: the enqueued one, else the registered one its path
    names: ``TaskNotRegistered`` if none)."""
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
