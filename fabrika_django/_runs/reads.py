"""What the worker's scan, the admin, the status command and the operators' pages read of a job's rows."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import connection as default_connection
from django.db.models import Count, Exists, Min, OuterRef, Subquery
from django.db.models.functions import Coalesce, Now

from .. import _digest
from .._sql import runs as run_sql
from ..models._tables import Attempt, Job, KickRequest, Lease, Outcome
from .pending import waiting_kicks
from .rows import lanes_of, lease_active

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models import Field

    from .._sql import SQLParam

logger = logging.getLogger("fabrika_django.runner")


@dataclass(frozen=True)
class JobState:
    """A job's ``Job`` row (a fresh row's defaults when it has none yet) and the state of its runs now."""

    name: str
    pending_since: datetime | None
    lane_asked: datetime | None
    next_fire: datetime | None
    last_run_id: uuid.UUID | None
    last_trigger: str
    last_outcome: str
    last_started: datetime | None
    last_finished: datetime | None
    last_success: datetime | None
    failures_in_row: int
    #: A run of the job holds an active lease now.
    active: bool
    #: The job's runs active now (one a lane).
    active_lanes: int
    #: The lanes the job may run in.
    lanes: int
    #: One of the holders of the active runs (None: no run active).
    holder: str | None
    #: The pending flag is set, or a kick no worker has taken yet waits.
    pending: bool


def job_states(names: list[str], now: datetime) -> dict[str, JobState]:
    """Read the ``Job`` row of each named job with its run state (``JobState``).

    Jobs without rows yet (never run, no worker started since they were declared) answer the defaults of a
    fresh row: nothing is written on a read.
    """
    rows = {row.name: row for row in Job.objects.filter(name__in=names)}
    active: dict[str, list[str]] = {}
    leases = Lease.objects.filter(lease_active(now), job__in=names).values_list("job", "holder").order_by("lane")
    for job, holder in leases:
        active.setdefault(job, []).append(holder)
    kicked = waiting_kicks(names)
    states = {}
    for name in names:
        row = rows.get(name) or Job(name=name)  # an unsaved row holds every field's default
        holders = active.get(name, [])
        states[name] = JobState(
            name=name,
            pending_since=row.pending_since,
            lane_asked=row.lane_asked,
            next_fire=row.next_fire,
            last_run_id=row.last_run_id,
            last_trigger=row.last_trigger,
            last_outcome=row.last_outcome,
            last_started=row.last_started,
            last_finished=row.last_finished,
            last_success=row.last_success,
            failures_in_row=row.failures_in_row,
            active=bool(holders),
            active_lanes=len(holders),
            lanes=lanes_of(name),
            holder=holders[0] if holders else None,
            # A kick no worker has taken yet is pending too.
            pending=row.pending_since is not None or name in kicked,
        )
    return states


def active_annotation(now: datetime) -> Exists:
    """An ``Exists`` to annotate a ``Job`` queryset with ``active`` (the jobs admin)."""
    return Exists(Lease.objects.filter(lease_active(now), job=OuterRef("name")))


def active_lanes_annotation(now: datetime) -> Coalesce:
    """A subquery to annotate a ``Job`` queryset with ``active_lanes``: its runs active now (the jobs admin)."""
    active = Lease.objects.filter(lease_active(now), job=OuterRef("name")).order_by()
    return Coalesce(Subquery(active.values("job").annotate(count=Count("pk")).values("count")), 0)


def kicked_annotation() -> Exists:
    """An ``Exists`` to annotate a ``Job`` queryset with ``kicked``: a kick row no worker has taken yet."""
    return Exists(KickRequest.objects.filter(job=OuterRef("name")))


def job_names() -> set[str]:
    """Return the names of the jobs that have a ``Job`` row."""
    return set(Job.objects.values_list("name", flat=True))


def recent_attempts(name: str, count: int) -> list[Attempt]:
    """Return the job's last ``count`` attempts, newest first."""
    return list(Attempt.objects.filter(job=name)[:count])


def take_fire(name: str, read: datetime | None, following: datetime | None) -> bool:
    """Move the job's next fire from the value ``read`` to ``following``; True if this call moved it.

    A compare-and-set: of all workers that read the same fire, exactly one owns it.
    """
    return bool(Job.objects.filter(name=name, next_fire=read).update(next_fire=following))


@dataclass(frozen=True)
class ScanState:
    """What the worker's scan reads of one served job (``StateReader``)."""

    #: The pending flag is set.
    pending: bool
    #: A run asked for one more lane.
    asked: bool
    next_fire: datetime | None
    #: A lane's lease is active.
    held: bool
    #: The job's lanes whose lease is active.
    active: int
    #: The job's lanes whose lease was left expired (its holder is gone).
    orphaned: int


_FireConverter = Callable[[object], "datetime | None"]


