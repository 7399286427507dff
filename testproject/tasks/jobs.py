"""The seed's ``mark_overdue``: open tasks past their due day are marked, each re-read under its lock."""

from datetime import date, datetime, timedelta

from django.db.models import F, Q

from fabrika_django import cron

from .models import Task

BATCH = 500


def first_open_day(now: datetime) -> date:
    """Return the earliest due day that is not over everywhere yet.

    A due day is over once it has ended in the westernmost zone (UTC-12), so no one is told a task is overdue
    while it is still its due day where they are.
    """
    return (now - timedelta(hours=12)).date()


def is_overdue(now: datetime) -> Q:
    """The list's whole filter: open tasks, not yet marked, whose due day is over."""
    return Q(done=False, overdue=False, due_day__lt=first_open_day(now))


@cron("15 * * * *", retries=2, timeout=timedelta(minutes=10), actions=["tasks.change_task"])
def mark_overdue(ctx):
    """Mark every open task past its due day, hourly; a task changed since it was listed is decided again."""
    overdue = is_overdue(ctx.now())
    marked, after = 0, 0
    while True:
        # Bounded batches in pk order: memory stays flat, and a retry starts again from the first unmarked task.
        batch = list(Task.objects.filter(overdue, pk__gt=after).order_by("pk").values_list("pk", flat=True)[:BATCH])
        if not batch:
            break
        ctx.signal.throw_if_aborted()
        for pk in batch:
            with ctx.transaction():
                # The listed row is already old: re-read it under its lock and decide again with the whole filter.
                task = Task.objects.select_for_update().filter(overdue, pk=pk).first()
                if task is None:
                    continue
                marked += Task.objects.filter(pk=pk, version=task.version).update(
                    overdue=True, version=F("version") + 1
                )
        after = batch[-1]
    ctx.log.info("Marked overdue count=%d", marked)
