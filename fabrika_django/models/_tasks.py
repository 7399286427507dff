"""``QueuedTask``: the queue table of Django's tasks on ``fabrika_django.tasks.FabrikaBackend``."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .._queuestate import waiting_q
from .._row_writes import run_now
from ..jobs import registry, task_job_name

# Up a floor: a requeued task kicks its queue's job (kicks.py writes fabrika's own tables, in this folder).
from ..kicks import kick
from ..queues import QueueManager, QueueQuerySet
from ._queue import QueueModel, write_versioned

if TYPE_CHECKING:
    from ..queues import run_claim  # the claim's types, through the queryset's own module: no arrow up

logger = logging.getLogger(__name__)


class TaskStatus(models.TextChoices):
    """A Django task's status, with the values of ``django.tasks.TaskResultStatus`` (not imported here: on
    Django 5.2 that module is an optional backport)."""

    READY = "READY", _("ready")
    RUNNING = "RUNNING", _("running")
    SUCCESSFUL = "SUCCESSFUL", _("successful")
    FAILED = "FAILED", _("failed")


#: A task's attempts are the backend's OPTIONS["max_attempts"]; the table's own limit is this ceiling, which
#: a task reaches only when it is given up (FAILED: a dead row, requeued by a person).
TASK_ATTEMPTS_CEILING = 100
#: A task's priority bounds, Django's (TASK_MIN_PRIORITY, TASK_MAX_PRIORITY): the table's check constraint holds them.
_TASK_PRIORITIES = (-100, 100)


class _TaskQuerySet(QueueQuerySet["QueuedTask"]):
    # Django's promise: a higher priority first, then the earliest run_after/enqueue, then enqueue order.
    _claim_order = ("-priority", "due", "pk")

    # On MariaDB/MySQL every priority named (the check constraint holds every row to them, so none is left out).
    _claim_ranges = ("priority", range(_TASK_PRIORITIES[1], _TASK_PRIORITIES[0] - 1, -1))

    def _give_up(self, using: str, rows: list[tuple[Any, int]]) -> None:
        """Give up claimed tasks the worker cannot decode: FAILED at once, by id and claimed version.

        No retry can help (the row is the same on every claim), and it must not stay RUNNING when the run's start
        statement marked it so. Logged by id and a fixed code; the row's columns are never read into memory.
        """
        for pk, version in rows:
            self.model._base_manager.using(using).filter(pk=pk, version=version).update(
                status=TaskStatus.FAILED,
                finished_at=timezone.now(),
                attempts=TASK_ATTEMPTS_CEILING,
                last_failure="task_undecodable",
                version=version + 1,
            )
            logger.warning("Task given up id=%s code=task_undecodable", pk)


def claimable_tasks() -> run_claim.Claimable:
    """The tasks' table as ``claim()`` hands it to the claim's pipeline (``_runs.task_claim``, for the first
    claim that rides in a run's start)."""
    return QueuedTask.objects.get_queryset()._claimable(whole_table=True)


class _TaskManager(QueueManager.from_queryset(_TaskQuerySet)):  # type: ignore[misc]
    pass


class QueuedTask(QueueModel):
    """One enqueue of a Django task on ``fabrika_django.tasks.FabrikaBackend``: its call, status and result.

    The queue's own columns say where the row is in the queue (``due``, ``attempts``); ``status`` says the same
    in Django's words. A failed attempt leaves the row due after the claim's backoff; the last one gives it
    up: its attempts jump to the ceiling, which makes it dead (FAILED) until a person requeues it.
    """

    result_id = models.UUIDField(_("result id"), unique=True, default=uuid.uuid4, editable=False)
    task_path = models.CharField(_("function"), max_length=255)
    backend = models.CharField(_("backend"), max_length=100)
    queue_name = models.CharField(_("queue"), max_length=100)
    priority = models.SmallIntegerField(_("priority"), default=0)
    args = models.JSONField(_("args"), default=list, blank=True)
    kwargs = models.JSONField(_("kwargs"), default=dict, blank=True)
    run_after = models.DateTimeField(_("run after"), null=True, blank=True)
    status = models.CharField(_("status"), max_length=10, choices=TaskStatus.choices, default=TaskStatus.READY)
    enqueued_at = models.DateTimeField(_("enqueued at"), default=timezone.now)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    last_attempted_at = models.DateTimeField(_("last attempted at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    return_value = models.JSONField(_("return value"), null=True, blank=True)
    #: One {"exception_class_path", "traceback"} per failed attempt; the traceback has no message by default.
    errors = models.JSONField(_("errors"), default=list, blank=True)
    worker_ids = models.JSONField(_("worker ids"), default=list, blank=True)

    objects = _TaskManager()  # type: ignore[misc]  # QueueModel's manager, with the tasks' claim order

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        indexes = [
            # The claim: one (backend, queue) in claim order, over waiting rows only (as the claim index of
            # every queue table: a given-up task is dead, and dead rows stay out of the claim's path).
            models.Index(
                fields=["backend", "queue_name", "-priority", "due", "id"],
                name="fabrika_task_claim",
                condition=waiting_q(TASK_ATTEMPTS_CEILING),
            ),
            models.Index(fields=["finished_at"], name="fabrika_task_finished"),  # the pruning
        ]
        constraints = [
            # Django's bounds (TASK_MIN_PRIORITY, TASK_MAX_PRIORITY), also for rows written by hand.
            models.CheckConstraint(
                condition=models.Q(priority__range=_TASK_PRIORITIES), name="fabrika_task_priority_range"
            ),
        ]

    class Queue:
        max_attempts = TASK_ATTEMPTS_CEILING

    def __str__(self) -> str:
        return f"{self.task_path} {self.result_id}"

    def requeue(self, at: datetime | None = None) -> None:
        """Make the task READY again at ``at`` (now by default) with no attempts, and kick its job on commit."""
        write_versioned(
            self,
            {
                "due": at if at is not None else run_now(),
                "attempts": 0,
                "status": TaskStatus.READY,
                "finished_at": None,
                "last_failure": "",
            },
        )
        name = task_job_name(self.backend, self.queue_name)
        if name in registry:  # a backend or queue since removed from TASKS has no job to kick
            kick(name, using=self._state.db)
