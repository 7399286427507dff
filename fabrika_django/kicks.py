"""kick(): ask for a run of a job once the current transaction commits.

A kick is one statement after the commit, in autocommit: it sets the job's ``pending_since`` if it is not
set yet. On PostgreSQL the same statement sends a NOTIFY on :data:`CHANNEL` (only when it set the flag), so
a listening worker starts the run at once; elsewhere workers poll the flag. Nothing is written inside the
request's own transaction, so kicks of a busy job never queue behind each other's row locks there.
"""

from __future__ import annotations

import logging
from functools import partial

from django.db import transaction

from . import _channel
from ._running import framework_write

logger = logging.getLogger(__name__)

#: The LISTEN/NOTIFY channel; versioned so workers of another release never misread a payload.
CHANNEL = _channel.CHANNEL

#: Lists the test kit appends kicked job names to (fabrika_django.testing's ``fabrika_kicks``).
_recorders: list[list[str]] = []


def kick(name: str, *, using: str | None = None) -> None:
    """Ask for a run of ``name`` once the current transaction commits (at once outside one).

    A rolled-back transaction kicks nothing; a failing kick never breaks the request that committed.
    Raises UnknownJob at once for a name no job has.
    """
    from .jobs import registry

    job = registry.get(name)
    transaction.on_commit(partial(_deliver, job.name, using), using=using, robust=True)


def _deliver(name: str, using: str | None) -> None:
    for recorder in _recorders:
        recorder.append(name)
    try:
        with framework_write():
            request_run(name, using=using)
    except Exception as exc:
        # The request committed; the schedule recovers a lost kick. Log the class only, never the message.
        logger.warning("Kick not delivered job=%s error=%s", name, type(exc).__name__)


def request_run(name: str, *, using: str | None = None) -> None:
    """Mark the job pending: a worker (or the active run, when it ends) runs it once more."""
    # Imported here: this module is imported with the package (``kick``), before the app registry is ready.
    from . import _jobstate

    marked = _jobstate.mark_pending(name, using=using)
    logger.debug("Kick job=%s marked=%d", name, marked)
