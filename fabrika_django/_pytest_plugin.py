"""The test kit's pytest fixtures; loaded only by the plugin entry point (``pytest11``) in setup.cfg.

``fabrika_django.testing`` holds ``run_job`` and needs no pytest; this module adds the fixtures a pytest
project gets: ``fabrika_run_job``, ``fabrika_kicks``, ``fabrika_clock``. Imported before Django is set up,
so it imports no model.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import testing
from ._handlers import handler_threads
from ._runs import kickmarks
from .testing import FixedClock, run_job


@pytest.fixture(autouse=True)
def _fabrika_handler_threads() -> Iterator[None]:
    """End the job handler threads a test left idle, so their connections never outlive its database."""
    yield
    handler_threads.drain()


@pytest.fixture
def fabrika_run_job():
    """The test kit's ``run_job``."""
    return run_job


@pytest.fixture
def fabrika_kicks() -> Iterator[list[str]]:
    """A list of the names of the jobs kicked (after their commit) during the test."""
    recorded: list[str] = []
    kickmarks.recorders.append(recorded)
    try:
        yield recorded
    finally:
        kickmarks.recorders.remove(recorded)


@pytest.fixture
def fabrika_clock() -> Iterator[FixedClock]:
    """A fixed clock that ``run_job`` uses when no ``now=`` is given; move it with ``.advance()``."""
    previous = testing._clock
    testing._clock = FixedClock()
    try:
        yield testing._clock
    finally:
        testing._clock = previous
