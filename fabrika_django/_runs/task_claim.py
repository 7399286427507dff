"""Django tasks' first claim riding in a kicked run's start, on PostgreSQL: the claim's own statement
(``statement``, every queue table's) with the task's start added (``_sql.tasks.start_first``).

Every other claim of a task queue is ``QueuedTask.objects.claim()``, as any queue table's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import Q

from .._running import active_run
from .._sql import tasks as task_sql
from .._tasks_compat import task_backends
from .claim import claim_params, claimed_rows, dues_of
from .statement import Statement, statement

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from ..jobs import CronJob

#: Rows a task claim takes at once: few, because a claimed row counts an attempt even if the run ends before it.
BATCH = 10

#: What a start's claim answers for the connection, the run's ``now`` and the job (``claim_at_start``).
StartClaim = Callable[["BaseDatabaseWrapper", datetime, "CronJob"], tuple[str, str, dict[str, Any]]]


@dataclass(frozen=True)
class FirstBatch:
    """The first batch a kicked run's start claimed: the rows, and the pk of the one it marked RUNNING."""

    rows: list[Any]
    started: Any


def where_of(alias: str, queue: str) -> Q:
    """The claim's ``where`` for one backend's queue."""
    return Q(backend=alias, queue_name=queue)


def claim_at_start(alias: str, queue: str) -> StartClaim:
    """The first claim of a kicked run of the queue's job, to ride in its start's statement on PostgreSQL
    (``_running.CLAIMS_AT_START``): one statement from a kick's NOTIFY to the first task marked RUNNING, where
    there were three (the start, the claim, the task's RUNNING).

    The answer, for the connection, the run's ``now`` and the job: the claim's WITH items, gated on the start
    having taken the lease, the tail of its answer (columns and order) and its parameters. The lease the
    statement took is the first task's fence.
    """

    def claim(connection: BaseDatabaseWrapper, now: datetime, job: CronJob) -> tuple[str, str, dict[str, Any]]:
        from ..models import QueuedTask, TaskStatus

        backend: Any = task_backends[alias]  # a FabrikaBackend: its max_attempts and worker_id
        built = _statement(connection.alias, alias, queue)
        params = claim_params(QueuedTask, connection, job.period, now, BATCH)
        started = {"max_attempts": backend.max_attempts, "worker": backend.worker_id, "running": TaskStatus.RUNNING}
        return built.ctes, task_sql.at_start_tail(built.columns, built.order), {**built.fixed, **params, **started}

    return claim


def claimed_at_start(alias: str, queue: str) -> FirstBatch | None:
    """The first batch, when the run's start claimed it in its own statement (``claim_at_start``); else None."""
    from ..models import QueuedTask
    from ..models._tasks import claimable_tasks

    run = active_run()
    found = run.state.claimed_at_start if run is not None and run.state is not None else None
    if run is None or run.state is None or found is None:
        return None
    run.state.claimed_at_start = None  # the first attempt's only: a retry claims afresh
    using, answered = found.using, found.rows
    run.claimed.add((using, QueuedTask._meta.label))  # a requeue of this table kicks the job (_claimers)
    built = _statement(using, alias, queue)
    dues = dues_of(QueuedTask, run.job.period, found.now)
    rows = claimed_rows(claimable_tasks(), using, built.decode, [values[:-1] for values in answered], dues)
    started = next((values[0] for values in answered if values[-1]), None)  # by id, the answer's first column
    return FirstBatch(rows, started)


def _statement(using: str, alias: str, queue: str) -> Statement:
    """The tasks' claim of one backend's queue with the task's start added, as ``statement`` builds it."""
    from ..models._tasks import claimable_tasks

    of = claimable_tasks()
    built = statement(of.rows.model, connections[using], of.order, where_of(alias, queue), extra=task_sql.start_first)
    # Never None: the tasks' table has no parent, its claim order and where name its own columns.
    assert built is not None
    return built
