"""The last day, hour by hour: attempts per job by outcome and their durations, each queue's sampled backlog.

Every read is bounded by time: the attempts started in the last 24 hours (through the index on ``started``),
and the samples taken in them (through the index on ``(queue, sampled)``), aggregated in the database where
it can, so the overview costs the same on a month of history as on a day of it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, router
from django.db.models import Max
from django.db.models.functions import TruncHour

from . import _jobstate, _report  # modules, not their names: _report imports this one (through _health)
from .models import Attempt, QueueSample

HOURS = 24

#: Outcomes drawn as their own band; every other failure code is drawn as "other failure".
OUTCOME_BANDS = ("succeeded", "handler_failed", "timed_out", "interrupted", "other")
_INTERRUPTED = frozenset({"lease_lost", "shutdown", "crashed"})
_NAMED_BANDS = ("succeeded", "handler_failed", "timed_out")


@dataclass
class JobHours:
    """One job's last day: per hour, attempts by outcome band and duration percentiles (seconds)."""

    name: str
    counts: dict[str, list[int]] = field(default_factory=lambda: {band: [0] * HOURS for band in OUTCOME_BANDS})
    p50: list[float | None] = field(default_factory=lambda: [None] * HOURS)
    p95: list[float | None] = field(default_factory=lambda: [None] * HOURS)


@dataclass
class QueueHours:
    """One queue table's last day: per hour, the largest due-now and dead count its samples saw."""

    queue: str
    due_now: list[int | None] = field(default_factory=lambda: [None] * HOURS)
    dead: list[int | None] = field(default_factory=lambda: [None] * HOURS)


def hour_slots(now: datetime) -> list[datetime]:
    """Return the starts of the last ``HOURS`` hours (UTC), the current one last."""
    current = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return [current - timedelta(hours=HOURS - 1 - index) for index in range(HOURS)]


def outcome_band(outcome: str) -> str:
    """Return the band an outcome is drawn in."""
    if outcome in ("succeeded", "handler_failed", "timed_out"):
        return outcome
    return "interrupted" if outcome in _INTERRUPTED else "other"


def job_hours(names: list[str], now: datetime) -> dict[str, JobHours]:
    """Read the last day of attempts of the jobs ``names``, however long the history.

    PostgreSQL: one grouped statement (counts by band and ``percentile_cont``). Elsewhere: counts grouped in
    the database, durations ranked here with the same interpolation, fine for SQLite's one process and modest
    histories.
    """
    slots = hour_slots(now)
    index = {slot: position for position, slot in enumerate(slots)}
    hours = {name: JobHours(name) for name in names}
    connection = connections[router.db_for_read(Attempt)]
    if connection.vendor == "postgresql":
        sql, params = hourly_sql(connection, slots[0])
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        for job, hour, total, *counts, interrupted, (p50, p95) in rows:
            position = index.get(hour.replace(tzinfo=UTC))
            if job not in hours or position is None:
                continue
            row = hours[job]
            for band, count in (*zip(_NAMED_BANDS, counts, strict=True), ("interrupted", interrupted)):
                row.counts[band][position] = count
            row.counts["other"][position] = total - sum(counts) - interrupted
            row.p50[position], row.p95[position] = float(p50), float(p95)
        return hours
    for job, hour, outcome, count in _jobstate.attempt_counts(names, slots[0]):
        position = index.get(_utc_hour(hour))
        if position is not None:
            hours[job].counts[outcome_band(outcome)][position] += count
    for job, position, p50, p95 in _duration_percentiles(names, slots):
        hours[job].p50[position], hours[job].p95[position] = p50, p95
    return hours


def hourly_sql(connection: Any, since: datetime) -> tuple[str, list[Any]]:
    """PostgreSQL's statement of ``job_hours`` (``_jobstate`` writes it; bench/overview.py explains it)."""
    return _jobstate.attempt_hours_sql(connection, since, list(_NAMED_BANDS), sorted(_INTERRUPTED))


def _utc_hour(moment: Any) -> datetime:
    if isinstance(moment, str):  # pragma: no cover  a backend that answers text
        moment = datetime.fromisoformat(moment)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _duration_percentiles(names: list[str], slots: list[datetime]) -> list[tuple[str, int, float, float]]:
    """Return (job, hour's position, p50, p95) of ended attempts' durations, ranked here (off PostgreSQL)."""
    index = {slot: position for position, slot in enumerate(slots)}
    durations: dict[tuple[str, int], list[float]] = defaultdict(list)
    for job, started, ended in _jobstate.attempt_times(names, slots[0]):
        position = index.get(_utc_hour(started).replace(minute=0, second=0, microsecond=0))
        if position is not None:
            durations[job, position].append(max(0.0, (ended - started).total_seconds()))  # clocks of two hosts
    return [
        (job, position, _percentile(values, 0.5), _percentile(values, 0.95))
        for (job, position), values in durations.items()
    ]


def _percentile(values: list[float], fraction: float) -> float:
    """Linear interpolation between closest ranks, as PostgreSQL's ``percentile_cont``."""
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def queue_hours(labels: list[str], now: datetime) -> dict[str, QueueHours]:
    """Read the last day of samples of the queue tables ``labels``: the largest counts per hour, grouped there."""
    slots = hour_slots(now)
    index = {slot: position for position, slot in enumerate(slots)}
    hours = {label: QueueHours(label) for label in labels}
    grouped = (
        QueueSample.objects.filter(queue__in=labels, sampled__gte=slots[0])
        .annotate(hour=TruncHour("sampled", tzinfo=UTC))
        .values_list("queue", "hour")
        .annotate(due_now=Max("due_now"), dead=Max("dead"))
        .order_by()
    )
    for queue, hour, due_now, dead in grouped:
        position = index.get(_utc_hour(hour))
        if position is not None:
            hours[queue].due_now[position], hours[queue].dead[position] = due_now, dead
    return hours


def take_samples(now: datetime) -> list[QueueSample]:
    """Count each queue table's waiting, due-now and dead rows (one statement each, no done count).

    Answers unsaved rows: the sampling job saves them inside ``ctx.transaction()``.
    """
    samples = []
    for model in _report.queue_models():
        counts = _report.count_queue(model, now, done=False)
        samples.append(
            QueueSample(
                queue=model._meta.label,
                sampled=now,
                waiting=counts.waiting,
                due_now=counts.due_now,
                dead=counts.dead,
            )
        )
    return samples


def save_samples(samples: list[QueueSample]) -> None:
    """Insert the samples ``take_samples`` answered, in one statement."""
    QueueSample.objects.bulk_create(samples)


def prune_samples(cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` samples taken before ``cutoff``, oldest first; return how many."""
    pks = list(QueueSample.objects.filter(sampled__lt=cutoff).order_by("pk").values_list("pk", flat=True)[:batch])
    return int(QueueSample.objects.filter(pk__in=pks).delete()[0]) if pks else 0


def dead_at_last_look(labels: list[str], now: datetime, window: timedelta) -> dict[str, int]:
    """Return each queue's dead count at its oldest sample within ``window`` before ``now`` (the last look).

    One statement per queue through the ``(queue, sampled)`` index; a queue without a sample is left out.
    """
    found = {}
    for label in labels:
        row = (
            QueueSample.objects.filter(queue=label, sampled__gte=now - window, sampled__lte=now)
            .order_by("sampled")
            .values_list("dead", flat=True)
            .first()
        )
        if row is not None:
            found[label] = row
    return found
