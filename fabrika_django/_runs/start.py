"""Starting a run: one description of the start (``Start``), taken by the one-statement start on a free lease
(PostgreSQL) and by the general start under the Job row's lock.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import connection as default_connection
from django.db import transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now
from django.utils import timezone

from .._running import CLAIMS_AT_START, ClaimedAtStart, framework_write
from .._sql import prepared
from .._sql import runs as run_sql
from ..jobs import registry
from ..models._tables import Attempt, Job, Lease, Outcome
from .fence import end_frozen_fences, lock_fences
from .lease import mark_crashed
from .pending import take_kicks
from .rows import Started, expires_in, lanes_of, lock_job

if TYPE_CHECKING:
    from .._sql import SQLParam

logger = logging.getLogger("fabrika_django.runner")


@dataclass
class Start:
    """What starting a run asks for; both ways of starting take their values from here, by name."""

    job: str
    trigger: str
    holder: str
    #: How long the lease is granted for, in seconds.
    seconds: float
    #: A run resumed after a takeover stops resuming past this attempt number.
    max_attempt: int
    #: False for a worker serving the pending flag: start only while it is up (see ``start_or_join``).
    mark_pending: bool = True
    #: The job's lanes: how many runs of it may be active at once.
    lanes: int = 1
    #: The run's clock at its start: the ``now`` of a first claim made in the start's statement
    #: (``_running.CLAIMS_AT_START``).
    now: datetime | None = None
    token: uuid.UUID = field(default_factory=uuid.uuid4)
    run_id: uuid.UUID = field(default_factory=uuid.uuid4)

    def params(self) -> dict[str, SQLParam]:
        """The named parameters of ``free_lease_start_sql``."""
        return {
            "name": self.job,
            "token": self.token,
            "holder": self.holder,
            "run_id": self.run_id,
            "seconds": self.seconds,
            "trigger": self.trigger,
            "outcome": Outcome.RUNNING.value,
        }


def start_or_join(start: Start) -> Started | None:
    """Take a lease of the job for a new run, or mark the job pending if it is busy (None).

    Which lane (``_pick_lane``): a lease left expired by a holder that vanished (a crash, SIGKILL) is taken
    over first: the cut-off attempt is recorded ``crashed``, and its run goes on with its next attempt while
    it has retries left. Else a free lane, when no run of the job is active (the seed's rule: kicks coalesce
    into one pending run), or when a run whose claim came back full asked for one more lane (``ask_for_lane``).

    ``mark_pending=False`` is a worker serving the flags (a kick it heard): with the flags already cleared, a
    run that started after the kick served it (another worker heard it too), so nothing starts.
    """
    with framework_write():
        started = _start_on_free_lease(start)
        if started is not None:
            return started
        with transaction.atomic():
            return _start_under_job_lock(start)


def _start_on_free_lease(start: Start) -> Started | None:
    """PostgreSQL: start a run on a free lease in one statement, its first Attempt row included.

    It does what ``_start_under_job_lock`` does when the lease is free, in the same order of locks (the Job
    row, then the Lease row), so the two never deadlock: a kick's run starts one commit after the worker heard
    it, not three. Anything else (a held or expired lease, a resumed run, rows not made yet) answers None,
    and the general path decides under the Job row's lock.
    """
    connection = default_connection
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return None
    params = start.params()
    claim = CLAIMS_AT_START.get(start.job)
    pieces = None
    now = start.now or timezone.now()
    if claim is not None:
        ctes, tail, claim_params = claim(connection, now, registry.get(start.job))
        pieces, params = (ctes, tail), {**params, **claim_params}
    sql = run_sql.free_lease_start(connection, require_pending=not start.mark_pending, lanes=start.lanes, claim=pieces)
    rows = prepared.fetchall(connection, sql, params)
    if not rows:
        return None
    row = rows[0]
    started = Started(
        start.job, start.token, start.run_id, start.trigger, 1, start.holder, int(row[0]), 0, int(row[1]), start.lanes
    )
    if pieces is not None:
        started.claimed = ClaimedAtStart(connection.alias, now, [found[2:] for found in rows if found[2] is not None])
    return started


def _start_under_job_lock(start: Start) -> Started | None:
    """The general start, in the caller's transaction: the Job row's lock, then a lease (any backend)."""
    name, trigger, run_id, attempt = start.job, start.trigger, start.run_id, 1
    lock_job(name)
    take_kicks([name])  # kick rows no worker took yet: a run that starts serves them, else they make the flag
    since, lane_asked = Job.objects.filter(name=name).values_list("pending_since", "lane_asked").first() or (None, None)
    pending, asked = since is not None, lane_asked is not None
    lanes = lanes_of(name, start.lanes)
    previous = _pick_lane(name, lanes, serving=start.mark_pending or pending, asked=asked)
    if previous is None:
        # Busy: the job is pending (an active run serves the flag as it ends); an ask found no lane free: it lapses
        # (the next full claim asks again).
        if start.mark_pending and not pending:
            Job.objects.filter(name=name).update(pending_since=Now())
        if asked:
            Job.objects.filter(name=name).update(lane_asked=None)
        return None
    held = previous.token is not None
    resumed = bool(held and previous.run_id and previous.attempt < start.max_attempt)
    if resumed and previous.run_id is not None:
        run_id, attempt = previous.run_id, previous.attempt + 1
        trigger = Job.objects.filter(name=name).values_list("last_trigger", flat=True).first() or trigger
    if held:
        # A frozen holder's fenced transactions end first, else the fence's lock below would wait for them.
        end_frozen_fences(previous.id)
        lock_fences(Lease.objects.filter(pk=previous.id))
    taken = Lease.objects.filter(Q(token__isnull=True) | Q(expires__lt=Now()), id=previous.id).update(
        token=start.token, holder=start.holder, run_id=run_id, attempt=attempt, expires=expires_in(start.seconds)
    )
    if not taken:
        # The holder came back and renewed after all.
        if start.mark_pending:
            Job.objects.filter(name=name, pending_since__isnull=True).update(pending_since=Now())
        return None
    lane = previous.lane
    if held:
        mark_crashed(name, [previous.run_id] if previous.run_id is not None else [])  # a held lease has its run
        logger.warning("Lease taken over job=%s lane=%d run=%s resumed=%d", name, lane, previous.run_id, resumed)
    if not resumed:
        # A run that starts now serves every kick and ask so far; one after this point makes one more run.
        Job.objects.filter(name=name).update(
            pending_since=None, lane_asked=None, last_run_id=run_id, last_trigger=trigger, last_started=Now()
        )
    # The attempt's row in the same commit: one commit less before the handler starts.
    first = Attempt.objects.create(
        job=name, run_id=run_id, trigger=trigger, number=attempt, lane=lane, holder=start.holder
    )
    return Started(name, start.token, run_id, trigger, attempt, start.holder, first.pk, lane, previous.id, lanes)


@dataclass(frozen=True)
class _LaneState:
    """One lane's lease as a start reads it under the Job row's lock."""

    id: int
    lane: int
    #: The holder's token; None: the lane is free.
    token: uuid.UUID | None
    run_id: uuid.UUID | None
    attempt: int
    #: The lease's expiry passed (by the database's clock).
    expired: bool


def _pick_lane(name: str, lanes: int, *, serving: bool, asked: bool) -> _LaneState | None:
    """Choose the lease a start takes, under the Job row's lock; None: the job is busy.

    A lane left expired first (its run is cut off and resumes); else a free lane when the job is idle and the
    start serves a kick, a fire or a hand (``serving``), or when a run asked for one more lane (``asked``).
    """
    leases = _lanes_rows(name, lanes)
    expired = [row for row in leases if row.token is not None and row.expired]
    if expired:
        return expired[0]
    free = [row for row in leases if row.token is None]
    idle = len(free) == len(leases)
    if free and ((serving and idle) or asked):
        return free[0]
    return None


def _lanes_rows(name: str, lanes: int) -> list[_LaneState]:
    """Read the job's lanes ``0..lanes-1`` (making rows missing: a job that gained lanes), lowest first."""
    gone = ExpressionWrapper(Q(expires__lt=Now()), output_field=BooleanField())
    fields = ("id", "lane", "token", "run_id", "attempt", "expired")
    rows = list(Lease.objects.filter(job=name, lane__lt=lanes).annotate(expired=gone).values(*fields))
    if len(rows) < lanes:
        # A kick makes the Job row alone; without its Lease rows no run could ever take a lease.
        Lease.objects.bulk_create([Lease(job=name, lane=lane) for lane in range(lanes)], ignore_conflicts=True)
        rows = list(Lease.objects.filter(job=name, lane__lt=lanes).annotate(expired=gone).values(*fields))
    return sorted((_LaneState(**row) for row in rows), key=lambda row: row.lane)
