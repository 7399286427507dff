"""``FabrikaBackend``: Django's Tasks framework (``django.tasks``; the backport on Django 5.2) on fabrika's worker.

``enqueue()`` inserts one row into fabrika's own queue table of tasks (``QueuedTask``) in the caller's
transaction and kicks that queue's job once it commits: a rollback enqueues nothing, a commit starts the task
within milliseconds on a listening worker. Each (backend alias, queue) is served by a built-in kick-only job,
``tasks.<alias>.<queue>``, whose one-minute schedule is the recovery (and the backoff's period).
"""

from __future__ import annotations

import os
import re
import socket
import sys
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, TypedDict, TypeGuard

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from . import _periodic, _tasks_checks
from . import _task_paths as task_paths
from . import _task_rows as task_rows
from ._running import CLAIMS_AT_START
from ._runs.task_claim import claim_at_start
from ._runs.tasks import result_of, serve_queue
from ._sql import cache
from ._task_rows import MAX_ARGUMENTS_BYTES as MAX_ARGUMENTS_BYTES  # projects and tests know it from here
from ._tasks_compat import (
    BaseTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    task_enqueued,
)
from .jobs import MAX_TIMEOUT, Handler, cron, task_job_name

if TYPE_CHECKING:
    from .context import JobContext

#: The schedule of every task queue's job: the sweep that recovers a lost kick, and the backoff's period.
SWEEP_SCHEDULE = "* * * * *"
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_TIMEOUT = timedelta(minutes=15)
#: A task's time is at least its timeout: the job's attempt gets twice that and starts no task in its second half.
MAX_TASK_TIMEOUT = MAX_TIMEOUT / 2
MAX_LANES = 64
_OPTIONS = ("max_attempts", "timeout", "lanes", "rate_limit", "periodic")
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_MAX_JOB_NAME = 100


class FabrikaBackend(BaseTaskBackend):
    """Run ``@task`` functions on fabrika's worker: transactional enqueue, leases, retries, admin.

    ``OPTIONS`` (all optional): ``max_attempts`` (1-100, default 3), ``timeout`` (seconds or a timedelta, at
    least this long for each task; default 15 minutes), ``lanes`` (1-64, default 1), ``rate_limit`` (by queue, the
    tasks its job may start: ``{"emails": "10/s"}``, ``N/s``, ``N/m`` or ``N/h``; a bad one is ``fabrika.E046``).

    ``enqueue()`` takes arguments that are JSON without NaN or Infinity (the database's JSON has neither), at
    most ``MAX_ARGUMENTS_BYTES`` (1 MiB) of it for args and kwargs together; anything else is a ``ValueError``
    before a row is written. Pass ids and small values; keep documents in a row or a file and pass their id.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, object]) -> None:
        super().__init__(alias, params)
        self.max_attempts, self.timeout, self.lanes = _read_options(alias, self.options)
        #: By queue, the rate its job starts tasks at; the system check reports a bad entry (left out here).
        self.rate_limits = _tasks_checks.valid_rate_limits(self.options.get("rate_limit"))
        if not self.queues:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['QUEUES'] is empty: name the queues this backend serves, e.g. ['default']."
            )
        for queue in self.queues:
            _check_queue_name(alias, queue)
        #: Recorded in each task's worker_ids: this host and process.
        self.worker_id = f"{socket.gethostname()[:40]}:{os.getpid()}"
        self._register_jobs()

    def validate_task(self, task: Task) -> None:
        """Django's checks of a task (``InvalidTask``), then register it: a worker runs only the tasks a fabrika
        backend validated in its process, and looks a row's path up among them, importing nothing.

        Django calls this for each task it makes (``Task.__post_init__``), so a task is registered when the module
        that defines it is imported.
        """
        super().validate_task(task)
        task_paths.register(task)

    def enqueue(self, task: Task, args: list[object], kwargs: dict[str, object]) -> TaskResult:
        """Insert the task's row in the current transaction and kick its queue's job when that commits."""
        _checked(self, task)
        row = task_rows.insert(self.alias, task, args, kwargs)
        result = result_of(row, task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """Read the task's row; raise ``TaskResultDoesNotExist`` for an id no task has."""
        _tasks_checks.require_installed(self.alias)
        discover_tasks()  # a process that never imported the row's task (a web process reading a result)
        from .models import QueuedTask

        try:
            return result_of(QueuedTask.objects.get(result_id=_parse_id(result_id), backend=self.alias))
        except QueuedTask.DoesNotExist:
            raise TaskResultDoesNotExist(result_id) from None

    async def aget_result(self, result_id: str) -> TaskResult:
        """See ``get_result()``."""
        _tasks_checks.require_installed(self.alias)
        discover_tasks()
        from .models import QueuedTask

        try:
            row = await QueuedTask.objects.aget(result_id=_parse_id(result_id), backend=self.alias)
        except QueuedTask.DoesNotExist:
            raise TaskResultDoesNotExist(result_id) from None
        return result_of(row)

    def check(self, **kwargs: object) -> list[checks.CheckMessage]:
        """Report a backend whose tables cannot exist: fabrika_django missing from INSTALLED_APPS.

        Quiet where fabrika's own check of ``TASKS`` is registered (it says the same, also where Django's tasks
        checks are not): one error, not two.
        """
        # fabrika's checks module registers its checks when it is imported, before any check runs.
        if apps.is_installed("fabrika_django") or "fabrika_django.checks" in sys.modules:
            return []
        return [_tasks_checks.not_installed(self.alias)]

    def _register_jobs(self) -> None:
        """Register (again, after a settings change) the built-in job of each of this backend's queues."""
        options: _JobOptions = {"timeout": min(2 * self.timeout, MAX_TIMEOUT), "lanes": self.lanes}
        for queue in sorted(self.queues):
            name = task_job_name(self.alias, queue)
            rate_limit = self.rate_limits.get(queue)
            cron(SWEEP_SCHEDULE, name=name, rate_limit=rate_limit, **options)(_handler(self.alias, queue))
            if rate_limit is None:
                CLAIMS_AT_START[name] = claim_at_start(self.alias, queue)  # a kicked run's first claim, in its start
            else:
                CLAIMS_AT_START.pop(name, None)  # a claim in the start would pass the queue's token bucket
        #: The paths of the tasks this backend's periodic entries enqueue (``discover_tasks`` imports them).
        self.periodic_tasks = [entry.task for entry in _periodic.register(self.alias, self.options.get("periodic", {}))]


