import pytest
from django.db import connection

from fabrika_django._running import ActiveRun, running
from fabrika_django.jobs import CronJob
from fabrika_django.schedule import Schedule

# What each marker needs, the vendors that have it, and the reason a test is skipped elsewhere.
_NEEDS = {
    "postgresql": ({"postgresql"}, "needs PostgreSQL: set DATABASE_URL=postgres://... (bin/test does)"),
    "mysql": ({"mysql"}, "needs MariaDB or MySQL: set DATABASE_URL=mysql://... (bin/test does)"),
    "row_locks": (
        {"postgresql", "mysql"},
        "needs row locks and SKIP LOCKED (PostgreSQL, MariaDB, MySQL): SQLite locks the whole database",
    ),
    "partial_indexes": (
        {"postgresql", "sqlite"},
        "needs partial indexes (PostgreSQL, SQLite): MariaDB and MySQL build every index whole",
    ),
    "listen_notify": (
        {"postgresql"},
        "needs LISTEN/NOTIFY (PostgreSQL): workers on this database poll, as test_worker.py's polling tests check",
    ),
}


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked with a database or a feature (``_NEEDS``) where the database lacks it."""
    from django.db import connections

    vendor = connections["default"].vendor
    for item in items:
        for marker, (vendors, reason) in _NEEDS.items():
            if marker in item.keywords and vendor not in vendors:
                item.add_marker(pytest.mark.skip(reason=reason))
                break


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
