"""``DBTaskResult`` as django-tasks-db's tests use it: fabrika's ``QueuedTask`` rows under that model's names.

A proxy of ``QueuedTask`` (no table of its own) whose queryset answers their names: ``ready()``, ``successful()``,
``failed()``, ``running()``, ``finished()``; the fields ``id`` (the task's result id, their primary key),
``backend_name`` and ``args_kwargs``; ``run_after`` written also to ``due``, the column fabrika's claim reads. Its
rows list in fabrika's claim order. Tests that inspect their model itself (its fields' checks, indexes, admin,
locking helpers) are deselected in ``selection.py``, not imitated here.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from fabrika_django._queuestate import state_q
from fabrika_django._runs.tasks import result_of, task_of
from fabrika_django.models import QueuedTask, TaskStatus
from fabrika_django.queues import QueueManager, QueueQuerySet

from .standin import not_fabrikas

#: Their date for "no run_after"; only their admin tests (deselected) use it.
get_date_max = not_fabrikas("django_tasks_db.models.get_date_max")

_NAMES = {"id": "result_id", "backend_name": "backend"}


def _translated(kwargs: dict[str, Any], *, writing: bool = False) -> dict[str, Any]:
    """Their field names as fabrika's (``id__in`` too); a write's ``run_after`` sets ``due`` with it."""
    translated: dict[str, Any] = {}
    for key, value in kwargs.items():
        name, _, lookup = key.partition("__")
        if name == "args_kwargs":
            translated.update(args=value.get("args", []), kwargs=value.get("kwargs", {}))
            continue
        translated["__".join(filter(None, (_NAMES.get(name, name), lookup)))] = value
        if writing and name == "run_after":
            translated["due"] = value or timezone.now()
        if writing and name == "started_at":
            translated.setdefault("last_attempted_at", value)  # their one column is both
    return translated


class DBTaskResultQuerySet(QueueQuerySet["DBTaskResult"]):  # a queue model's manager (fabrika's check E020)
    def ready(self) -> DBTaskResultQuerySet:
        """READY and due: what a worker would claim now."""
        return self.filter(state_q(QueuedTask, "due_now", timezone.now()), status=TaskStatus.READY)

    def successful(self) -> DBTaskResultQuerySet:
        return self.filter(status=TaskStatus.SUCCESSFUL)

    def failed(self) -> DBTaskResultQuerySet:
        return self.filter(status=TaskStatus.FAILED)

    def running(self) -> DBTaskResultQuerySet:
        return self.filter(status=TaskStatus.RUNNING)

    def finished(self) -> DBTaskResultQuerySet:
        return self.filter(status__in=[TaskStatus.SUCCESSFUL, TaskStatus.FAILED])

    def filter(self, *args: Any, **kwargs: Any) -> Any:
        return super().filter(*args, **_translated(kwargs))

    def exclude(self, *args: Any, **kwargs: Any) -> Any:
        return super().exclude(*args, **_translated(kwargs))

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return super().get(*args, **_translated(kwargs))

    def create(self, **kwargs: Any) -> Any:
        return super().create(**{"queue_name": "default", **_translated(kwargs, writing=True)})

    def update(self, **kwargs: Any) -> int:
        return super().update(**_translated(kwargs, writing=True))

    async def aupdate(self, **kwargs: Any) -> int:
        return await super().aupdate(**_translated(kwargs, writing=True))


class DBTaskResult(QueuedTask):
    objects = QueueManager.from_queryset(DBTaskResultQuerySet)()  # type: ignore[misc,assignment]  # their names, not the claim

    class Meta:
        proxy = True
        ordering = ["-priority", "due", "id"]  # fabrika's claim order

    @property
    def task(self) -> Any:
        return task_of(self)

    @property
    def task_result(self) -> Any:
        return result_of(self)

    @property
    def traceback(self) -> str:
        """The last failed attempt's traceback (their model keeps one; fabrika one per attempt)."""
        return self.errors[-1]["traceback"] if self.errors else ""
