"""``QueueQuerySet`` / ``QueueManager``: the state filters, and ``claim()`` which leases due rows."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections, models, router, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from ._running import active_run, framework_write
from .backoff import row_backoff
from .exceptions import ClaimInsideTransaction, ClaimOutsideJob

if TYPE_CHECKING:
    from ._running import ActiveRun

DEFAULT_MAX_ATTEMPTS = 10
MAX_CLAIM = 500

_M = TypeVar("_M", bound=models.Model)


def max_attempts_of(model: type[models.Model]) -> int:
    """Return the model's ``Queue.max_attempts`` (10 when it declares none)."""
    return int(getattr(getattr(model, "Queue", None), "max_attempts", DEFAULT_MAX_ATTEMPTS))


class QueueQuerySet(models.QuerySet[_M]):
    """Rows of a queue table. The state filters narrow; ``claim()`` acts and ends the chain."""

    def waiting(self) -> QueueQuerySet[_M]:
        """Rows with ``due`` set and attempts below the model's ``max_attempts``."""
        return self.filter(due__isnull=False, attempts__lt=max_attempts_of(self.model))

    def due_now(self, now: datetime | None = None) -> QueueQuerySet[_M]:
        """Waiting rows whose ``due`` has come."""
        return self.waiting().filter(due__lte=now or timezone.now())

    def dead(self) -> QueueQuerySet[_M]:
        """Rows that reached ``max_attempts``: never claimed again, kept for a person to requeue."""
        return self.filter(due__isnull=False, attempts__gte=max_attempts_of(self.model))

    def done(self) -> QueueQuerySet[_M]:
        """Rows whose ``due`` is null."""
        return self.filter(due__isnull=True)

    def claim(self, limit: int = 50, where: Q | None = None) -> list[_M]:
        """Lease up to ``limit`` due rows and return them with their new attempts, due and version.

        Terminal. Takes the oldest due rows first (then by pk), skipping rows another session holds, in a
        short transaction of its own: two statements, however many rows. Each claimed row gets one more
        attempt, a new version, and ``due`` moved by the backoff, so a crash leaves it due again later.
        Runs only inside a job run, never inside ``ctx.transaction()``.
        """
        run = _refuse_bad_claim(limit, where)
        using = getattr(self, "_db", None) or router.db_for_write(self.model)  # a claim always writes
        now = run.now()
        with framework_write(), transaction.atomic(using=using):
            _take_write_lock(self.model, using)
            rows = list(
                self.using(using)
                .due_now(now)
                .filter(where or Q())
                .order_by("due", "pk")
                .select_for_update(skip_locked=True, of=("self",))[:limit]
            )
            if rows:
                _lease(self.model, using, rows, run, now)
        return rows


class QueueManager(models.Manager.from_queryset(QueueQuerySet)):  # type: ignore[misc]
    """The manager of a queue table; a model's own manager must derive from it."""


def _refuse_bad_claim(limit: object, where: object) -> ActiveRun:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_CLAIM:
        raise ValueError(f"claim(limit={limit!r}) is out of bounds: give a whole number from 1 to {MAX_CLAIM}.")
    if where is not None and not isinstance(where, Q):
        raise TypeError(f"claim(where={where!r}) is not a Q: give e.g. where=Q(kind='welcome').")
    run = active_run()
    if run is None:
        raise ClaimOutsideJob(
            "claim() runs only inside a job run: call it from a @cron job's handler "
            "(or run_job() in tests); outside a job, read rows with the state filters such as due_now()."
        )
    if run.in_transaction:
        raise ClaimInsideTransaction(
            "claim() runs in a short transaction of its own and cannot run inside ctx.transaction(): "
            "claim before the work, then finish each row inside its own ctx.transaction()."
        )
    return run


def _take_write_lock(model: type[models.Model], using: str) -> None:
    """Take SQLite's database write lock first, since it has no row locks (elsewhere, rows lock themselves).

    A write statement that matches nothing still upgrades SQLite's transaction to the write lock, so a
    second claimer waits here instead of reading the same rows.
    """
    connection = connections[using]
    if connection.features.has_select_for_update_skip_locked:
        return
    with connection.cursor() as cursor:
        table = connection.ops.quote_name(model._meta.db_table)
        cursor.execute(f"UPDATE {table} SET version = version WHERE 1 = 0")  # noqa: S608


def _lease(model: type[models.Model], using: str, rows: list[Any], run: ActiveRun, now: datetime) -> None:
    """Add an attempt, a version and the backoff to every row in one UPDATE, and mirror it on the objects."""
    period = run.job.period
    by_attempts: dict[int, list[Any]] = defaultdict(list)
    for row in rows:
        by_attempts[row.attempts].append(row.pk)
    due_by_attempts = {attempts: now + row_backoff(period, attempts + 1) for attempts in by_attempts}
    if len(due_by_attempts) == 1:
        (new_due,) = due_by_attempts.values()
        due_expression: Any = Value(new_due)
    else:
        due_expression = Case(
            *(When(attempts=attempts, then=Value(due)) for attempts, due in due_by_attempts.items()),
            output_field=models.DateTimeField(),
        )
    model._base_manager.using(using).filter(pk__in=[row.pk for row in rows]).update(
        attempts=F("attempts") + 1, version=F("version") + 1, due=due_expression
    )
    for row in rows:
        row.due = due_by_attempts[row.attempts]
        row.attempts += 1
        row.version += 1
