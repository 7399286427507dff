"""The test kit: ``run_job()``, ``JobResult``, captured kicks, a fixed clock, and their pytest fixtures.

``run_job`` runs one run synchronously through the worker's own path (lease, fence, write guard,
retries). Inside an open transaction (pytest-django's default ``django_db``, Django's ``TestCase``) the
handler runs inline on the test's connection and the kicks its transactions commit go out when the run
ends; with ``transaction=True`` it runs exactly as ``manage.py fabrika_job run`` does.

This module is a pytest plugin (entry point ``pytest11``) and is imported before Django is set up:
it imports no model at module level.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

MAIL_MODES = ("locmem", "none")


@dataclass(frozen=True)
class JobResult:
    """How a run under the test kit ended."""

    job: str
    #: "succeeded", a failure code ("handler_failed", "timed_out", "write_outside_transaction", …), or "coalesced".
    outcome: str
    attempts: int
    run_id: uuid.UUID | None

    @property
    def ok(self) -> bool:
        return self.outcome in ("succeeded", "coalesced")

    @property
    def failure(self) -> str | None:
        """The failure code, or None when the run succeeded."""
        return None if self.ok else self.outcome


class FixedClock:
    """A clock that stands still until moved: ``clock.now``, ``clock.advance(timedelta)``, ``clock.set(dt)``."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime(2026, 1, 5, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> datetime:
        self.now = self.now + delta
        return self.now

    def set(self, moment: datetime) -> None:
        self.now = moment


_clock: FixedClock | None = None


def run_job(name: str, *, mail: str = "locmem", now: datetime | None = None) -> JobResult:
    """Run the job ``name`` once, now, the way the worker would, and answer how it ended.

    ``mail``: "locmem" sends into ``django.core.mail.outbox``; "none" makes ``ctx.mail.available`` false.
    ``now``: the run's clock (what ``claim`` and ``ctx.now()`` see); the ``fabrika_clock`` fixture's by default.
    Retries follow each other without the pause a real run takes.
    """
    from django.db import connection

    from . import runner

    if mail not in MAIL_MODES:
        raise ValueError(f"run_job(mail={mail!r}) is not a test mail mode: use 'locmem' or 'none'.")
    if now is not None:
        fixed = now

        def clock() -> datetime:
            return fixed

    elif _clock is not None:
        clock = _clock
    else:
        from django.utils import timezone

        clock = timezone.now
    if connection.in_atomic_block:
        with _commit_hooks_of_the_run():
            result = runner.run(name, "manual", clock=clock, mail_mode=mail, inline=True, pause=_no_pause)
    else:
        result = runner.run(name, "manual", clock=clock, mail_mode=mail, inline=False, pause=_no_pause)
    return JobResult(job=result.job, outcome=result.outcome, attempts=result.attempts, run_id=result.run_id)


def _no_pause(failed_attempt: int) -> float:
    return 0.0


def _commit_hooks_of_the_run():
    """Run, after the job, the on-commit hooks its (savepoint) transactions left in the test's transaction."""
    from django.test import TestCase

    return TestCase.captureOnCommitCallbacks(execute=True)


@pytest.fixture(autouse=True)
def _fabrika_handler_threads() -> Iterator[None]:
    """End the job handler threads a test left idle, so their connections never outlive its database."""
    yield
    from ._handlers import handler_threads

    handler_threads.drain()


@pytest.fixture
def fabrika_run_job():
    """The test kit's ``run_job``."""
    return run_job


@pytest.fixture
def fabrika_kicks() -> Iterator[list[str]]:
    """A list of the names of the jobs kicked (after their commit) during the test."""
    from . import kicks

    recorded: list[str] = []
    kicks._recorders.append(recorded)
    try:
        yield recorded
    finally:
        kicks._recorders.remove(recorded)


@pytest.fixture
def fabrika_clock() -> Iterator[FixedClock]:
    """A fixed clock that ``run_job`` uses when no ``now=`` is given; move it with ``.advance()``."""
    global _clock
    previous, _clock = _clock, FixedClock()
    try:
        yield _clock
    finally:
        _clock = previous
