"""What a Django task queue's built-in job does: claim due task rows in claim order and run each.

One task, in the job's attempt:
1. RUNNING, with ``started_at``, ``last_attempted_at`` and the worker's id, while the job's lease holds;
2. the task's function, as plain Django code (no write guard, no fence: ``outside_run``);
3. SUCCESSFUL with its JSON return value, or the failed attempt's ``TaskError`` (class path and frames,
   no message unless ``STORE_ERROR_MESSAGES``): READY again after the claim's backoff while attempts remain,
   else FAILED, a dead row a person requeues.
Tasks of a few milliseconds are started in groups, and their outcomes written with the next group's start: one
statement for many tasks (``task_groups``). A task whose worker died mid-task, or before its outcome was
written, is RUNNING with its claim's backoff as ``due``: once the job's lease expired, a later run claims it
again (one more attempt), or gives it up when that was its last.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from typing import Any

from django.core.exceptions import SuspiciousOperation
from django.utils import timezone

from .._running import framework_write, is_ctrl_c, outside_run
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

# Up a floor: a task run that leaves tasks behind asks for another run, as a kick does (kicks.py sits on the
# run machinery's pending flag, so the folder stands under it).
from ..kicks import request_run
from .task_claim import BATCH, claimed_at_start, where_of
from .task_groups import Pace, Writes, check_fence

logger = logging.getLogger(__name__)


#: The class path recorded when an attempt never reported back (its worker was killed or cut off).
_LOST = "fabrika_django.exceptions.LeaseLost"


def serve_queue(ctx: Any, alias: str, queue: str) -> None:
    """Run the due tasks of one backend's queue, highest priority first, until none is due.

    A task is started only while the attempt has at least the backend's ``timeout`` left (the attempt has
    twice that); past it, the claimed rest is given back and the job marked pending, so the next run under
    the same lease goes on. Whatever ends the run, the outcomes it holds are written first.
    """
    backend: Any = task_backends[alias]  # a FabrikaBackend: its timeout, max_attempts, worker_id
    writes = Writes(backend.worker_id, lambda row, task: _send_finished(backend, row, task))
    try:
        _serve(ctx, backend, alias, queue, writes)
    except BaseException:
        writes.flush_on_the_way_out()
        raise
    writes.flush()


def _serve(ctx: Any, backend: Any, alias: str, queue: str, writes: Writes) -> None:
    from ..models import QueuedTask

    where = where_of(alias, queue)
    pace = Pace()
    first = claimed_at_start(alias, queue)
    while True:
        # An empty first batch is claimed again at once: the start's ``now`` was read before its statement, so a
        # row made due between the two (a requeue, whose kick that statement took) was not due to it.
        rows = (first.rows if first is not None else []) or QueuedTask.objects.claim(
            limit=pace.claim(BATCH), where=where
        )
        # The task the run's start statement marked RUNNING (claim_at_start), if any: it is not started again.
        started = {first.started} if first is not None and first.started is not None else set()
        first = None
        if not rows:
            return
        if not _serve_batch(ctx, backend, rows, started, writes, pace):
            return


def _serve_batch(ctx: Any, backend: Any, rows: list[Any], started: set[Any], writes: Writes, pace: Pace) -> bool:
    """Run a claimed batch, group by group; False when the attempt's time ran short (the rest given back)."""
    minimum = backend.timeout.total_seconds()
    index = 0
    while index < len(rows):
        group = rows[index : index + pace.group()]
        running = _start_group(backend, group, started, writes)
        for offset, row in enumerate(group):
            if ctx.signal.remaining() < minimum:
                ctx.signal.throw_if_aborted()
                # The group's rows started and not run, and the batch's rows after the group (none of them written
                # yet: a row holds one write a statement).
                unrun = [other for other in group[offset:] if other.pk in running]
                _give_back(writes, [*unrun, *rows[index + len(group) :]], running)
                writes.flush()
                with framework_write():
                    request_run(ctx.job.name)
                return False
            if row.pk not in running:
                continue  # given up unrun, or changed since its claim
            _check_started(writes, group[offset:], running)
            began = time.monotonic()
            writes.hold(row, *run_task(backend, row))
            pace.observe(time.monotonic() - began)
        index += len(group)
    return True


def _start_group(backend: Any, group: list[Any], started: set[Any], writes: Writes) -> set[Any]:
    """Start the group's tasks in one statement, with the held outcomes; answer the pks of those now RUNNING.

    A task whose last attempt never reported back is given up unrun (``task_lost``) in that statement instead.
    """
    from ..models import TASK_ATTEMPTS_CEILING, TaskStatus

    to_start = []
    for row in group:
        if _attempts_left(row, backend) < 0:
            lost = {"exception_class_path": _LOST, "traceback": ""}
            writes.hold(
                row,
                {
                    "status": TaskStatus.FAILED,
                    "finished_at": timezone.now(),
                    "errors": [*row.errors, lost],
                    "attempts": TASK_ATTEMPTS_CEILING,
                    "last_failure": "task_lost",
                },
            )
            logger.warning("Task given up task=%s attempts=%d code=task_lost", row.result_id, row.attempts - 1)
        elif row.pk not in started:
            to_start.append(row)
    running = {row.pk for row in group if row.pk in started}  # its fence is checked as it runs (_check_started)
    if to_start:
        running |= {row.pk for row in writes.start(to_start)}
    return running


def run_task(backend: Any, row: Any) -> tuple[dict[str, Any], Task | None]:
    """Run one started task row; answer the values its outcome writes (see the module's docstring), and its task
    (None when the row names no registered task)."""
    task = None
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
        return _failure(backend, row, exc), task
    from ..models import TaskStatus

    return {"status": TaskStatus.SUCCESSFUL, "finished_at": timezone.now(), "return_value": value, "due": None}, task


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


def _failure(backend: Any, row: Any, exc: BaseException) -> dict[str, Any]:
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
    return values


def _attempts_left(row: Any, backend: Any) -> int:
    """Return the claims the task has left under its backend's ``max_attempts`` (below 0: one more than allowed).

    The task's own limit: the table's (``Queue.max_attempts``) is the ceiling a given-up task jumps to.
    """
    return int(backend.max_attempts - row.attempts)


def _check_started(writes: Writes, unrun: list[Any], running: set[Any]) -> None:
    """The fence's local check before a started task runs: an attempt that ended since (a shutdown, its deadline)
    leaves its started, unrun tasks READY, each claimed attempt counted as for any claimed row it does not run,
    rather than RUNNING with nobody running them until their backoff ends."""
    from ..models import TaskStatus

    try:
        check_fence()
    except BaseException:
        for row in unrun:
            if row.pk in running:
                writes.hold(row, {"status": TaskStatus.READY})
        raise


def _give_back(writes: Writes, rows: list[Any], running: set[Any]) -> None:
    """Undo the claim of rows this run will not run: due now, the claimed attempt not counted (READY again, for a
    task this run started)."""
    from ..models import TaskStatus

    now = timezone.now()
    for row in rows:
        values: dict[str, Any] = {"due": now, "attempts": row.attempts - 1}
        if row.pk in running:
            values["status"] = TaskStatus.READY
        writes.hold(row, values)


def _send_finished(backend: Any, row: Any, task: Task | None) -> None:
    from ..models import TaskStatus

    if row.status not in (TaskStatus.SUCCESSFUL, TaskStatus.FAILED):
        return  # an attempt failed, another follows: the task has not finished
    try:
        result = result_of(row, task)
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
