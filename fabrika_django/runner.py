"""One run of a job: its lease, its attempts (with timeout and retries), their outcomes and history.

How a timeout holds even against a handler that never looks at ``ctx.signal``: the handler runs in a
thread of its own, with its own database connection, while this thread renews the lease and watches the
deadline. At the deadline the signal aborts, so the fence refuses every later begin and commit of
``ctx.transaction()``; after a short grace the handler's connection is cut (PostgreSQL:
``pg_terminate_backend``), which rolls back whatever it held open and frees its locks, and the thread is
left behind (a daemon), so ``run`` and the worker move on. A child process per attempt would be stronger
against a wedged interpreter but could not see a test's uncommitted rows, and costs a process start per
attempt; the fence, not the thread, is what makes a stale attempt harmless.

Inside an open transaction (a Django ``TestCase``) the handler runs inline on the caller's connection,
where a thread could not see the test's rows; the deadline is then enforced by the fence alone.
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
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection as default_connection
from django.db import connections, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Now
from django.utils import timezone

from . import _prepared
from ._fence import LeaseFence
from ._handlers import handler_threads
from ._running import ActiveRun, framework_write, running
from .backoff import retry_pause
from .conf import settings
from .context import AbortSignal, JobContext
from .exceptions import FabrikaError
from .guards import write_guard
from .jobs import CronJob, registry

logger = logging.getLogger(__name__)

# How long a timed-out or aborted handler gets to notice before its connection is cut.
_ABORT_GRACE_SECONDS = 2.0
# Renew when a third of the lease is used, so two renewals can fail before it expires.
_RENEW_FRACTION = 3
# The local view of the lease ends this much before the database's, against clock drift and latency.
_LEASE_MARGIN_SECONDS = 1.0
_STOP_OUTCOMES = frozenset({"lease_lost", "shutdown"})


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
        return self.outcome in ("succeeded", "coalesced")

    @property
    def coalesced(self) -> bool:
        return self.outcome == "coalesced"

    @property
    def failure(self) -> str | None:
        return None if self.ok else self.outcome


@dataclass
class _Lease:
    job: str
    token: uuid.UUID
    run_id: uuid.UUID
    trigger: str
    attempt: int
    holder: str
    valid_until: float
    #: The Attempt row of the run's first attempt, inserted in the start's own commit.
    first_record: int | None = None


@dataclass
class _Box:
    """What the handler thread reports back."""

    exception: BaseException | None = None
    returned: bool = False
    aborted_before_return: bool = False
    connections: list[Any] = field(default_factory=list)


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def sync_jobs(names: list[str] | None = None) -> None:
    """Make sure every registered job (or those named) has its Job and Lease rows."""
    from .models import Job, Lease

    wanted = names if names is not None else [job.name for job in registry]
    with framework_write():
        Job.objects.bulk_create([Job(name=name) for name in wanted], ignore_conflicts=True)
        Lease.objects.bulk_create([Lease(job=name) for name in wanted], ignore_conflicts=True)


def run(
    job: CronJob | str,
    trigger: str = "manual",
    *,
    stop: threading.Event | None = None,
    holder: str | None = None,
    clock: Callable[[], datetime] | None = None,
    mail_mode: str | None = None,
    inline: bool | None = None,
    pause: Callable[[int], float] | None = None,
    mark_pending: bool = True,
) -> RunResult:
    """Run ``job`` now, or mark it pending when a run is active elsewhere ("coalesced").

    A run is up to ``1 + retries`` attempts, each under the job's lease, with ``pause(failed_attempt)``
    seconds between them (a short growing pause by default). When the job was kicked during the run, it
    runs once more before the lease is released. ``mark_pending=False`` (a worker serving the pending
    flag) leaves the flag as it is when another run is active: that run started after the flag was set,
    or sees it when it ends.
    """
    if isinstance(job, str):
        job = registry.get(job)
    holder = holder or default_holder()
    if inline is None:
        inline = default_connection.in_atomic_block
    lease = _start_or_join(job, trigger, holder, mark_pending=mark_pending)
    if lease is None:
        logger.info("Run coalesced job=%s trigger=%s", job.name, trigger)
        return RunResult(job=job.name, outcome="coalesced")
    runs = 0
    while True:
        runs += 1
        result = _run_attempts(
            job,
            lease,
            stop=stop,
            clock=clock or timezone.now,
            mail_mode=mail_mode,
            inline=inline,
            pause=pause or _default_pause,
        )
        result.runs = runs
        if result.outcome in _STOP_OUTCOMES or (stop is not None and stop.is_set()):
            _end(job, lease, result, allow_again=False)
            return result
        if not _end(job, lease, result, allow_again=True):
            return result
        # Kicked during the run: one more run under the same lease.


def _lock_job(name: str) -> None:
    """Serialise starting and ending runs of one job on its Job row (SQLite: the database write lock).

    A job's rows are made here the first time it runs, so starting a run costs no statement for them.
    """
    if not _lock_job_row(name):
        sync_jobs([name])
        _lock_job_row(name)


def _lock_job_row(name: str) -> bool:
    from .models import Job

    if default_connection.features.has_select_for_update:
        return bool(list(Job.objects.select_for_update().filter(name=name).values_list("name")))
    return bool(Job.objects.filter(name=name).update(failures_in_row=F("failures_in_row")))


def _start_or_join(job: CronJob, trigger: str, holder: str, *, mark_pending: bool = True) -> _Lease | None:
    """Take the job's lease for a new run, or mark the job pending if another run holds it.

    A lease left expired by a holder that vanished (a crash, SIGKILL) is taken over: the cut-off attempt is
    recorded ``crashed``, and its run goes on with its next attempt while it has retries left.

    ``mark_pending=False`` is a worker serving the pending flag (a kick it heard): with the lease free and the
    flag already cleared, a run that started after the kick served it (another worker heard it too), so
    nothing starts.
    """
    from .models import Attempt, Job, Lease, Outcome

    token, run_id, attempt = uuid.uuid4(), uuid.uuid4(), 1
    started = time.monotonic()
    lease_seconds = _lease_seconds(job.timeout.total_seconds())
    with framework_write():
        record = _take_free_lease(
            job.name, trigger, holder, token, run_id, lease_seconds, require_pending=not mark_pending
        )
    if record is not None:
        valid_until = _valid_until(started, lease_seconds)
        return _Lease(job.name, token, run_id, trigger, attempt, holder, valid_until, first_record=record)
    with framework_write(), transaction.atomic():
        _lock_job(job.name)
        row = Lease.objects.filter(job=job.name).values("token", "run_id", "attempt").first()
        if row is None:
            # A kick makes the Job row alone; without its Lease row no run could ever take the lease.
            Lease.objects.bulk_create([Lease(job=job.name)], ignore_conflicts=True)
        previous: dict[str, Any] = dict(row) if row else {}
        if not mark_pending and not previous.get("token") and not _is_pending(job.name):
            return None
        resumed = bool(previous.get("token") and previous.get("run_id") and previous["attempt"] < 1 + job.retries)
        if resumed:
            run_id, attempt = previous["run_id"], previous["attempt"] + 1
            trigger = Job.objects.filter(name=job.name).values_list("last_trigger", flat=True).first() or trigger
        taken = Lease.objects.filter(Q(token__isnull=True) | Q(expires__lt=Now()), job=job.name).update(
            token=token,
            holder=holder,
            run_id=run_id,
            attempt=attempt,
            expires=Now() + Value(timedelta(seconds=lease_seconds)),
        )
        if not taken:
            if mark_pending:
                Job.objects.filter(name=job.name, pending_since__isnull=True).update(pending_since=Now())
            return None
        if previous.get("token"):
            Attempt.objects.filter(job=job.name, run_id=previous["run_id"], outcome=Outcome.RUNNING).update(
                outcome=Outcome.CRASHED, finished=Now()
            )
            logger.warning("Lease taken over job=%s run=%s resumed=%d", job.name, previous["run_id"], resumed)
        if not resumed:
            # A run that starts now serves every kick so far; one after this point makes one more run.
            Job.objects.filter(name=job.name).update(
                pending_since=None, last_run_id=run_id, last_trigger=trigger, last_started=Now()
            )
        # The attempt's row in the same commit: one commit less before the handler starts.
        first = Attempt.objects.create(job=job.name, run_id=run_id, trigger=trigger, number=attempt, holder=holder)
    valid_until = _valid_until(started, lease_seconds)
    return _Lease(job.name, token, run_id, trigger, attempt, holder, valid_until, first_record=first.pk)


def _is_pending(name: str) -> bool:
    from .models import Job

    return Job.objects.filter(name=name, pending_since__isnull=False).exists()


def _take_free_lease(
    name: str,
    trigger: str,
    holder: str,
    token: uuid.UUID,
    run_id: uuid.UUID,
    seconds: float,
    *,
    require_pending: bool,
) -> int | None:
    """PostgreSQL: start a run on a free lease in one statement, its first Attempt row included; return its id.

    It does what the general path below does when the lease is free, in the same order of locks (the Job row,
    then the Lease row), so the two never deadlock: a kick's run starts one commit after the worker heard it,
    not three. Anything else (a held or expired lease, a resumed run, rows not made yet) answers None, and the
    general path decides under the Job row's lock.
    """
    from .models import Outcome

    connection = default_connection
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return None
    sql = _free_lease_start_sql(connection, require_pending=require_pending)
    params = [name, token, holder, run_id, seconds, run_id, trigger, run_id, trigger, holder, Outcome.RUNNING.value]
    row = _prepared.fetchone(connection, sql, params)
    return None if row is None else int(row[0])


def _free_lease_start_sql(connection: Any, *, require_pending: bool) -> str:
    """The statement of ``_take_free_lease`` (bench/kick_latency.py runs it alone, as the database's floor).

    Parameters: name, token, holder, run_id, seconds, run_id, trigger, run_id, trigger, holder, outcome.

    Its commit does not wait for the WAL to reach the disk (``synchronous_commit`` off for this transaction
    only), which saves a flush on the path from a kick to its handler. Losing it in a database crash loses
    nothing: the kick's pending flag, committed durably before, comes back with the lease free, so the job
    runs again; and every later durable commit (the handler's first ``ctx.transaction()``, a mail's ledger
    row) flushes this one first, since the WAL is written in order.
    """
    from .models import Attempt, Job, Lease

    quote = connection.ops.quote_name
    job_table, lease_table = quote(Job._meta.db_table), quote(Lease._meta.db_table)
    attempt_table = quote(Attempt._meta.db_table)
    # Serving a kick: only while its flag is up (the flag is read again after the row lock is granted).
    pending = " AND pending_since IS NOT NULL" if require_pending else ""
    return (
        f"WITH locked AS (SELECT name FROM {job_table}, "  # noqa: S608  quoted names
        "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit "
        f"WHERE name = %s{pending} FOR UPDATE OF {job_table}), "
        f"taken AS (UPDATE {lease_table} AS lease SET token = %s, holder = %s, run_id = %s, attempt = 1, "
        "expires = statement_timestamp() + %s * interval '1 second' "
        "FROM locked WHERE lease.job = locked.name AND lease.token IS NULL RETURNING lease.job), "
        f"started AS (UPDATE {job_table} SET pending_since = NULL, last_run_id = %s, last_trigger = %s, "
        "last_started = statement_timestamp() WHERE name IN (SELECT job FROM taken) RETURNING name) "
        f"INSERT INTO {attempt_table} (job, run_id, trigger, number, holder, started, outcome, error_class, "
        "frames, message) SELECT name, %s, %s, 1, %s, statement_timestamp(), %s, '', '', '' FROM started "
        "RETURNING id"
    )


def _default_pause(failed_attempt: int) -> float:
    return retry_pause(failed_attempt).total_seconds()


def _valid_until(sent: float, seconds: float) -> float:
    """Return the monotonic time up to which a lease granted for ``seconds`` at ``sent`` is surely ours."""
    return sent + seconds - min(_LEASE_MARGIN_SECONDS, seconds / 4)


def _lease_seconds(limit: float) -> float:
    return max(1.0, min(float(settings.LEASE_SECONDS), limit))


def _run_attempts(
    job: CronJob,
    lease: _Lease,
    *,
    stop: threading.Event | None,
    clock: Callable[[], datetime],
    mail_mode: str | None,
    inline: bool,
    pause: Callable[[int], float],
) -> RunResult:
    from .models import Attempt

    logger.info("Run started job=%s run=%s trigger=%s", job.name, lease.run_id, lease.trigger)
    began = time.monotonic()
    outcome = "succeeded"
    number = lease.attempt
    last = 1 + job.retries
    while True:
        if lease.first_record is not None:
            # The first attempt's row, inserted in the start's own commit.
            record = Attempt(
                pk=lease.first_record,
                job=job.name,
                run_id=lease.run_id,
                trigger=lease.trigger,
                number=number,
                holder=lease.holder,
            )
        else:
            with framework_write():
                record = Attempt.objects.create(
                    job=job.name, run_id=lease.run_id, trigger=lease.trigger, number=number, holder=lease.holder
                )
        lease.first_record = None
        outcome, error = _attempt(job, lease, number, stop=stop, clock=clock, mail_mode=mail_mode, inline=inline)
        _record(record, outcome, error)
        if outcome == "succeeded" or outcome in _STOP_OUTCOMES or number >= last:
            break
        seconds = pause(number)
        if stop is not None and stop.wait(seconds):
            outcome = "shutdown"
            break
        if stop is None and seconds > 0:
            time.sleep(seconds)
        number += 1
        if not _rotate(lease, number, job):
            outcome = "lease_lost"
            break
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


def _rotate(lease: _Lease, number: int, job: CronJob) -> bool:
    """Give the next attempt a token of its own, so a stale earlier attempt is fenced off."""
    from .models import Lease

    token = uuid.uuid4()
    started = time.monotonic()
    seconds = _lease_seconds(job.timeout.total_seconds())
    with framework_write():
        moved = Lease.objects.filter(job=lease.job, token=lease.token).update(
            token=token, attempt=number, expires=Now() + Value(timedelta(seconds=seconds))
        )
    if not moved:
        return False
    lease.token, lease.attempt = token, number
    lease.valid_until = _valid_until(started, seconds)
    return True


def _attempt(
    job: CronJob,
    lease: _Lease,
    number: int,
    *,
    stop: threading.Event | None,
    clock: Callable[[], datetime],
    mail_mode: str | None,
    inline: bool,
) -> tuple[str, BaseException | None]:
    """Run one attempt of the handler; return its outcome code and the exception it ended with."""
    signal = AbortSignal(time.monotonic() + job.timeout.total_seconds())
    fence = LeaseFence(job.name, lease.token, signal, lease.valid_until)
    ctx = JobContext(
        job=job,
        run_id=lease.run_id,
        attempt=number,
        trigger=lease.trigger,
        signal=signal,
        fence=fence,
        clock=clock,
        mail_mode=mail_mode,
    )
    box = _Box()
    if inline:
        # The lease cannot be renewed from another connection here: hold it until the deadline instead.
        fence.valid_until = time.monotonic() + job.timeout.total_seconds()
        _extend_lease(lease, job.timeout.total_seconds())
        _call_handler(job, ctx, clock, box)
        _keep_test_transaction_usable()
    else:
        _watch(job, lease, ctx, fence, box, stop, clock)
    return _outcome(signal, box), box.exception


def _call_handler(job: CronJob, ctx: JobContext, clock: Callable[[], datetime], box: _Box) -> None:
    try:
        with running(ActiveRun(job=job, clock=clock, context=ctx)), write_guard():
            job.func(ctx)
        box.aborted_before_return = ctx.signal.aborted
        box.returned = True
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: B036  every outcome is recorded, SystemExit included
        box.exception = exc
    finally:
        ctx._close()


def _keep_test_transaction_usable() -> None:
    """Undo the rollback mark a failed inline attempt left on the caller's (test's) transaction.

    Django marks the enclosing atomic block for rollback when a statement raises, even one the write guard
    refused before it reached the database. In production each failed statement stands alone; here the
    caller's transaction stands for "the database", so unless the database itself broke the transaction,
    it carries on, keeping what the attempt committed before it failed, as a real run would.
    """
    for conn in connections.all(initialized_only=True):
        if not conn.needs_rollback:
            continue
        raw = getattr(conn, "connection", None)
        info = getattr(raw, "info", None)
        broken = info is not None and getattr(info, "transaction_status", 0) == 3  # psycopg INERROR
        if not broken:
            conn.needs_rollback = False


def _in_handler_thread(job: CronJob, ctx: JobContext, clock: Callable[[], datetime], box: _Box) -> None:
    box.connections = [connections[alias] for alias in connections]
    _call_handler(job, ctx, clock, box)


def _watch(
    job: CronJob,
    lease: _Lease,
    ctx: JobContext,
    fence: LeaseFence,
    box: _Box,
    stop: threading.Event | None,
    clock: Callable[[], datetime],
) -> None:
    """Run the handler in a thread of its own; renew the lease, enforce the deadline, honour ``stop``."""
    signal = ctx.signal
    task = handler_threads.submit(lambda: _in_handler_thread(job, ctx, clock, box))
    lease_seconds = _lease_seconds(job.timeout.total_seconds())
    renew_every = max(0.2, lease_seconds / _RENEW_FRACTION)
    next_renewal = time.monotonic() + renew_every
    while not task.done.wait(max(0.0, min(next_renewal - time.monotonic(), signal.remaining(), 0.25))):
        if stop is not None and stop.is_set():
            signal.abort("shutdown")
        if signal.aborted:
            break
        if time.monotonic() >= next_renewal:
            sent = time.monotonic()
            seconds = min(lease_seconds, max(signal.remaining(), 0.001))
            if not _renew(lease, seconds):
                signal.abort("lease_lost")
                break
            fence.valid_until = _valid_until(sent, seconds)
            next_renewal = sent + renew_every
    if not task.done.is_set() and not task.done.wait(_ABORT_GRACE_SECONDS):
        task.abandoned = True
        _cut_off(job, [*box.connections, *ctx._pool_connections])


def _renew(lease: _Lease, seconds: float) -> bool:
    """Extend the lease by ``seconds`` from now (never past the deadline); False if it is no longer ours."""
    from .models import Lease

    try:
        with framework_write():
            return bool(
                Lease.objects.filter(job=lease.job, token=lease.token).update(
                    expires=Now() + Value(timedelta(seconds=seconds))
                )
            )
    except Exception:  # a dropped connection: the fence's local expiry covers us; try again next time
        logger.warning("Lease renewal failed job=%s run=%s", lease.job, lease.run_id, exc_info=False)
        default_connection.close_if_unusable_or_obsolete()
        return True


def _extend_lease(lease: _Lease, seconds: float) -> None:
    from .models import Lease

    with framework_write():
        Lease.objects.filter(job=lease.job, token=lease.token).update(
            expires=Now() + Value(timedelta(seconds=seconds + _LEASE_MARGIN_SECONDS))
        )


def _cut_off(job: CronJob, handler_connections: list[Any]) -> None:
    """End a handler that ignored its abort: close its connections (and its ctx.executor() threads')."""
    for conn in handler_connections:
        raw = getattr(conn, "connection", None)
        if raw is None:
            continue
        try:
            if conn.vendor == "postgresql":
                pid = raw.info.backend_pid
                with default_connection.cursor() as cursor:
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            elif conn.vendor == "sqlite":
                raw.interrupt()
        except Exception:
            logger.warning("Could not cut off a stale attempt's connection job=%s", job.name)
    logger.warning("Attempt abandoned after its abort job=%s", job.name)


def _outcome(signal: AbortSignal, box: _Box) -> str:
    if box.returned and not box.aborted_before_return:
        return "succeeded"
    if signal.aborted and signal.reason:
        return signal.reason
    exc = box.exception
    if isinstance(exc, FabrikaError):
        return exc.code
    return "handler_failed"


def _frames(exc: BaseException) -> str:
    """Return the ``file:line in function`` of each frame, innermost last; never the message."""
    return "\n".join(
        f"{frame.filename}:{frame.lineno} in {frame.name}" for frame in traceback.extract_tb(exc.__traceback__)
    )


def _record(record: Any, outcome: str, error: BaseException | None) -> None:
    record.outcome = outcome
    record.finished = timezone.now()
    fields = ["outcome", "finished"]
    if error is not None:
        record.error_class = f"{type(error).__module__}.{type(error).__qualname__}"[:200]
        record.frames = _frames(error)
        fields += ["error_class", "frames"]
        if settings.STORE_ERROR_MESSAGES:
            record.message = str(error)
            fields.append("message")
    if outcome != "succeeded":
        logger.warning(
            "Attempt failed job=%s run=%s attempt=%d outcome=%s error=%s",
            record.job,
            record.run_id,
            record.number,
            outcome,
            type(error).__name__ if error is not None else "-",
        )
    with framework_write():
        try:
            record.save(update_fields=fields)
        except Exception:
            logger.exception("Could not record attempt job=%s run=%s", record.job, record.run_id)


def _end(job: CronJob, lease: _Lease, result: RunResult, *, allow_again: bool) -> bool:
    """End the run: start one more if the job was kicked meanwhile (True), else release the lease.

    Both happen under the Job row's lock, the one a starter takes, so a kick is either seen here or
    finds the lease free and starts its own run: never lost between the two.
    """
    from .models import Job, Lease

    summary: dict[str, Any] = {"last_outcome": result.outcome, "last_finished": Now()}
    if result.outcome == "succeeded":
        summary.update(last_success=Now(), failures_in_row=0)
    else:
        summary["failures_in_row"] = F("failures_in_row") + 1
    token, run_id = uuid.uuid4(), uuid.uuid4()
    started = time.monotonic()
    seconds = _lease_seconds(job.timeout.total_seconds())
    with framework_write(), transaction.atomic():
        _lock_job(job.name)
        # A stale run (its lease taken over) does not speak for the job any more.
        Job.objects.filter(name=job.name, last_run_id=lease.run_id).update(**summary)
        again = allow_again and Job.objects.filter(name=job.name, pending_since__isnull=False).exists()
        mine = Lease.objects.filter(job=job.name, token=lease.token)
        if not again:
            mine.update(token=None, holder="", run_id=None, expires=None, attempt=0)
            return False
        if not mine.update(token=token, run_id=run_id, attempt=1, expires=Now() + Value(timedelta(seconds=seconds))):
            return False
        Job.objects.filter(name=job.name).update(
            pending_since=None, last_run_id=run_id, last_trigger="kick", last_started=Now()
        )
    lease.token, lease.run_id, lease.trigger, lease.attempt = token, run_id, "kick", 1
    lease.valid_until = _valid_until(started, seconds)
    return True


__all__ = ["RunResult", "run", "sync_jobs"]
