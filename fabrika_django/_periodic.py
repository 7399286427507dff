"""Periodic Django tasks: ``TASKS[alias]["OPTIONS"]["periodic"]``, each entry a built-in scheduled job.

An entry ``name: {"task": "shop.tasks.cleanup", "schedule": "30 3 * * 1-5", "args": [...], "kwargs": {...},
"priority": 0}`` becomes the job ``tasks.<alias>.periodic.<name>``, which fires as any ``@cron`` job does (once
across every worker, missed fires made up by one run, a new entry's first fire the schedule's next time) and
enqueues its task once per run.

Exactly one task per fire, also when a worker dies between the enqueue's commit and the end of its attempt: the
task's result id is derived from the run's id, and the row goes in inside ``ctx.transaction()``, fenced by the
run's lease. The worker that takes a dead attempt's lease over resumes the same run (the job's ``retries`` give
it the attempts to), derives the same id, finds the row and enqueues nothing. "Run now" and ``fabrika_job run``
are runs of their own, so each enqueues one task.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.core import checks
from django.utils.module_loading import import_string

from . import _task_rows as task_rows
from ._tasks_compat import Task, task_backends, task_enqueued
from .jobs import cron
from .schedule import Schedule

if TYPE_CHECKING:
    from ._tasks_compat import TaskResult
    from .context import JobContext
    from .jobs import Handler
    from .models import QueuedTask

logger = logging.getLogger("fabrika_django.tasks")

_NAME = re.compile(r"[a-z0-9_]{1,64}")
_KEYS = frozenset({"task", "schedule", "args", "kwargs", "priority"})
#: The namespace of the result ids of periodic tasks (uuid5 of the job and the fire, or the manual run).
_IDS = uuid.UUID("6f1c2a9e-56a7-4d0b-9a44-7c0f3d2f8e11")


@dataclass(frozen=True)
class Entry:
    """One periodic entry, as the settings give it (checked: ``problems``)."""

    alias: str
    name: str
    task: str
    schedule: str
    args: list[object] = field(default_factory=list)
    kwargs: dict[str, object] = field(default_factory=dict)
    priority: int | None = None

    @property
    def job_name(self) -> str:
        return job_name(self.alias, self.name)


def job_name(alias: str, name: str) -> str:
    """The built-in job of a periodic entry, e.g. ``tasks.default.periodic.nightly_cleanup``."""
    return f"tasks.{alias}.periodic.{name}"


def register(alias: str, periodic: object) -> list[Entry]:
    """Register the job of each good entry of ``OPTIONS["periodic"]`` (the system checks report the others), and
    return those entries."""
    found = entries(alias, periodic)
    for entry in found:
        cron(entry.schedule, name=entry.job_name, retries=2)(_handler(entry))
    return found


def entries(alias: str, periodic: object) -> list[Entry]:
    """The entries a job can be made of: a good name, a task path, a schedule, arguments that are JSON."""
    if not isinstance(periodic, Mapping):
        return []
    found = []
    for name, spec in periodic.items():
        if _shape_problem(spec) or not isinstance(name, str) or not _NAME.fullmatch(name):
            continue
        if _schedule_problem(spec["schedule"]) or _arguments_problem(spec):
            continue
        found.append(
            Entry(
                alias,
                name,
                spec["task"],
                spec["schedule"],
                list(spec.get("args", [])),
                dict(spec.get("kwargs", {})),
                spec.get("priority"),
            )  # fmt: skip
        )
    return found


def _handler(entry: Entry) -> Handler:
    """The job's function: enqueue the entry's task once for the fire (or the manual run) it serves."""

    def enqueue_periodic(ctx: JobContext) -> None:
        task = _task(entry)
        result_id = _result_id(entry, ctx)
        backend = task_backends[entry.alias]
        with ctx.transaction():
            from .models import QueuedTask  # on use: the models need the app registry

            if QueuedTask.objects.filter(result_id=result_id).exists():
                ctx.log.info("Periodic task already enqueued for this fire task=%s", result_id)
                return
            backend.validate_task(task)
            row = task_rows.insert(entry.alias, task, entry.args, entry.kwargs, result_id=result_id)
        task_enqueued.send(type(backend), task_result=_result(row, task))
        ctx.log.info("Periodic task enqueued task=%s", result_id)

    enqueue_periodic.__name__ = enqueue_periodic.__qualname__ = f"periodic_{entry.name}"
    return enqueue_periodic


def _task(entry: Entry) -> Task:
    task = import_string(entry.task)
    if not isinstance(task, Task):
        raise TypeError(f"Periodic entry {entry.name!r}: {entry.task!r} is not a @task function.")
    return task if entry.priority is None else task.using(priority=entry.priority)


def _result_id(entry: Entry, ctx: JobContext) -> uuid.UUID:
    """The task's id: the run's. A run that takes a dead attempt's lease over resumes that run (the job has
    retries for it), so it derives the same id; every other run, a fire's or a manual one, is a task of its own."""
    return uuid.uuid5(_IDS, f"{entry.job_name} {ctx.run_id}")


