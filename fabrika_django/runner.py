"""One run of a job: its lease, its attempts (with timeout and retries), their outcomes and history.

This module orchestrates: it starts or joins a run, runs attempts one after another with a pause between
them, records how each ended, and ends the run. The rows of a run (``Job``, ``Lease``, ``Attempt``) are
written by ``_runs``; executing a handler (its thread, the deadline, the abort) is ``_execute``'s.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from django.db import connection as default_connection
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from . import _metrics
from ._execute import execute
from ._lease_time import lease_seconds
from ._running import AttemptState, LaneDemand
from ._runs import lease as run_lease
from ._runs import rows as run_rows
from ._runs import start as run_start
from ._runs.fence import LeaseFence
from ._runs.rows import inline_lease_seconds, valid_until
from ._signal import AbortSignal
from .backoff import retry_pause
from .conf import settings
from .context import JobContext
from .jobs import CronJob, registry
from .models import Outcome, Trigger

logger = logging.getLogger(__name__)

_STOP_OUTCOMES = frozenset({Outcome.LEASE_LOST, Outcome.SHUTDOWN})
#: A run that did not start: another run of the job is active, and the job was left pending for it.
COALESCED = "coalesced"


@dataclass
class RunResult:
    """How a run ended: ``outcome`` is "succeeded", a failure code, or "coalesced"."""

    job: str
    outcome: str
    attempts: int = 0
    run_id: uuid.UUID | None = None
    runs: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.SUCCEEDED, COALESCED)

    @property
    def coalesced(self) -> bool:
        return self.outcome == COALESCED

    @property
    def failure(self) -> str | None:
        return None if self.ok else self.outcome


@dataclass
class _Held:
    """The run's lease, and the monotonic time up to which this process knows it is surely its own."""

    lease: run_rows.Started
    valid_until: float
    #: What the run's claims said about the backlog (lanes: a full claim asks for one more lane).
    demand: LaneDemand


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def sync_jobs(names: list[str] | None = None) -> None:
    """Make sure every registered job (or those named) has its Job and Lease rows."""
    run_rows.ensure_rows(names if names is not None else [job.name for job in registry])


def run(
    job: CronJob | str,
    trigger: str = Trigger.MANUAL,
    *,
    stop: threading.Event | None = None,
    holder: str | None = None,
    clock: Callable[[], datetime] | None = None,
    mail_mode: str | None = None,
    pause: Callable[[int], float] | None = None,
    mark_pending: bool = True,
) -> RunResult:
    """Run ``job`` now in a lane of its own, or mark it pending when it is busy ("coalesced").

    A job with ``lanes`` > 1 starts here when none of its lanes is active, or in a free lane a full claim asked
    for; its run's lease, attempts and history are its lane's (``run_start.start_or_join``).

    A run is up to ``1 + retries`` attempts, each under the job's lease, with ``pause(failed_attempt)``
    seconds between them (a short growing pause by default; the test kit's ``run_job`` passes none). When
    the job was kicked during the run, it runs once more before the lease is released; the result is still
    the first run's (``runs`` counts all). ``mark_pending=False`` (a worker serving the pending flag) leaves
    the flag as it is when another run is active: that run started after the flag was set, or sees it when
    it ends. Called inside an open transaction (a test's), the run's attempts run inline on that
    transaction's connection, each standing alone as it would in a transaction of its own.
    """
    if isinstance(job, str):
        job = registry.get(job)
    inline = default_connection.in_atomic_block
    seconds = lease_seconds(job)
    start = run_start.Start(
        job=job.name,
        trigger=trigger,
        holder=holder or default_holder(),
        seconds=seconds,
        max_attempt=1 + job.retries,
        mark_pending=mark_pending,
        lanes=job.lanes,
        now=(clock or timezone.now)(),
    )
    sent = time.monotonic()
    lease = run_start.start_or_join(start)
    if lease is None:
        logger.info("Run coalesced job=%s trigger=%s", job.name, trigger)
        return RunResult(job=job.name, outcome=COALESCED)
    held = _Held(lease, valid_until(sent, seconds), LaneDemand(job.name, job.lanes))
    runs = 0
    first: RunResult | None = None
    while True:
        runs += 1
        result = _run_attempts(
            job,
            held,
            stop=stop,
            clock=clock or timezone.now,
            mail_mode=mail_mode,
            inline=inline,
            pause=pause or _default_pause,
        )
        first = first or result
        first.runs = runs
        stopping = result.outcome in _STOP_OUTCOMES or (stop is not None and stop.is_set())
        sent = time.monotonic()
        backlog = held.demand.last_full
        if not run_lease.end_run(held.lease, result.outcome, again=not stopping, seconds=seconds, backlog=backlog):
            # The run this call started speaks for it; a re-run for kicks during it has its own history.
            return first
        # Kicked during the run: one more run under the same lease.
        held.valid_until = valid_until(sent, seconds)
        held.demand = LaneDemand(job.name, job.lanes)


