"""The last day, hour by hour: attempts per job by outcome and their durations, each queue's sampled backlog.

Every read is bounded by time. Attempts: once an hour is over, the sampling job folds its attempts into one
``AttemptHour`` row per job (counts by outcome band, a histogram of durations: ``_digest``), so the overview
reads at most 24 rows per job plus the attempts of the hour or two not folded yet (through the index on
``started``), and costs the same on a month of history as on a day of it. Samples: those taken in the last
24 hours, through the index on ``(queue, sampled)``, grouped in the database.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.db import connections, router
from django.db.models import Max
from django.db.models.functions import TruncHour

from .. import _digest
from .._runs import reads as run_reads
from ..models._tables import Attempt, AttemptHour, FoldedHour, Outcome, QueueSample
from . import _counts

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .._sql import SQLParam

HOURS = 24

#: An hour is folded this long after it ended (see ``fold_hours``).
FOLD_GRACE = timedelta(minutes=5)
_HOUR = timedelta(hours=1)

#: Outcomes drawn as their own band; every other failure code is drawn as "other failure".
_OWN_BANDS = (Outcome.SUCCEEDED, Outcome.HANDLER_FAILED, Outcome.TIMED_OUT)
OUTCOME_BANDS: tuple[str, ...] = (*_OWN_BANDS, "interrupted", "other")
_INTERRUPTED = frozenset({Outcome.LEASE_LOST, Outcome.SHUTDOWN, Outcome.CRASHED})


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
    if outcome in _OWN_BANDS:
        return str(outcome)
    return "interrupted" if outcome in _INTERRUPTED else "other"


def job_hours(names: list[str], now: datetime) -> dict[str, JobHours]:
    """Read the last day of attempts of the jobs ``names``, however long the history.

    Hours the sampling job folded (``fold_hours``) are read from their ``AttemptHour`` rows; the rest, from the
    first hour not folded on (the current one, and the last one for a few minutes after it ends), from the
    attempts themselves, folded here the same way. p50 and p95 come from the folded durations' buckets
    (``_digest``: within a bucket's width, 9 % of the value, of the exact percentile).
    """
    slots = hour_slots(now)
    index = {slot: position for position, slot in enumerate(slots)}
    hours = {name: JobHours(name) for name in names}
    digests: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    folded = {_utc_hour(hour) for hour in FoldedHour.objects.filter(hour__gte=slots[0]).values_list("hour", flat=True)}
    live_from = next((slot for slot in slots if slot not in folded), slots[-1] + _HOUR)
    stored = AttemptHour.objects.filter(hour__gte=slots[0], hour__lt=live_from, job__in=names)
    for row in stored:
        position = index.get(_utc_hour(row.hour))
        if position is not None:
            _add(hours[row.job], digests[row.job, position], position, _Tally.of(row))
    tallies, _running = _tallies(live_from, slots[-1] + _HOUR)
    for (job, hour), tally in tallies.items():
        position = index.get(hour)
        if job in hours and position is not None:
            _add(hours[job], digests[job, position], position, tally)
    for (job, position), counts in digests.items():
        hours[job].p50[position] = _digest.percentile(counts, 0.5)
        hours[job].p95[position] = _digest.percentile(counts, 0.95)
    return hours


def _add(hours: JobHours, digest: dict[int, int], position: int, tally: _Tally) -> None:
    for band, count in tally.counts.items():
        hours.counts[band][position] += count
    for bucket, count in tally.durations.items():
        digest[bucket] = digest.get(bucket, 0) + count


@dataclass
class _Tally:
    """One job's attempts of one hour, folded: how many ended in each band, and their durations by bucket."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOME_BANDS, 0))
    durations: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, row: AttemptHour) -> _Tally:
        return cls({band: getattr(row, band) for band in OUTCOME_BANDS}, _digest.decode(row.durations))

    def row(self, job: str, hour: datetime) -> AttemptHour:
        return AttemptHour(job=job, hour=hour, durations=_digest.encode(self.durations), **self.counts)


def _tallies(since: datetime, until: datetime) -> tuple[dict[tuple[str, datetime], _Tally], dict[datetime, int]]:
    """Fold the attempts started in ``[since, until)`` per job and hour; and count per hour those still running.

    PostgreSQL groups them in one statement (``run_reads.attempt_hours_sql``); elsewhere they are read here,
    fine for SQLite's one process and the hour or two read outside the folded ones.
    """
    tallies: dict[tuple[str, datetime], _Tally] = defaultdict(_Tally)
    running: dict[datetime, int] = defaultdict(int)
    for job, hour, outcome, bucket, count in _grouped_attempts(since, until):
        if outcome == Outcome.RUNNING:
            running[hour] += count
            continue
        tally = tallies[job, hour]
        tally.counts[outcome_band(outcome)] += count
        if bucket is not None:
            tally.durations[bucket] = tally.durations.get(bucket, 0) + count
    return tallies, running


