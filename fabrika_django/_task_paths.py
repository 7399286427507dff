"""Which function a task row names, found without letting the row choose the worker's code.

A row is data: whoever can write one (a bug, an SQL injection elsewhere, a restored backup) must not make the
worker import a module of their choosing, whose import alone may run code. So a row's ``task_path`` is imported
only from the project's own code, the packages of its installed apps and of its settings module, or from a
module the worker has imported already; any other path is refused before anything is imported (an
``ImportError``: the worker will not import it), and a path that is no ``@task`` function is refused after (a
``SuspiciousOperation``, as Django's database backend raises). Both fail the attempt with the code
``task_not_registered``.
"""

from __future__ import annotations

import os
import sys
import uuid
from datetime import datetime
from typing import Protocol

from django.apps import apps
from django.conf import settings as django_settings
from django.core.exceptions import SuspiciousOperation
from django.utils.module_loading import import_string

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


class TaskOutsideProject(ImportError):
    """A row's task path names a module outside the project's code, which the worker does not import."""

    code = NOT_REGISTERED


class TaskNotRegistered(SuspiciousOperation):
    """A row's task path names something that is no ``@task`` function."""

    code = NOT_REGISTERED


def task_of(row: _TaskRow) -> Task:
    """Import the row's task by path, with the priority, queue, backend and run_after it was enqueued with."""
    path = str(row.task_path)
    if not _may_import(path):
        raise TaskOutsideProject(
            f"Task {row.result_id} names a function outside the project's installed apps: nothing was imported."
        )
    task = import_string(path)
    if not isinstance(task, Task):
        raise TaskNotRegistered(f"Task {row.result_id} names {path!r}, which is not a @task function.")
    return task.using(priority=row.priority, queue_name=row.queue_name, backend=row.backend, run_after=row.run_after)


def _may_import(path: str) -> bool:
    module = path.rpartition(".")[0]
    if not module:
        return False
    if module in sys.modules:
        return True  # imported already: looking the name up imports nothing
    return any(module == package or module.startswith(f"{package}.") for package in _project_packages())


def _project_packages() -> list[str]:
    packages = [app_config.name for app_config in apps.get_app_configs()]
    # Under override_settings SETTINGS_MODULE reads None; the environment still names the module Django loaded.
    settings_module = getattr(django_settings, "SETTINGS_MODULE", None) or os.environ.get("DJANGO_SETTINGS_MODULE")
    if settings_module:
        packages.append(settings_module.split(".", 1)[0])  # a project's own package: mysite.tasks
    return packages