class StateReader:
    """The worker's scan: every served job's pending flag, next fire and lease, in one query."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)
        self._sql: tuple[str, _FireConverter] | None = None

    def read(self) -> dict[str, ScanState]:
        if self._sql is None:
            self._sql = _states_sql(len(self.names))
        sql, convert_fire = self._sql
        with default_connection.cursor() as cursor:
            cursor.execute(sql, self.names)
            rows = cursor.fetchall()
        return {
            name: ScanState(
                pending=bool(pending),
                asked=bool(asked),
                next_fire=convert_fire(fire),
                held=bool(active),
                active=int(active or 0),
                orphaned=int(orphaned or 0),
            )
            for name, pending, asked, fire, active, orphaned in rows
        }


def _states_sql(count: int) -> tuple[str, _FireConverter]:
    """The scan's query, built once per worker, and the converter of its ``next_fire`` column.

    A scan runs on every poll, and the ORM spent most of its time compiling the lease subqueries (a
    millisecond on SQLite, more than the query). This is the same query written out: one row per job
    with its pending flag, next fire, and whether its lease is active (``lease_active``) or was left
    expired (by the database's clock, ``Now()``), counted over the job's lanes. Parameters: the job names.
    """
    connection = default_connection
    compiler = Job.objects.none().query.get_compiler(connection=connection)
    now, _ = compiler.compile(Now())
    sql = run_sql.job_states(connection, count, now)
    field: Field[object, object] = Job._meta.get_field("next_fire")  # type: ignore[assignment]
    column = field.get_col(Job._meta.db_table)
    converters = connection.ops.get_db_converters(column) + column.get_db_converters(connection)

    def convert_fire(value: object) -> datetime | None:
        for converter in converters:
            value = converter(value, column, connection)
        return value  # type: ignore[return-value]

    return sql, convert_fire


def prune_attempts(cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` attempt rows started before ``cutoff``, oldest first; return how many."""
    pks = list(Attempt.objects.filter(started__lt=cutoff).order_by("pk").values_list("pk", flat=True)[:batch])
    if not pks:
        return 0
    return int(Attempt.objects.filter(pk__in=pks).delete()[0])


def expired_leases(now: datetime) -> list[tuple[str, str, datetime | None]]:
    """Return (job, holder, expires) of each lease with a token whose expiry passed: held by nobody alive."""
    held = Lease.objects.filter(token__isnull=False, expires__lt=now).order_by("job")
    return [(job, holder, expires) for job, holder, expires in held.values_list("job", "holder", "expires")]


def pending_since(name: str) -> datetime | None:
    """Return when the job was first kicked without a run serving it yet (None: not pending)."""
    return Job.objects.filter(name=name).values_list("pending_since", flat=True).first()


def kicked_since(name: str) -> datetime | None:
    """Return when the job was first kicked without a run serving it yet: its pending flag, else its oldest kick
    row (a kick whose NOTIFY a worker heard is taken by the run's start itself, so it never became the flag)."""
    flag = pending_since(name)
    if flag is not None:
        return flag
    oldest: datetime | None = KickRequest.objects.filter(job=name).aggregate(oldest=Min("created"))["oldest"]
    return oldest


def first_attempt_started(name: str, holder: str, since: datetime) -> datetime | None:
    """Return the start of ``holder``'s first attempt of a run of ``name`` that started at ``since`` or later."""
    started = Attempt.objects.filter(job=name, holder=holder, number=1, started__gte=since).order_by("started")
    return started.values_list("started", flat=True).first()


@dataclass(frozen=True)
class KickWait:
    """The reads that time a kicked run's wait (the worker's metric ``fabrika_job_kick_latency_seconds``)."""

    job: str
    holder: str

    def kicked(self) -> datetime | None:
        return kicked_since(self.job)

    def started(self, kicked: datetime) -> datetime | None:
        return first_attempt_started(self.job, self.holder, kicked)


def attempt_hours_sql(connection: BaseDatabaseWrapper, since: datetime, until: datetime) -> tuple[str, list[SQLParam]]:
    """PostgreSQL's one statement of an hour's fold (``_history``; bench/overview.py explains it).

    Per job, hour (UTC) of the start, outcome and duration bucket (``_digest.bucket_sql``; null while running) of
    the attempts started in ``[since, until)``: how many. Through the index on ``started``; over every job:
    filtering by name costs more than the rows of jobs no longer registered.
    """
    bucket = _digest.bucket_sql("greatest(extract(epoch FROM finished - started)::float8, 0)")
    return run_sql.attempt_hours(connection, bucket), [Outcome.RUNNING.value, since, until]


def attempt_ends(since: datetime, until: datetime) -> Iterator[tuple[str, datetime, datetime | None, str]]:
    """(job, started, finished, outcome) of the attempts started in ``[since, until)``, read in chunks."""
    started = Attempt.objects.filter(started__gte=since, started__lt=until)
    return started.values_list("job", "started", "finished", "outcome").iterator(chunk_size=2000)
