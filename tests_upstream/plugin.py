"""The pytest plugin of the django-tasks-db run (``-p tests_upstream.plugin``): the import aliases before Django
starts, the deselections, and the adaptations of ``selection.py``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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


def _name(item: pytest.Item) -> str:
    """``Class.test_name`` of a test of their module."""
    return ".".join(item.nodeid.split("::")[1:])
