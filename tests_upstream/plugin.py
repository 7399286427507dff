"""The pytest plugin of the django-tasks-db run (``-p tests_upstream.plugin``): the import aliases before Django
starts, the deselections, and the adaptations of ``selection.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from . import aliases, selection

aliases.install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from django.db import connection

    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        name = _name(item)
        reason = selection.deselected(name, connection.vendor)
        (dropped if reason else kept).append(item)
        known = selection.expected_failure(name, connection.vendor)
        if known and not reason:
            item.add_marker(pytest.mark.xfail(reason=known, strict=True))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(autouse=True, scope="session")
def _the_projects_tasks_registered() -> None:
    """Import every installed app's tasks module once, under these settings, as fabrika's worker does as it starts.

    Else the first read of a result imports them under the test's own settings: their worker tests override
    TASKS without the outbox app's "emails" queue, where Django refuses that app's task (InvalidTaskError).
    """
    from fabrika_django.tasks import discover_tasks

    discover_tasks()


@pytest.fixture(autouse=True)
def _their_worker_statement_counts(request: pytest.FixtureRequest) -> Iterator[None]:
    """Their worker tests count their own worker's statements around each run: count nothing there."""
    instance = request.instance
    if instance is None or type(instance).__name__ not in selection.UNCOUNTED_STATEMENTS:
        yield
        return
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    original = instance.assertNumQueries

    def assert_num_queries(num: Any, func: Any = None, *args: Any, using: str = "default", **kwargs: Any) -> Any:
        if func is not None:
            return original(num, func, *args, using=using, **kwargs)
        return CaptureQueriesContext(connection)

    instance.assertNumQueries = assert_num_queries
    yield


@pytest.fixture(autouse=True)
def _fabrikas_worker_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """Their process tests start ``db_worker``: start fabrika's instead, on the test database.

    ``--batch`` (run the due tasks, then exit) is ``fabrika_job run`` of the queue's job; otherwise the
    long-running ``fabrika_job worker --only`` that job. Their worker id is not fabrika's (host:pid).
    """
    instance = request.instance
    if instance is None or type(instance).__name__ not in selection.FABRIKA_WORKER_PROCESS:
        yield
        return

    def start_worker(args: list[str] | None = None, *, debug: bool = False, worker_id: str | None = None) -> Any:
        job = "tasks.default.default"
        action = ["run", job] if "--batch" in (args or []) else ["worker", "--only", job]
        process = subprocess.Popen(
            [sys.executable, "manage.py", "fabrika_job", *action],
            cwd=Path(__file__).resolve().parent.parent,
            stdout=None if debug else subprocess.PIPE,
            stderr=None if debug else subprocess.STDOUT,
            env={**os.environ, "DATABASE_URL": _test_database_url(), "FABRIKA_POLL_INTERVAL": "0.1"},
            text=True,
        )
        instance.processes.append(process)
        return process

    instance.start_worker = start_worker
    yield


def _test_database_url() -> str:
    """The test database's URL, for a process started by a test (testproject's settings read DATABASE_URL)."""
    from django.db import connection

    config = connection.settings_dict
    scheme = {"sqlite": "sqlite", "postgresql": "postgres", "mysql": "mysql"}[connection.vendor]
    if connection.vendor == "sqlite":
        return f"sqlite:///{config['NAME']}"
    user = quote(config["USER"] or "") + (":" + quote(config["PASSWORD"]) if config["PASSWORD"] else "")
    host = config["HOST"] or "localhost"
    port = f":{config['PORT']}" if config["PORT"] else ""
    return f"{scheme}://{user}@{host}{port}/{config['NAME']}"


def _name(item: pytest.Item) -> str:
    """``Class.test_name`` of a test of their module."""
    return ".".join(item.nodeid.split("::")[1:])