@cache(maxsize=256)
def _checked(backend: FabrikaBackend, task: Task) -> None:
    """Refuse a task ``backend`` cannot enqueue (fabrika_django not installed, Django's ``validate_task``), and
    register it; raise, or return and be remembered.

    Once per (backend, task) until a setting changes (``_sql.cache`` empties on ``setting_changed``): what is checked
    is the task's own fields (a frozen dataclass, compared by value), the backend's options and the settings
    (``INSTALLED_APPS``, ``USE_TZ``), never the call's arguments, and an enqueue in a loop paid for it each time.
    Bounded: ``using(run_after=...)`` makes a new task for each call.
    """
    _tasks_checks.require_installed(backend.alias)
    backend.validate_task(task)


class _JobOptions(TypedDict, total=False):
    """What ``@cron`` is given for a queue's job, beside its schedule, name and rate."""

    timeout: timedelta
    lanes: int


def _handler(alias: str, queue: str) -> Handler:
    """Return the function of one queue's job (defined in this module, so registering it again replaces it)."""

    def serve_tasks(ctx: JobContext) -> None:
        # Every run of a queue's job passes here (a worker's, ``fabrika_job run``'s, ``run_tasks``'): the tasks it
        # claims are looked up in a full registry.
        discover_tasks()
        serve_queue(ctx, alias, queue)

    return serve_tasks


def _parse_id(result_id: object) -> uuid.UUID:
    try:
        return uuid.UUID(str(result_id))
    except ValueError:
        raise TaskResultDoesNotExist(result_id) from None


def _read_options(alias: str, options: Mapping[str, object]) -> tuple[int, timedelta, int]:
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {', '.join(map(repr, unknown))}: "
            f"FabrikaBackend takes {', '.join(_OPTIONS)}."
        )
    max_attempts = options.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
    if not _whole(max_attempts) or not 1 <= max_attempts <= 100:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']['max_attempts']={max_attempts!r} is out of bounds: "
            "give a whole number from 1 to 100."
        )
    timeout = options.get("timeout", DEFAULT_TIMEOUT)
    if _whole(timeout) or isinstance(timeout, float):
        timeout = timedelta(seconds=timeout)
    if not isinstance(timeout, timedelta) or not timedelta(seconds=1) <= timeout <= MAX_TASK_TIMEOUT:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']['timeout']={options.get('timeout')!r} is out of bounds: "
            "give seconds (or a timedelta) from 1 second to 12 hours."
        )
    lanes = options.get("lanes", 1)
    if not _whole(lanes) or not 1 <= lanes <= MAX_LANES:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['OPTIONS']['lanes']={lanes!r} is out of bounds: give a whole number from 1 to 64."
        )
    return max_attempts, timeout, lanes


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_queue_name(alias: str, queue: object) -> None:
    if not isinstance(queue, str) or not _QUEUE_NAME.match(queue) or len(task_job_name(alias, queue)) > _MAX_JOB_NAME:
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]['QUEUES'] holds {queue!r}, which cannot name a job: use letters, digits, "
            f"'_', '.' or '-' (the job 'tasks.{alias}.<queue>' has at most {_MAX_JOB_NAME} characters)."
        )


def register_configured_backends() -> None:
    """Make the backends in ``settings.TASKS`` that are fabrika's, so their jobs are registered at start-up."""
    _configured_backends()


def discover_tasks() -> None:
    """Register the project's tasks before a worker claims one, or a result is read: import each installed app's
    ``tasks`` module (``autodiscover_modules``, once per set of installed apps), and each periodic entry's task
    (a path the settings name: the project's own code). A row's path is never imported (``_task_paths``)."""
    task_paths.discover()
    _import_periodic_tasks()


@cache(maxsize=1)
def _import_periodic_tasks() -> None:
    """Import each periodic entry's task, once until a setting changes (``TASKS`` names them): every run of a
    queue's job asks, and the answer changes only with the settings."""
    for backend in _configured_backends():
        for path in backend.periodic_tasks:
            try:
                import_string(path)
            except ImportError:
                continue  # fabrika.E042 says so, and the entry's job fails on it


def _configured_backends() -> list[FabrikaBackend]:
    """The backends in ``settings.TASKS`` that are fabrika's, each made once (its ``__init__`` registers its jobs)."""
    from django.conf import settings

    from ._tasks_compat import task_backends

    found = []
    for alias, params in getattr(settings, "TASKS", {}).items():
        backend = params.get("BACKEND", "") if isinstance(params, dict) else ""
        try:
            backend_class = import_string(backend)
        except ImportError:
            continue  # Django's own check reports it
        if isinstance(backend_class, type) and issubclass(backend_class, FabrikaBackend):
            made = task_backends[alias]
            if isinstance(made, FabrikaBackend):  # it is: its class is
                found.append(made)
    return found


__all__ = ["FabrikaBackend"]
