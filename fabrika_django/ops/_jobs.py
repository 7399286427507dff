"""fabrika's own jobs: the history's pruning, the file sweep and the queues' samples.

Registered by the app's ``ready()`` (``apps.py``), after the models load, like a project's ``jobs.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from .._runs import reads as run_reads
from ..conf import settings
from ..context import JobContext
from ..jobs import cron
from ..models import QueuedTask, SentMail
from . import _history
from ._sweep_job import run_in_job

_PRUNE_BATCH = 1000


@cron("17 3 * * *", name="fabrika_prune_history", timeout=timedelta(hours=1))
def prune_history(ctx: JobContext) -> None:
    """Delete attempt history, queue samples and folded hours older than ``RUN_HISTORY_DAYS``, mail ledger keys
    older than ``MAIL_LEDGER_DAYS`` and Django tasks finished more than ``TASK_RESULT_DAYS`` ago, in batches."""
    cutoff = ctx.now() - timedelta(days=settings.RUN_HISTORY_DAYS)
    pruned = _in_batches(ctx, lambda: run_reads.prune_attempts(cutoff, _PRUNE_BATCH))
    samples = _in_batches(ctx, lambda: _history.prune_samples(cutoff, _PRUNE_BATCH))
    folds = _in_batches(ctx, lambda: _history.prune_folds(cutoff, _PRUNE_BATCH))
    ctx.log.debug(
        "Pruned attempts=%d samples=%d folds=%d older_than_days=%d", pruned, samples, folds, settings.RUN_HISTORY_DAYS
    )
    _prune_mail_ledger(ctx)
    _prune_task_results(ctx)


def _in_batches(ctx: JobContext, delete_batch: Callable[[], int]) -> int:
    """Call ``delete_batch`` in a fenced transaction of its own until it deletes nothing; return the total."""
    total = 0
    while True:
        ctx.signal.throw_if_aborted()
        with ctx.transaction():
            deleted = delete_batch()
        if not deleted:
            return total
        total += deleted


def _prune_task_results(ctx: JobContext) -> None:
    """Delete the Django tasks (fabrika_django.tasks) that finished more than ``TASK_RESULT_DAYS`` ago."""
    finished = QueuedTask.objects.filter(finished_at__lt=ctx.now() - timedelta(days=settings.TASK_RESULT_DAYS))

    def delete_batch() -> int:
        batch = list(finished.order_by("pk").values_list("pk", flat=True)[:_PRUNE_BATCH])
        return QueuedTask.objects.filter(pk__in=batch).delete()[0] if batch else 0

    pruned = _in_batches(ctx, delete_batch)
    ctx.log.debug("Pruned tasks=%d older_than_days=%d", pruned, settings.TASK_RESULT_DAYS)


def _prune_mail_ledger(ctx: JobContext) -> None:
    """Forget mail ledger keys older than ``MAIL_LEDGER_DAYS`` (a repeat after that sends again), in batches."""
    old = SentMail.objects.filter(created__lt=ctx.now() - timedelta(days=settings.MAIL_LEDGER_DAYS))

    def delete_batch() -> int:
        batch = list(old.order_by("created").values_list("pk", flat=True)[:_PRUNE_BATCH])  # the created index
        return SentMail.objects.filter(pk__in=batch).delete()[0] if batch else 0

    pruned = _in_batches(ctx, delete_batch)
    ctx.log.debug("Pruned ledger_rows=%d older_than_days=%d", pruned, settings.MAIL_LEDGER_DAYS)


@cron("43 4 * * *", name="fabrika_sweep_files", timeout=timedelta(hours=1))
def sweep_files(ctx: JobContext) -> None:
    """Delete the files no file column references, when ``FILE_SWEEP`` turns the sweep on (see ``_sweep``)."""
    run_in_job(ctx)


@cron("*/5 * * * *", name="fabrika_sample_queues", timeout=timedelta(minutes=4))
def sample_queues(ctx: JobContext) -> None:
    """Record each queue table's waiting, due-now and dead counts, for the overview's charts and health; and
    fold the attempts of each hour just over into the charts' hourly rows."""
    now = ctx.now()
    samples = _history.take_samples(now)  # counted outside the transaction: it holds only the insert
    with ctx.transaction():
        _history.save_samples(samples)
        folded = _history.fold_hours(now)
    ctx.log.debug("Sampled queues=%d folded_hours=%d", len(samples), folded)
