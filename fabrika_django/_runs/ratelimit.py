"""Shared rate limits (``@cron(..., rate_limit="20/s")``, a task queue's ``OPTIONS["rate_limit"]``): the claim's
token bucket.

A job declared with a rate has one ``RateBucket`` row: the tokens it held at ``updated``. Capacity N, refilled at
N per unit, starting full; so over any window of t units its claims, in every lane, worker and host together,
take at most N·(1 + t) rows. Each claim of the job, in one transaction on the bucket's database:

1. locks the bucket row (``SELECT ... FOR UPDATE``; SQLite: the database write lock), making it full the first
   time;
2. refills it in Python from its ``(tokens, updated)`` and the worker's clock, to at most N;
3. claims at most as many rows as whole tokens are there (the queue's claim, inside the same transaction when
   the queue is on the same database: a crash loses both or neither);
4. writes back what the claimed rows left, only when it claimed some.

With no whole token the claim ends that transaction and waits for the next token on ``ctx.signal`` (an aborted
attempt stops waiting and the claim answers nothing); it never claims more than the bucket holds. It does not wait
on an empty queue (one existence read says so), nor for a token that comes after the attempt's deadline: it
answers nothing, and the rows left wait for the job's next run (its schedule, a kick; a task queue's sweep runs
every minute). Marking the job pending instead would start runs back to back that each find no token. The time
waited is the worker's ``fabrika_job_rate_limited_seconds_total{job}``.

Hosts' clocks: ``updated`` never moves back, so a host whose clock is behind refills nothing until its clock
passes it; a clock ahead by s seconds may refill up to N·s/unit early.

A job without a rate never comes here: the claim tests ``job.rate_limit`` and goes its usual way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections, router, transaction
from django.utils import timezone

from .. import _metrics
from .._running import framework_write
from .._sql import quoted
from .._sql import rows as row_sql
from ..jobs import parse_rate

if TYPE_CHECKING:
    from .._running import ActiveRun

#: The shortest wait for a token, in seconds: below it a wait costs more than it saves.
_MIN_WAIT = 0.001


def claim(
    run: ActiveRun, limit: int, take: Callable[[int, datetime], list[Any]], has_due: Callable[[], bool]
) -> list[Any]:
    """Claim for ``run`` (a job with a rate) at most ``limit`` rows and at most the bucket's whole tokens.

    ``take(n, now)`` claims up to n rows at the bucket's ``now`` (the queue's claim, in a transaction of its own
    or, on the bucket's database, inside the bucket's); ``has_due()`` says whether the queue has a row due now.
    Waits for a token as the module's docstring says; answers the claimed rows, or nothing when the queue is empty
    or the attempt ended.
    """
    from ..models._buckets import RateBucket  # on use: the models import the claim, which imports this module

    job = run.job
    capacity, unit = parse_rate(job.rate_limit)
    per_second = capacity / unit
    alias = router.db_for_write(RateBucket)
    waited = 0.0
    try:
        while True:
            with framework_write(), transaction.atomic(using=alias):
                now = timezone.now()
                tokens, updated = _locked_bucket(RateBucket, alias, job.name, capacity, now)
                tokens = min(float(capacity), tokens + max(0.0, (now - updated).total_seconds()) * per_second)
                allowed = min(limit, int(tokens))
                if allowed >= 1:
                    found = take(allowed, now)
                    if found:
                        _write_bucket(RateBucket, alias, job.name, tokens - len(found), max(now, updated))
                    return found
            delay = max(_MIN_WAIT, (1.0 - tokens) / per_second)
            signal = getattr(run.context, "signal", None)
            if signal is None or not has_due():
                return []
            if delay >= signal.remaining():
                return []  # the token comes after the attempt's deadline: the job's next run takes it
            started = time.monotonic()
            aborted = signal.wait(delay)
            waited += time.monotonic() - started
            if aborted:
                return []
    finally:
        if waited:
            _metrics.observe_rate_limited(job.name, waited)


def _locked_bucket(model: Any, alias: str, job: str, capacity: int, now: datetime) -> tuple[float, datetime]:
    """Lock the job's bucket row in the open transaction and answer its (tokens, updated); make it full first."""
    connection = connections[alias]
    if not connection.features.has_select_for_update:
        with connection.cursor() as cursor:  # SQLite: the database write lock, taken before the read
            cursor.execute(row_sql.write_lock(*quoted(connection, model, "tokens")))
    bucket = model.objects.using(alias).select_for_update().filter(pk=job).values_list("tokens", "updated")
    found = list(bucket.all())
    if not found:
        # Two first claims both insert: one row is made, the other insert does nothing, and both read it.
        model.objects.using(alias).bulk_create([model(job=job, tokens=capacity, updated=now)], ignore_conflicts=True)
        found = list(bucket.all())
    return found[0]


def _write_bucket(model: Any, alias: str, job: str, tokens: float, updated: datetime) -> None:
    model.objects.using(alias).filter(pk=job).update(tokens=max(0.0, tokens), updated=updated)
