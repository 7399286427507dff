"""The registry of the project's tasks: which function a task row names, found without importing anything.

A row is data: whoever can write one (a bug, an SQL injection elsewhere, a restored backup) must not make the
worker import a module of their choosing, whose import alone may run code. So a row's ``task_path`` is only looked
up, never imported: among the tasks a fabrika backend validated in this process. Django validates each task it
makes (``Task.__post_init__`` calls its backend's ``validate_task()``, also for ``using()``'s copies), so a
task is registered when the module that defines it is imported: an installed app's ``tasks`` module, which the
worker imports before it claims (``discover``), a module imported at start-up (from ``AppConfig.ready()``, a
periodic entry's), or a test module. A path that is no registered task fails the attempt with the code
``task_not_registered``, and nothing is imported.

The registry is by path, not by backend alias: a task declared for one fabrika backend runs for a row of another
(``task.using(backend="other").enqueue()``), with the row's backend. A task whose ``@task`` names a backend that is
not fabrika's is validated by that backend, so it is not registered here: declare it for a fabrika backend.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Protocol

from django.apps import apps
from django.core.exceptions import SuspiciousOperation
from django.utils.module_loading import autodiscover_modules

from ._caches import resets_with_settings
from ._tasks_compat import Task


class _TaskRow(Protocol):
    """What ``task_of`` reads of a task's row (``models.QueuedTask``, which sits above this module)."""

    task_path: str
    result_id: uuid.UUID
    priority: int
    queue_name: str
    backend: str
    run_after: datetime | None


#: The failure code of a row whose path names no task this project has.
NOT_REGISTERED = "task_not_registered"

#: Each task a fabrika backend validated in this process, by its path (``Task.module_path``). Not reset by a
#: settings change, as caches are: a task is made once, when its module is imported, and never again.
_REGISTERED: dict[str, Task] = {}
#: The installed apps whose ``tasks`` modules ``discover`` imported last (None: not yet).
_discovered_apps: tuple[str, ...] | None = None


class TaskNotRegistered(SuspiciousOperation):
    """A row's task path names no registered task (a ``SuspiciousOperation``, as Django's database backend raises
    for a row whose path is no task)."""

    code = NOT_REGISTERED


def register(task: Task) -> None:
    """Record a task a fabrika backend validated, under its path.

    The first task of a function stays: ``using()``'s copies (the same function) do not replace it, so a copy's
    ``run_after`` never becomes the task's. A function defined again (a module reloaded) replaces its old one.
    """
    known = _REGISTERED.get(task.module_path)
    if known is None or known.func is not task.func:
        _REGISTERED[task.module_path] = task


def discover() -> None:
    """Import each installed app's ``tasks`` module, so the tasks they define are registered.

    Django's ``autodiscover_modules``, as the admin's ``admin`` modules and Celery's and django-tasks' ``tasks``
    modules are found. Once per set of installed apps (an app added by a settings change is looked into); an app
    without a ``tasks`` module is passed over, one whose ``tasks`` module raises raises here.
    """
    global _discovered_apps
    installed = tuple(app_config.name for app_config in apps.get_app_configs())
    if installed == _discovered_apps:
        return
    autodiscover_modules("tasks")
    _discovered_apps = installed


def task_of(row: _TaskRow) -> Task:
    """Return the registered task the row names, with the priority, queue, backend and run_after it was enqueued
    with; a path that is no registered task raises ``TaskNotRegistered``, nothing imported."""
    path = str(row.task_path)
    task = _REGISTERED.get(path)
    if task is None:
        raise TaskNotRegistered(
            f"Task {row.result_id} names {path!r}, which is no registered task, so nothing was imported: define "
            "tasks in an installed app's tasks module, or in a module imported at start-up (AppConfig.ready())."
        )
    key = (task, row.priority, row.queue_name, row.backend, row.run_after)
    enqueued = _ENQUEUED_AS.get(key)
    if enqueued is None:
        if len(_ENQUEUED_AS) >= _MAX_ENQUEUED_AS:
            _ENQUEUED_AS.clear()  # deferred tasks each bring their own run_after: keep the cache small
        enqueued = _ENQUEUED_AS[key] = task.using(
            priority=row.priority, queue_name=row.queue_name, backend=row.backend, run_after=row.run_after
        )
    return enqueued


#: ``task_of``'s answers, by the registered task and the row's values: ``using()`` makes and validates a new Task
#: (Django's checks against the backend's settings), which cost a worker more than a no-op task's run. A Task is
#: immutable, and a function registered again is another key; a setting change empties it (the checks' input).
_ENQUEUED_AS: dict[tuple[object, ...], Task] = resets_with_settings({})
_MAX_ENQUEUED_AS = 256
