"""Which jobs claim which queue tables, so that a requeue kicks them.

A requeued row is due at once, but a job runs only when its schedule fires or it is kicked: a kick-only job
would never see it. So each run remembers the tables it claimed from (one INSERT that ignores a known pair,
when the run's handler ends, not on claim's path), and the admin's requeue and ``fabrika_job requeue`` kick
every job that ever claimed that table.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from django.db import DatabaseError, models

from ._running import ActiveRun, framework_write
from ._runs.wake import wake_for_rows_due_again

logger = logging.getLogger(__name__)


@contextmanager
def remembering_claims(run: ActiveRun) -> Iterator[None]:
    """When the block ends, remember the tables ``run`` claimed from in it (``remember_claims``), and wake a
    kick-only job when the rows it claimed come due again (``_runs.wake``)."""
    try:
        yield
    finally:
        if run.claimed:
            remember_claims(run.job.name, run.claimed)
            wake_for_rows_due_again(run.job, run.claimed, run.now())


def remember_claims(job: str, claimed: Iterable[tuple[str, str]]) -> None:
    """Record that ``job`` claimed from each (alias, queue label); a known pair costs nothing but the statement."""
    from .models._tables import Claimer

    try:
        with framework_write():
            for alias, label in sorted(claimed):
                Claimer.objects.using(alias).bulk_create([Claimer(queue=label, job=job)], ignore_conflicts=True)
    except DatabaseError as exc:
        # A later run remembers it; meanwhile a requeue of that table waits for the job's schedule.
        logger.warning("Could not remember the tables a run claimed job=%s error=%s", job, type(exc).__name__)


def kick_claimers(model: type[models.Model], *, using: str | None = None) -> list[str]:
    """Kick (on commit) every registered job that has claimed rows of ``model``; return their names, sorted."""
    from .jobs import registry
    from .kicks import kick
    from .models._tables import Claimer

    known = {job.name for job in registry}
    names = Claimer.objects.using(using).filter(queue=model._meta.label).values_list("job", flat=True)
    kicked = sorted(name for name in set(names) if name in known)
    for name in kicked:
        kick(name, using=using)
    return kicked
