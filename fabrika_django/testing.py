"""The test kit: ``run_job()``, ``JobResult``, captured kicks and a fixed clock (fixtures: ``_pytest_plugin``).

``run_job`` runs one run synchronously through the worker's own path (lease, fence, write guard,
retries). Inside an open transaction (pytest-django's default ``django_db``, Django's ``TestCase``) the
handler runs inline on the test's connection and the kicks its transactions commit go out when the run
ends; with ``transaction=True`` it runs exactly as ``manage.py fabrika_job run`` does.

It needs no pytest: a project on Django's own test runner imports ``run_job`` from here. The pytest
fixtures live in ``fabrika_django._pytest_plugin``, which only the plugin entry point (``pytest11``) loads.
This module is imported by that plugin before Django is set up: it imports no model at module level.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.db import connection
from django.test import TestCase
from django.utils import timezone

if TYPE_CHECKING:
    from ._tasks_compat import TaskResult

MAIL_MODES = ("locmem", "none")


@dataclass(frozen=True)
class JobResult:
    """How a run under the test kit ended."""

    job: str
    #: "succeeded", a failure code ("handler_failed", "timed_out", "write_outside_transaction", …), or "coalesced".
    outcome: str
    attempts: int
    run_id: uuid.UUID | None

    @property
    def ok(self) -> bool:
        """True when the run succeeded, or joined a run already active (``coalesced``)."""
        return self.outcome in ("succeeded", "coalesced")

    @property
    def failure(self) -> str | None:
        """The failure code, or None when the run succeeded."""
        return None if self.ok else self.outcome


class FixedClock:
    """A clock that stands still until moved: ``clock.now``, ``clock.advance(timedelta)``, ``clock.set(dt)``."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime(2026, 1, 5, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> datetime:
        """Move the clock on by ``delta`` and return the new time."""
        self.now = self.now + delta
        return self.now

    def set(self, moment: datetime) -> None:
        """Set the clock to ``moment``."""
        self.now = moment


_clock: FixedClock | None = None


def run_job(name: str, *, mail: str = "locmem", now: datetime | None = None) -> JobResult:
    """Run the job ``name`` once, now, the way the worker would, and answer how it ended.

    ``mail``: "locmem" sends into ``django.core.mail.outbox``; "none" makes ``ctx.mail.available`` false.
    ``now``: the run's clock (what ``claim`` and ``ctx.now()`` see); the ``fabrika_clock`` fixture's by default.
    Retries follow each other without the pause a real run takes.
    """
    # Imported here: the runner imports the models, and this module is imported before Django is set up.
    from . import runner

    if mail not in MAIL_MODES:
        raise ValueError(f"run_job(mail={mail!r}) is not a test mail mode: use 'locmem' or 'none'.")
    if now is not None:
        fixed = now

        def clock() -> datetime:
            return fixed

    elif _clock is not None:
        clock = _clock
    else:
        clock = timezone.now
    with _commit_hooks_of_the_run():
        result = runner.run(name, clock=clock, mail_mode=mail, pause=_no_pause)
    return JobResult(job=result.job, outcome=result.outcome, attempts=result.attempts, run_id=result.run_id)


def run_tasks(queue: str = "default", backend: str = "default") -> list[TaskResult]:
    """Run every due task of ``backend``'s ``queue`` now, through the worker's path, and answer their results.

    The answer is a ``TaskResult`` per task the run took (ran, or gave up), in the order it took them, read
    after the run; a row whose path is no registered task (failed with the code ``task_not_registered``) has
    none. The run imports each installed app's ``tasks`` module first, as a worker's does.
    A task whose attempt failed is due again only after its backoff, so a second call does not retry it at
    once: make it due first (``QueuedTask.objects.filter(...).update(due=timezone.now())``).
    """
    from django.db.models import Q
    from django.utils import timezone

    from . import runner
    from ._runs.tasks import result_of
    from ._tasks_compat import task_backends
    from .jobs import task_job_name
    from .models import QueuedTask
    from .tasks import FabrikaBackend

    served = task_backends[backend]  # made after a settings change: that registers its queues' jobs
    if not isinstance(served, FabrikaBackend):
        raise ValueError(f"run_tasks(backend={backend!r}) is not a FabrikaBackend in TASKS: name one that is.")
    if queue not in served.queues:
        raise ValueError(f"run_tasks(queue={queue!r}) is not a queue of TASKS[{backend!r}]: use one of its QUEUES.")
    name = task_job_name(backend, queue)
    started = timezone.now()
    with _commit_hooks_of_the_run():
        runner.run(name, clock=timezone.now, pause=_no_pause)
    taken = QueuedTask.objects.filter(
        Q(last_attempted_at__gte=started) | Q(finished_at__gte=started), backend=backend, queue_name=queue
    )
    results = []
    for row in taken.order_by("last_attempted_at", "pk"):
        try:
            results.append(result_of(row))
        except Exception:  # its path is no registered task: no TaskResult can stand for it
            continue
    return results


def _no_pause(failed_attempt: int) -> float:
    return 0.0


def _commit_hooks_of_the_run() -> AbstractContextManager[object]:
    """Inside the test's transaction, run after the job the on-commit hooks its (savepoint) transactions left
    there; outside one, they ran as each of the job's transactions committed."""
    if connection.in_atomic_block:
        return TestCase.captureOnCommitCallbacks(execute=True)
    return nullcontext()
