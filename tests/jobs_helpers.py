"""Register throwaway jobs for one test."""

import contextlib

from fabrika_django.jobs import cron, registry


@contextlib.contextmanager
def temporary_job(func, schedule=None, **options):
    """Register ``func`` as a job for the block (named after the function), then forget it."""
    job = cron(schedule, **options)(func)
    try:
        yield job
    finally:
        registry.unregister(job.name)
