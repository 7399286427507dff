"""A kick-only job's wake: the run's end notes when the first row it claimed comes due again.

A claimed row that is not finished (its attempt failed, or was killed or cut off with it) is due again after its
backoff, and nothing but a kick starts a job without a schedule: its rows would wait for the next kick. So the
end of such a job's handler sets the job's ``next_fire`` to the earliest of those times, unless an earlier
wake is set, and the worker runs the job then as it runs a fire (once across workers, ``take_fire``). A takeover
of a killed run claims nothing yet due, and its end sets the wake for the rows the killed run held.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from django.apps import apps
from django.db import DatabaseError
from django.db.models import Min, Q

from .._queuestate import due_again_q
from .._running import framework_write
from ..jobs import CronJob

logger = logging.getLogger("fabrika_django.runner")


def wake_for_rows_due_again(job: CronJob, claimed: Iterable[tuple[str, str]], now: datetime) -> datetime | None:
    """Set ``job``'s wake to when the first row it claimed from ``claimed`` (alias, queue label) is due again.

    Only for a job without a schedule (a scheduled one runs at its fires anyway); return the wake set, or None.
    """
    if job.schedule is not None:
        return None
    try:
        dues = [_first_due_again(alias, label, now) for alias, label in sorted(claimed)]
        wake = min((due for due in dues if due is not None), default=None)
        if wake is not None:
            _set_wake(job.name, wake)
        return wake
    except DatabaseError as exc:
        # The next kick runs the job as before; the worker sees the database's failure itself.
        logger.warning("Could not set the wake of a job job=%s error=%s", job.name, type(exc).__name__)
        return None


def _first_due_again(alias: str, label: str, now: datetime) -> datetime | None:
    model = apps.get_model(label)
    rows = model._default_manager.using(alias).filter(due_again_q(model, now))
    first: datetime | None = rows.aggregate(first=Min("due"))["first"]
    return first


def _set_wake(name: str, wake: datetime) -> None:
    from ..models._tables import Job  # on use: the models import the claim, which this package holds

    with framework_write():
        Job.objects.filter(Q(next_fire__isnull=True) | Q(next_fire__gt=wake), name=name).update(next_fire=wake)
