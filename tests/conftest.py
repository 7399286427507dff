import pytest
from django.db import connection

from fabrika_django._running import ActiveRun, running
from fabrika_django.jobs import CronJob
from fabrika_django.schedule import Schedule


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``postgresql`` on any other database, saying why."""
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" in engine:
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL=postgres://... (bin/test does)")
    for item in items:
        if "postgresql" in item.keywords:
            item.add_marker(skip)


def make_job(name="test_job", schedule="*/5 * * * *", **options):
    """A CronJob that is not registered: for tests that need a job but not the registry."""
    return CronJob(name=name, func=lambda ctx: None, schedule=Schedule(schedule) if schedule else None, **options)


@pytest.fixture
def job_run():
    """Return a function that marks a run of a (throwaway) job active in this thread: claim's precondition."""

    def enter(job=None, *, now=None):
        run = ActiveRun(job=job or make_job())
        if now is not None:
            run.clock = lambda: now
        return running(run)

    return enter


@pytest.fixture
def is_postgres():
    return connection.vendor == "postgresql"
