"""fabrika_django's settings: one dict, ``settings.FABRIKA``, read at access time."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings

DEFAULTS: dict[str, Any] = {
    # Prefix of every idempotency key, so two environments on one provider account never share one.
    "ENVIRONMENT": "",
    # Absolute base of the links ctx.url() builds.
    "BASE_URL": "http://localhost:8000",
    # How long a lease lasts unless renewed; a crashed holder blocks its job for at most this long.
    "LEASE_SECONDS": 30,
    # How often a worker without LISTEN/NOTIFY looks for kicks, in seconds.
    "POLL_INTERVAL": 1.0,
    # Database alias the worker LISTENs on: a direct connection, never through a transaction pooler.
    "LISTEN_DATABASE": "default",
    # Attempt history older than this many days is pruned by the built-in job.
    "RUN_HISTORY_DAYS": 30,
    # The mail idempotency ledger forgets a key after this many days (pruned by the built-in job); a repeat
    # after that sends again.
    "MAIL_LEDGER_DAYS": 30,
    # Finished Django tasks (fabrika_django.tasks) older than this many days are pruned by the built-in job.
    "TASK_RESULT_DAYS": 7,
    # Keep exception messages in the history. Off: a message can quote a user's value.
    "STORE_ERROR_MESSAGES": False,
    # Dotted path of a factory returning the application's own mail sender (a Django e-mail backend) or None.
    "OWN_MAIL_SENDER": None,
    # Hold every job to its declared ``actions``.
    "ENFORCE_ACTIONS": False,
    # Dotted path of ``(field_file) -> "live" | "pending" | "quarantined" | "rejected"``; None: every file is live.
    "FILE_STATE": None,
    # The file sweep, opt-in: {"storages": ["default"], "older_than_days": 7}; None: no sweep.
    "FILE_SWEEP": None,
    # A bearer token that lets a scraper read fabrika_django.metrics.view without a staff session (None: staff only);
    # where set, the worker's --metrics-port endpoint answers only its bearer too.
    "METRICS_TOKEN": None,
    # The health codes' thresholds, by name (old_due_row_seconds, old_transaction_seconds, ...): None or a dict of
    # those changed; fabrika_django._health.HEALTH_DEFAULTS has every key and its default.
    "HEALTH": None,
    # Let the commits that count an attempt (a run's start, a task's start, the kicks taken) skip PostgreSQL's WAL
    # flush: lower latency, but a database crash may then rerun a job or task without counting the attempt.
    "ASYNC_BOOKKEEPING_COMMITS": False,
}


class FabrikaSettings:
    """Each attribute reads ``settings.FABRIKA[name]`` on access, so override_settings works."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"FABRIKA has no key {name!r}")
        return getattr(django_settings, "FABRIKA", {}).get(name, DEFAULTS[name])


settings = FabrikaSettings()