def _result(row: QueuedTask, task: Task) -> TaskResult:
    from ._runs.tasks import result_of

    return result_of(row, task)


# -- the system checks -----------------------------------------------------------------------------------


def problems(alias: str, periodic: object, queues: Sequence[str] = ()) -> list[checks.CheckMessage]:
    """``fabrika.E041``-``E045`` and ``E047`` for ``TASKS[alias]["OPTIONS"]["periodic"]``, each naming its entry
    (``queues``: the backend's, whose jobs' names an entry's must not take)."""
    where = f"TASKS[{alias!r}]['OPTIONS']['periodic']"
    if not isinstance(periodic, Mapping):
        return [_error(f"{where} is not a dict of entries by name.", "fabrika.E047")]
    errors: list[checks.CheckMessage] = []
    for name, spec in periodic.items():
        entry = f"{where}[{name!r}]"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            errors.append(_error(f"{entry}: the name is not 1-64 characters of a-z, 0-9 and '_'.", "fabrika.E041"))
        elif f"periodic.{name}" in queues:
            errors.append(
                _error(f"{entry}: its job would be the queue 'periodic.{name}''s; rename one.", "fabrika.E041")
            )
        shape = _shape_problem(spec)
        if shape:
            errors.append(_error(f"{entry} {shape}.", "fabrika.E047"))
            continue
        errors += [_error(f"{entry}: {problem}.", code) for code, problem in _entry_problems(alias, spec)]
    return errors


def _entry_problems(alias: str, spec: Mapping[str, object]) -> list[tuple[str, str]]:
    found = []
    task_problem = _task_problem(alias, spec["task"])
    if task_problem:
        found.append(task_problem)
    schedule = _schedule_problem(spec["schedule"])
    if schedule:
        found.append(("fabrika.E044", schedule))
    arguments = _arguments_problem(spec)
    if arguments:
        found.append(("fabrika.E045", arguments))
    return found


def _shape_problem(spec: object) -> str | None:
    if not isinstance(spec, Mapping):
        return "is not a dict with 'task' and 'schedule'"
    missing = sorted({"task", "schedule"} - set(spec))
    if missing:
        return f"lacks {', '.join(map(repr, missing))}"
    unknown = sorted(set(spec) - _KEYS, key=str)
    if unknown:
        return f"has unknown keys {', '.join(map(repr, unknown))}: an entry takes {', '.join(sorted(_KEYS))}"
    return None


def _task_problem(alias: str, path: object) -> tuple[str, str] | None:
    if not isinstance(path, str):
        return "fabrika.E042", f"'task' is {path!r}, not the dotted path of a @task function"
    try:
        task = import_string(path)
    except ImportError:
        return "fabrika.E042", f"'task' {path!r} does not import"
    if not isinstance(task, Task):
        return "fabrika.E042", f"'task' {path!r} is not a @task function"
    if task.backend != alias:
        return "fabrika.E043", f"'task' {path!r} is a task of the backend {task.backend!r}, not of {alias!r}"
    return None


def _schedule_problem(schedule: object) -> str | None:
    if not isinstance(schedule, str):
        return f"'schedule' is {schedule!r}, not five cron fields"
    try:
        Schedule(schedule)
    except ValueError as error:
        return f"'schedule' {error}"
    return None


def _arguments_problem(spec: Mapping[str, object]) -> str | None:
    args, kwargs, priority = spec.get("args", []), spec.get("kwargs", {}), spec.get("priority")
    if not isinstance(args, list) or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        return "'args' must be a JSON list and 'kwargs' a JSON object with string keys"
    try:
        json.dumps([args, kwargs], allow_nan=False)
        task_rows.json_arguments(args, kwargs)
    except (TypeError, ValueError):
        return "'args' and 'kwargs' must be JSON (no NaN, no Infinity, at most 1 MiB)"
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > 100):
        return f"'priority' is {priority!r}: give a whole number from -100 to 100"
    return None


def _error(message: str, code: str) -> checks.Error:
    hint = (
        "Each entry is {'task': a @task's dotted path, 'schedule': five cron fields[, 'args', 'kwargs', 'priority']}."
    )
    return checks.Error(message, hint=hint, id=code)
