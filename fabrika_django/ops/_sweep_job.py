"""The built-in job ``fabrika_sweep_files`` and ``manage.py fabrika_job sweep-files [--dry-run]``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

from ..conf import settings
from ._sweep import SweepReport, sweep
from ._sweep_setting import check_setting, configured

if TYPE_CHECKING:
    from django.core.management.base import BaseCommand

    from ..context import JobContext


def run_in_job(ctx: JobContext) -> SweepReport | None:
    """The built-in job's body: one sweep of every configured storage, fenced by the job's lease."""
    config = configured()
    if config is None:
        ctx.log.debug("File sweep not configured (FABRIKA['FILE_SWEEP'])")
        return None
    problems = check_setting(config)
    if problems:  # `manage.py check` says so too; never guess what a bad setting meant to keep
        raise ImproperlyConfigured(f"{problems[0].msg} {problems[0].hint}")
    report = sweep(
        config,
        now=ctx.now(),
        transaction_for=lambda alias: ctx.transaction(using=alias),
        check_abort=ctx.signal.throw_if_aborted,
    )
    _last_reports.clear()  # one run at a time per process (the job's lease): keep only the latest
    _last_reports[str(ctx.run_id)] = report
    ctx.log.info("Swept files %s", report.line())
    return report


#: The report of each run of this process, by run id, for ``fabrika_job sweep-files`` to print.
_last_reports: dict[str, SweepReport] = {}


def command(out: BaseCommand, *, dry_run: bool, **options: object) -> None:
    """``fabrika_job sweep-files [--dry-run]``: a run of the built-in job, or a listing of what it would delete."""
    from django.core.management.base import CommandError

    config = configured()
    problems = check_setting(settings.FILE_SWEEP) if settings.FILE_SWEEP is not None else []
    if config is None or problems:
        if problems:
            raise CommandError(f"{problems[0].msg} {problems[0].hint} Nothing was deleted.", returncode=2)
        raise CommandError(
            "Setting FABRIKA['FILE_SWEEP'] is not set. Turn the sweep on with FABRIKA['FILE_SWEEP'] = "
            "{'storages': ['default'], 'older_than_days': 7}.",
            returncode=2,
        )
    kept = "kept: {referenced} referenced, {recent} newer than {days} days"
    if dry_run:

        def show(storage: str, name: str) -> None:
            out.stdout.write(f"{storage}: {name if name.isprintable() else ascii(name)}")

        report = sweep(config, dry_run=True, on_orphan=show)
        counts = kept.format(days=config["older_than_days"], **vars(report)) + _unreadable(report)
        out.stdout.write(f"Would delete {report.deleted} files ({counts}); deleted nothing.")
        return
    from .. import runner
    from ..jobs import registry

    result = runner.run(registry.get("fabrika_sweep_files"))  # a manual run
    done = _last_reports.pop(str(result.run_id), None)
    if result.outcome == "coalesced":
        out.stdout.write("The file sweep is running elsewhere: marked pending, it runs once more after.")
    elif not result.ok or done is None:
        raise CommandError(
            f"The file sweep failed: {result.outcome} (run {result.run_id}); files it deleted before stay deleted, "
            "see its attempts in the admin.",
            returncode=1,
        )
    else:
        counts = kept.format(days=config["older_than_days"], **vars(done)) + _unreadable(done)
        busy = f"; {done.busy_batches} batches left for the next sweep (writers held the tables)"
        out.stdout.write(
            f"Deleted {done.deleted} files ({counts}){busy if done.busy_batches else ''} (run {result.run_id})."
        )


def _unreadable(report: SweepReport) -> str:
    """What the sweep left because the worker may not read a folder or delete a file: counts, never paths."""
    said = f"; {report.undeletable} files the worker may not delete" if report.undeletable else ""
    if report.unreadable:
        said += f"; {report.unreadable} folders skipped: the worker may not read them"
    return said
