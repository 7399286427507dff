"""The task functions django-tasks-db's tests enqueue as ``tests.tasks.<name>``, written here from what the tests
expect of each (their ``tests/tasks.py`` is not in the sdist)."""

import asyncio
import time
from typing import Any

from fabrika_django._tasks_compat import TaskContext

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef]


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    await asyncio.sleep(0)


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task()
def complex_exception() -> None:
    # Their test finds this line in the traceback.
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value() -> Any:
    return {"when": time}  # a module: not JSON


@task()
def exit_task() -> None:
    raise SystemExit(1)


@task()
def failing_task_system_exit() -> None:
    raise SystemExit


@task()
def failing_task_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


@task(takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return context.task_result.id


@task(takes_context=True)
def test_context(context: TaskContext, attempt: int) -> None:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt
    assert context.task_result.args == [attempt]


@task()
def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


@task()
def hang() -> None:
    while True:
        time.sleep(1)
