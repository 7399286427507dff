"""During and after a run: a new token per attempt, renewals, an attempt's end, the run's end, releases."""

from __future__ import annotations

import logging
import uuid

from django.db import connection as default_connection
from django.db import transaction
from django.db.models import Exists, F
from django.db.models.functions import Now
from django.utils import timezone

from .._running import framework_write
from .._sql import fence as fence_sql
from ..models._tables import Attempt, Job, Lease, Outcome, Trigger
from .fence import lock_fences
from .pending import is_pending, notify
from .rows import CUT_OFF, FREE, Started, expires_in, lease_active, lock_job, own_row

logger = logging.getLogger("fabrika_django.runner")


def rotate(lease: Started, number: int, seconds: float) -> bool:
    """Give attempt ``number`` a token of its own and its Attempt row, so a stale earlier one is fenced off."""
    token = uuid.uuid4()
    with framework_write(), transaction.atomic():
        lock_fences(own_row(lease))  # a fenced transaction of the earlier attempt may still be open
        moved = own_row(lease).update(token=token, attempt=number, expires=expires_in(seconds))
        if not moved:
            return False
        record = Attempt.objects.create(
            job=lease.job,
            run_id=lease.run_id,
            trigger=lease.trigger,
            number=number,
            lane=lease.lane,
            holder=lease.holder,
        )
    lease.token, lease.attempt, lease.attempt_id = token, number, record.pk
    return True


def renew(lease: Started, seconds: float) -> bool:
    """Extend the lease to ``seconds`` from now; False if it is no longer this run's (a database error raises)."""
    with framework_write():
        if default_connection.vendor == "mysql":
            return _renew_by_primary_key(lease, seconds)
        return bool(own_row(lease).update(expires=expires_in(seconds)))


def _renew_by_primary_key(lease: Started, seconds: float) -> bool:
    """MariaDB/MySQL: the renewal through the primary key only (see ``own_row``), which the optimizer is told.

    Given both the id and the token, it may pick the token's unique index for the UPDATE, whose exclusive lock
    on that entry would wait for the fence's shared one: a renewal under an open ``ctx.transaction()`` would
    wait for the transaction's end, and a handler that ignores its deadline would block its own cut-off.
    """
    connection = default_connection
    token = Lease._meta.get_field("token").get_db_prep_value(lease.token, connection)
    with connection.cursor() as cursor:
        cursor.execute(fence_sql.renew_by_primary_key(connection), [int(seconds * 1_000_000), lease.lease_id, token])
        return cursor.rowcount == 1


def end_attempt(lease: Started, outcome: str, fields: dict[str, str]) -> None:
    """Write how the lease's current attempt ended: its outcome, when, and ``fields`` (the error's class…)."""
    with framework_write():
        Attempt.objects.filter(pk=lease.attempt_id).update(outcome=outcome, finished=timezone.now(), **fields)


def end_run(lease: Started, outcome: str, *, again: bool, seconds: float, backlog: bool = True) -> bool:
    """End the run: start one more if ``again`` and the job was kicked meanwhile (True), else free the lease.

    Both happen under the Job row's lock, the one a starter takes, so a kick is either seen here or finds the
    lease free and starts its own run: never lost between the two. With lanes, a run whose last claim came back
    short (``backlog`` false: the queue is drained) leaves the kick to the job's other active runs, so an empty
    queue drains down to one run: the last one to end serves it.
    """
    summary: dict[str, object] = {"last_outcome": outcome, "last_finished": Now()}
    if outcome == Outcome.SUCCEEDED:
        summary.update(last_success=Now(), failures_in_row=0)
    else:
        summary["failures_in_row"] = F("failures_in_row") + 1
    token, run_id = uuid.uuid4(), uuid.uuid4()
    with framework_write(), transaction.atomic():
        lock_job(lease.job)
        mine = own_row(lease)
        lock_fences(mine)  # both ends below change the token
        # A stale attempt (its lease taken over, maybe by the same run resumed elsewhere) does not speak for the
        # job any more: only the lease's holder writes the summary (with one lane, only the job's latest run).
        latest = {"last_run_id": lease.run_id} if lease.lanes == 1 else {}
        Job.objects.filter(Exists(mine), name=lease.job, **latest).update(**summary)
        again = again and is_pending(lease.job)
        if again and not backlog and lease.lanes > 1:
            others = Lease.objects.filter(lease_active(timezone.now()), job=lease.job).exclude(pk=lease.lease_id)
            again = not others.exists()
        if not again:
            freed = mine.update(**FREE)
            if freed and outcome in CUT_OFF:
                # Cut off, and nobody took over: the job is left pending, so the next worker resumes its work.
                Job.objects.filter(name=lease.job, pending_since__isnull=True).update(pending_since=Now())
                notify(lease.job)  # PostgreSQL sends it when this transaction commits
            return False
        if not mine.update(token=token, run_id=run_id, attempt=1, expires=expires_in(seconds)):
            return False
        Job.objects.filter(name=lease.job).update(
            pending_since=None, lane_asked=None, last_run_id=run_id, last_trigger=Trigger.KICK, last_started=Now()
        )
        record = Attempt.objects.create(
            job=lease.job, run_id=run_id, trigger=Trigger.KICK, number=1, lane=lease.lane, holder=lease.holder
        )
    lease.token, lease.run_id, lease.attempt, lease.attempt_id = token, run_id, 1, record.pk
    lease.trigger = Trigger.KICK
    return True


def mark_crashed(name: str, run_ids: list[uuid.UUID]) -> None:
    """Mark the attempts of these runs still ``running`` as ``crashed``: they never got to record their end."""
    Attempt.objects.filter(job=name, run_id__in=run_ids, outcome=Outcome.RUNNING).update(
        outcome=Outcome.CRASHED, finished=Now()
    )


def release(name: str, holder: str) -> bool:
    """Free the job's lease if ``holder`` holds it, marking its running attempt crashed; True if it did."""
    held = Lease.objects.filter(job=name, holder=holder, token__isnull=False)
    with framework_write(), transaction.atomic():
        locked = lock_fences(held)
        if locked is not None:
            held = held.filter(pk__in=locked)
        run_ids = [run for run in held.values_list("run_id", flat=True) if run is not None]
        freed = held.update(**FREE)
        mark_crashed(name, run_ids)
    return bool(freed)


def release_all(holder_prefix: str) -> list[str]:
    """Free every lease held by a holder whose name starts with ``holder_prefix``; return their jobs."""
    with framework_write(), transaction.atomic():
        held = Lease.objects.filter(holder__startswith=holder_prefix, token__isnull=False)
        locked = lock_fences(held)
        if locked is not None:
            held = held.filter(pk__in=locked)
        names = list(held.values_list("job", flat=True))
        held.update(**FREE)
    return names
