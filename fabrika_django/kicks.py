"""kick(): ask for a run of a job once the current transaction commits."""

from __future__ import annotations

import logging
from functools import partial

from django.db import transaction

from ._running import framework_write

logger = logging.getLogger(__name__)

#: Lists the test kit appends kicked job names to (fabrika_django.testing's ``fabrika_kicks``).
_recorders: list[list[str]] = []


def kick(name: str, *, using: str | None = None) -> None:
    """Ask for a run of ``name`` once the current transaction commits (at once outside one).

    A rolled-back transaction kicks nothing; a failing kick never breaks the request that committed.
    Raises UnknownJob at once for a name no job has.
    """
    from .jobs import registry

    job = registry.get(name)
    transaction.on_commit(partial(_deliver, job.name, using), using=using, robust=True)


def _deliver(name: str, using: str | None) -> None:
    for recorder in _recorders:
        recorder.append(name)
    with framework_write():
        request_run(name, using=using)


def request_run(name: str, *, using: str | None = None) -> None:
    """Mark the job pending: a worker (or the active run, when it ends) runs it once more."""
    from django.db.models.functions import Now

    from .models import Job

    manager = Job.objects.using(using) if using else Job.objects
    if not manager.filter(name=name, pending_since__isnull=True).update(pending_since=Now()):
        manager.bulk_create([Job(name=name)], ignore_conflicts=True)
        manager.filter(name=name, pending_since__isnull=True).update(pending_since=Now())
    logger.debug("Kick job=%s", name)