def _default_pause(failed_attempt: int) -> float:
    return retry_pause(failed_attempt).total_seconds()


def _run_attempts(
    job: CronJob,
    held: _Held,
    *,
    stop: threading.Event | None,
    clock: Callable[[], datetime],
    mail_mode: str | None,
    inline: bool,
    pause: Callable[[int], float],
) -> RunResult:
    lease = held.lease
    logger.info("Run started job=%s lane=%d run=%s trigger=%s", job.name, lease.lane, lease.run_id, lease.trigger)
    began = time.monotonic()
    number = lease.attempt
    last = 1 + job.retries
    while True:
        began_attempt = time.monotonic()
        outcome, error = _attempt(job, held, stop=stop, clock=clock, mail_mode=mail_mode, inline=inline)
        if inline:
            _keep_callers_transaction_usable()
        _record(lease, outcome, error)
        _metrics.observe_attempt(job.name, outcome, time.monotonic() - began_attempt)
        if outcome == Outcome.SUCCEEDED or outcome in _STOP_OUTCOMES or number >= last:
            break
        interrupted = _pause_under_lease(lease, pause(number), lease_seconds(job), stop)
        if interrupted is not None:
            outcome = interrupted
            break
        number += 1
        _record_kept_outcomes_quietly()  # the previous attempt's end, if the database was away when it ended
        sent = time.monotonic()
        if not run_lease.rotate(lease, number, lease_seconds(job)):
            outcome = Outcome.LEASE_LOST
            break
        held.valid_until = valid_until(sent, lease_seconds(job))
    logger.info(
        "Run ended job=%s run=%s trigger=%s outcome=%s attempts=%d duration=%.3fs",
        job.name,
        lease.run_id,
        lease.trigger,
        outcome,
        number,
        time.monotonic() - began,
    )
    return RunResult(job=job.name, outcome=outcome, attempts=number, run_id=lease.run_id)


def _pause_under_lease(
    lease: run_rows.Started, seconds: float, lease_seconds: float, stop: threading.Event | None
) -> str | None:
    """Wait ``seconds`` before the next attempt, renewing the lease so a pause longer than it keeps the job.

    Return None when the pause ran out, or the outcome that ends the run: "shutdown" (``stop`` was set) or
    "lease_lost" (the lease is no longer this run's).
    """
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        # A renewal every third of the lease: a late one still lands before the lease runs out.
        step = min(left, lease_seconds / 3)
        if stop is not None:
            if stop.wait(step):
                return Outcome.SHUTDOWN
        else:
            time.sleep(step)
        if end - time.monotonic() > 0 and not _renew(lease, lease_seconds):
            return Outcome.LEASE_LOST
    return None


def _attempt(
    job: CronJob,
    held: _Held,
    *,
    stop: threading.Event | None,
    clock: Callable[[], datetime],
    mail_mode: str | None,
    inline: bool,
) -> tuple[str, BaseException | None]:
    """Run one attempt of the handler; return its outcome code and the exception it ended with."""
    lease = held.lease
    timeout = job.timeout.total_seconds()
    signal = AbortSignal(time.monotonic() + timeout)
    fence = LeaseFence(job.name, lease.token, signal, held.valid_until, lease.lease_id)
    # The first batch, when the start claimed it, is the run's first attempt's only.
    state = AttemptState(fence=fence, demand=held.demand, claimed_at_start=lease.claimed)
    lease.claimed = None
    ctx = JobContext(
        job=job,
        run_id=lease.run_id,
        attempt=lease.attempt,
        trigger=lease.trigger,
        signal=signal,
        state=state,
        clock=clock,
        mail_mode=mail_mode,
        lane=lease.lane,
    )
    if inline:
        # The lease cannot be renewed from another connection here: hold it until the deadline instead.
        fence.valid_until = time.monotonic() + timeout
        run_lease.renew(lease, inline_lease_seconds(job))
    return execute(
        job,
        ctx,
        fence,
        state=state,
        inline=inline,
        stop=stop,
        clock=clock,
        lease_seconds=lease_seconds(job),
        renew=lambda seconds: _renew(lease, seconds),
    )


