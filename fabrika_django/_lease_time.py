"""How long a lease lasts: the one rule that every grant, renewal and bound on a holder counts in.

A grant lasts ``LEASE_SECONDS`` (at least a second), and a job's at most its timeout. The bounds on a frozen or
cut-off holder's session (``_sessions``, ``_runs.rows.frozen_holder_bound``) count in the same lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .conf import settings

if TYPE_CHECKING:
    from .jobs import CronJob


def lease_seconds(job: CronJob | None = None) -> float:
    """How long each grant of a lease lasts: ``LEASE_SECONDS``, at least a second; for ``job``, at most its
    timeout."""
    seconds = max(1.0, float(settings.LEASE_SECONDS))
    if job is None:
        return seconds
    return max(1.0, min(seconds, job.timeout.total_seconds()))