def _grouped_attempts(since: datetime, until: datetime) -> Iterator[tuple[str, datetime, str, int | None, int]]:
    """(job, hour, outcome, duration bucket or None, count) of the attempts started in ``[since, until)``."""
    connection = connections[router.db_for_read(Attempt)]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(*hourly_sql(connection, since, until))
            rows = cursor.fetchall()
        hours: dict[object, datetime] = {}  # a day read whole (before its first fold) is thousands of rows
        for job, hour, outcome, bucket, count in rows:
            if hour not in hours:
                hours[hour] = _utc_hour(hour)
            yield job, hours[hour], outcome, bucket, count
        return
    grouped: dict[tuple[str, datetime, str, int | None], int] = defaultdict(int)
    for job, started, finished, outcome in run_reads.attempt_ends(since, until):
        bucket = None
        if finished is not None and outcome != Outcome.RUNNING:
            bucket = _digest.bucket_of(max(0.0, (finished - started).total_seconds()))  # clocks of two hosts
        grouped[job, _utc_hour(started).replace(minute=0, second=0, microsecond=0), outcome, bucket] += 1
    for (job, hour, outcome, bucket), count in grouped.items():
        yield job, hour, outcome, bucket, count


def hourly_sql(connection: BaseDatabaseWrapper, since: datetime, until: datetime) -> tuple[str, list[SQLParam]]:
    """PostgreSQL's statement of an hour's fold (``_sql.runs`` writes it; bench/overview.py explains it)."""
    return run_reads.attempt_hours_sql(connection, since, until)


def _utc_hour(moment: datetime | str) -> datetime:
    if isinstance(moment, str):  # pragma: no cover  a backend that answers text
        moment = datetime.fromisoformat(moment)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def fold_hours(now: datetime) -> int:
    """Fold each hour of the last day that is over and not folded yet (or had attempts running when it was)
    into ``AttemptHour`` rows, and mark it in ``FoldedHour``; return how many hours were folded.

    An hour is folded ``FOLD_GRACE`` after its end: an attempt's start is its worker's clock, and a worker whose
    clock is behind the sampler's may still start one "in" the hour just ended. Run in one transaction (the
    sampling job's): a reader sees an hour's rows before or after its fold, never half of them.
    """
    slots = hour_slots(now)
    known = dict(FoldedHour.objects.filter(hour__gte=slots[0]).values_list("hour", "running"))
    known = {_utc_hour(hour): running for hour, running in known.items()}
    todo = [slot for slot in slots if slot + _HOUR + FOLD_GRACE <= now and known.get(slot, 1) > 0]
    for first, last in _consecutive(todo):
        tallies, running = _tallies(first, last + _HOUR)
        AttemptHour.objects.filter(hour__gte=first, hour__lte=last).delete()
        AttemptHour.objects.bulk_create([tally.row(job, hour) for (job, hour), tally in sorted(tallies.items())])
        folded = [slot for slot in todo if first <= slot <= last]
        FoldedHour.objects.filter(hour__in=folded).delete()
        FoldedHour.objects.bulk_create([FoldedHour(hour=slot, folded=now, running=running[slot]) for slot in folded])
    return len(todo)


def _consecutive(slots: list[datetime]) -> Iterator[tuple[datetime, datetime]]:
    """(first, last) of each run of consecutive hours in ``slots`` (sorted): one statement reads each run."""
    first = previous = None
    for slot in slots:
        if previous is not None and slot - previous != _HOUR:
            yield first, previous  # type: ignore[misc]
            first = None
        first, previous = first or slot, slot
    if first is not None:
        yield first, previous  # type: ignore[misc]


def prune_folds(cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` folded hours (and their attempt hours) before ``cutoff``, oldest first."""
    hours = list(FoldedHour.objects.filter(hour__lt=cutoff).order_by("hour").values_list("hour", flat=True)[:batch])
    stale = list(AttemptHour.objects.filter(hour__lt=cutoff).order_by("pk").values_list("pk", flat=True)[:batch])
    deleted = AttemptHour.objects.filter(pk__in=stale).delete()[0] if stale else 0
    return int(deleted + (FoldedHour.objects.filter(hour__in=hours).delete()[0] if hours else 0))


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
    for model in _counts.queue_models():
        counts = _counts.count_queue(model, now, done=False)
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
