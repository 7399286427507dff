"""Django's Tasks framework: ``django.tasks`` on Django 6.0+, the ``django-tasks`` backport on Django 5.2.

The one place that knows there are two; everything else imports these names from here.
"""

from __future__ import annotations

from importlib.util import find_spec

from django.core.exceptions import ImproperlyConfigured

if find_spec("django.tasks") is not None:
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, default_task_backend, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:  # Django 5.2
    try:
        from django_tasks import (  # type: ignore[no-redef,assignment]
            DEFAULT_TASK_QUEUE_NAME,
            default_task_backend,
            task_backends,
        )
        from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef,assignment]
        from django_tasks.base import (  # type: ignore[no-redef,assignment]
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef,assignment]
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef,assignment]
        from django_tasks.signals import (  # type: ignore[no-redef,assignment]
            task_enqueued,
            task_finished,
            task_started,
        )
        from django_tasks.utils import normalize_json  # type: ignore[no-redef]
    except ImportError as exc:
        raise ImproperlyConfigured(
            "fabrika_django.tasks needs Django 6.0 or newer, or on Django 5.2 the django-tasks backport: "
            'pip install "fabrika-django[tasks]".'
        ) from exc

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "default_task_backend",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
