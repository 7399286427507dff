"""Requeue: the one service behind the admin's action and button and ``fabrika_job requeue``.

The rule, the same from every door:

- a waiting or dead row is made due now with no attempts (``row.requeue()``, conditioned on the version read,
  so a row changed meanwhile is reported and left as it is);
- a done row is skipped: its work is finished, and requeueing it would do that work a second time (code that
  means to redo a done row's work calls ``row.requeue()`` itself);
- a RUNNING task refuses the whole request, nothing requeued: a worker is running it now (or one was killed
  and the job's lease has not yet expired, after which the task is retried on its own), and made READY it
  would run a second time beside the first;
- when anything was requeued, the jobs that claim the table are kicked (on commit), so the rows run within
  seconds rather than at the jobs' next fire, also for a kick-only job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from django.db.models import QuerySet

from ._claimers import kick_claimers
from .exceptions import VersionConflict
from .models import QueuedTask, QueueModel, TaskStatus

Row = TypeVar("Row", bound=QueueModel)


class RunningTasks(Exception):
    """The rows to requeue hold RUNNING tasks (``pks``, as text): nothing was requeued."""

    def __init__(self, label: str, pks: list[str]) -> None:
        self.label, self.pks = label, pks
        verb = "is" if len(pks) == 1 else "are"
        super().__init__(
            f"{label} {', '.join(pks)} {verb} RUNNING: a requeue could run it twice. Wait until it ends (a killed "
            "worker's task is retried on its own once the job's lease expires); nothing was requeued."
        )


@dataclass
class Requeued:
    """What a requeue did: the rows requeued, the ids left because they changed, the done rows skipped, and the
    jobs kicked."""

    requeued: list[QueueModel] = field(default_factory=list)
    conflicted: list[str] = field(default_factory=list)
    skipped_done: int = 0
    kicked: list[str] = field(default_factory=list)


def refuse_running_tasks(rows: QuerySet[Row]) -> None:
    """Raise ``RunningTasks`` when ``rows`` hold a RUNNING task (a queue table other than the tasks' holds none)."""
    if not issubclass(rows.model, QueuedTask):
        return
    running = [str(pk) for pk in rows.filter(status=TaskStatus.RUNNING).order_by("pk").values_list("pk", flat=True)]
    if running:
        raise RunningTasks(rows.model._meta.label, running)


def requeue_rows(
    rows: QuerySet[Row] | Iterable[Row],
    model: type[Row],
    *,
    on_requeued: Callable[[Row], object] | None = None,
) -> Requeued:
    """Requeue ``rows`` of ``model`` by the rule above; ``on_requeued`` is called with each row requeued.

    ``rows`` is a queryset, or rows already read (the admin's button passes the row with the version its page
    showed). Raises ``RunningTasks`` before writing anything when they hold a RUNNING task.
    """
    if isinstance(rows, QuerySet):
        refuse_running_tasks(rows)
        rows = rows.order_by("pk").iterator(chunk_size=500)
    else:
        rows = list(rows)
        running = [str(row.pk) for row in rows if _is_running(row)]
        if running:
            raise RunningTasks(model._meta.label, running)
    done = Requeued()
    for row in rows:
        if row.due is None:
            done.skipped_done += 1
        elif _is_running(row):
            done.conflicted.append(str(row.pk))  # claimed since the refusal's read: left to its worker
        else:
            _requeue_one(row, done, on_requeued)
    if done.requeued:
        done.kicked = kick_claimers(model)
    return done


def _is_running(row: QueueModel) -> bool:
    return isinstance(row, QueuedTask) and row.status == TaskStatus.RUNNING


def _requeue_one(row: Row, done: Requeued, on_requeued: Callable[[Row], object] | None) -> None:
    try:
        row.requeue()
    except VersionConflict:
        done.conflicted.append(str(row.pk))
    else:
        done.requeued.append(row)
        if on_requeued is not None:
            on_requeued(row)