def _keep_callers_transaction_usable() -> None:
    """Undo the rollback mark a failed inline attempt left on the caller's transaction.

    Django marks the enclosing atomic block for rollback when a statement raises, even one the write guard
    refused before it reached the database. Run on its own, each attempt's failed statement stands alone;
    inline, the caller's transaction stands for the database, so unless the database itself aborted it, it
    carries on (the attempt's record and the next attempt need it), keeping what the attempt committed
    before it failed, as a run on its own would.
    """
    for conn in connections.all(initialized_only=True):
        if conn.in_atomic_block and transaction.get_rollback(conn.alias) and not _aborted_by_the_database(conn):
            transaction.set_rollback(False, conn.alias)


def _aborted_by_the_database(conn: BaseDatabaseWrapper) -> bool:
    """Return whether the database itself aborted the connection's transaction (PostgreSQL's INERROR)."""
    if conn.vendor != "postgresql" or conn.connection is None:
        return False
    # Imported here: psycopg is the postgres extra's, not a dependency of every project.
    from psycopg.pq import TransactionStatus

    return bool(conn.connection.info.transaction_status == TransactionStatus.INERROR)


def _renew(lease: run_rows.Started, seconds: float) -> bool:
    """Extend the lease by ``seconds`` from now (never past the deadline); False if it is no longer ours."""
    try:
        return run_lease.renew(lease, seconds)
    except Exception:  # a dropped connection: the fence's local expiry covers us; try again next time
        logger.warning("Lease renewal failed job=%s run=%s", lease.job, lease.run_id, exc_info=False)
        default_connection.close_if_unusable_or_obsolete()
        return True


def _frames(exc: BaseException) -> str:
    """Return the ``file:line in function`` of each frame, innermost last; never the message."""
    return "\n".join(
        f"{frame.filename}:{frame.lineno} in {frame.name}" for frame in traceback.extract_tb(exc.__traceback__)
    )


def _record(lease: run_rows.Started, outcome: str, error: BaseException | None) -> None:
    fields: dict[str, str] = {}
    if error is not None:
        fields["error_class"] = f"{type(error).__module__}.{type(error).__qualname__}"[:200]
        fields["frames"] = _frames(error)
        if settings.STORE_ERROR_MESSAGES:
            fields["message"] = str(error)
    if outcome != Outcome.SUCCEEDED:
        logger.warning(
            "Attempt failed job=%s run=%s attempt=%d outcome=%s error=%s",
            lease.job,
            lease.run_id,
            lease.attempt,
            outcome,
            type(error).__name__ if error is not None else "-",
        )
    for retry in (False, True):
        try:
            run_lease.end_attempt(lease, outcome, fields)
            return
        except Exception as exc:
            error_class = type(exc).__name__
            logger.warning("Could not record attempt job=%s run=%s error=%s", lease.job, lease.run_id, error_class)
            if retry or default_connection.in_atomic_block:
                break
            # A cut connection: one more try on a new one (the run's end needs it anyway).
            default_connection.close_if_unusable_or_obsolete()
    # The database is away: keep the outcome; the worker writes it once the database is back, before it marks
    # what is still running as crashed.
    with _kept_lock:
        _kept.append((replace(lease), outcome, fields))  # a copy: the next attempt moves the lease's attempt_id


# Attempts whose end could not be written (see _record): (lease, outcome, fields).
_kept: list[tuple[run_rows.Started, str, dict[str, str]]] = []
_kept_lock = threading.Lock()


def record_kept_outcomes() -> None:
    """Write the ends of attempts that ended while the database was away (a worker's scan, once it is back)."""
    with _kept_lock:
        kept = list(_kept)
    for item in kept:
        run_lease.end_attempt(*item)
        with _kept_lock:
            _kept.remove(item)


def _record_kept_outcomes_quietly() -> None:
    """Write kept outcomes before a run's next attempt: a run that goes on is never cut off, so no orphan scan
    would write them, and an attempt left ``running`` is later marked ``crashed`` by whoever takes the job over."""
    if not _kept:
        return
    try:
        record_kept_outcomes()
    except Exception as exc:  # still away: the next attempt's start fails too, and the worker's scan retries
        logger.warning("Could not record kept outcomes error=%s", type(exc).__name__)
        default_connection.close_if_unusable_or_obsolete()


__all__ = ["RunResult", "run", "sync_jobs"]
