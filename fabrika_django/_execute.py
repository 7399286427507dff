"""Executing one attempt's handler: its thread, the lease renewals and the deadline, the abort and cut-off.

How a timeout holds even against a handler that never looks at ``ctx.signal``: the handler runs in a thread
of its own, with its own database connection, while the calling thread renews the lease and watches the
deadline. At the deadline the signal aborts, so the fence refuses every later begin and commit of
``ctx.transaction()``; after a short grace the handler's connection is cut (PostgreSQL:
``pg_terminate_backend``, MariaDB/MySQL: ``KILL CONNECTION``), which rolls back whatever it held open and
frees its locks, and the thread is left behind (a daemon), so the run and the worker move on. A child
process per attempt would be stronger against a wedged interpreter but could not see a test's uncommitted
rows, and costs a process start per attempt; the fence, not the thread, is what makes a stale attempt
harmless.

Inside an open transaction (a Django ``TestCase``) the handler runs inline on the caller's connection,
where a thread could not see the test's rows; the deadline is then enforced by the fence alone.

The run's rows are not written here: renewing goes through the ``renew`` the runner passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import connection as default_connection
from django.db import connections

from ._claimers import remembering_claims
from ._handlers import handler_threads
from ._running import ActiveRun, AttemptState, is_ctrl_c, running
from ._runs.fence import LeaseFence
from ._runs.rows import LEASE_MARGIN_SECONDS, valid_until
from ._signal import AbortSignal
from ._sql import fence as fence_sql
from .context import JobContext
from .exceptions import FabrikaError
from .guards import write_guard
from .jobs import CronJob
from .models import Outcome

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("fabrika_django.runner")

# How long a timed-out or aborted handler gets to notice before its connection is cut.
_ABORT_GRACE_SECONDS = 2.0
# Renew when a third of the lease is used, so two renewals can fail before it expires.
_RENEW_FRACTION = 3


@dataclass
class _Box:
    """What the handler thread reports back."""

    exception: BaseException | None = None
    returned: bool = False
    aborted_before_return: bool = False
    connections: list[BaseDatabaseWrapper] = field(default_factory=list)


def execute(
    job: CronJob,
    ctx: JobContext,
    fence: LeaseFence,
    *,
    state: AttemptState,
    inline: bool,
    stop: threading.Event | None,
    clock: Callable[[], datetime],
    lease_seconds: float,
    renew: Callable[[float], bool],
) -> tuple[str, BaseException | None]:
    """Run the handler once; return its outcome code and the exception it ended with.

    ``renew(seconds)`` extends the lease by ``seconds`` from now and answers whether it is still ours.
    """
    box = _Box()
    if inline:
        _call_handler(job, ctx, state, clock, box)
    else:
        _watch(job, ctx, state, fence, box, stop, clock, lease_seconds, renew)
    return _outcome(ctx.signal, box), box.exception


def _call_handler(job: CronJob, ctx: JobContext, state: AttemptState, clock: Callable[[], datetime], box: _Box) -> None:
    try:
        run = ActiveRun(job=job, clock=clock, context=ctx, state=state)
        with remembering_claims(run), running(run), write_guard():
            job.func(ctx)
        box.aborted_before_return = ctx.signal.aborted
        box.returned = True
    except BaseException as exc:  # noqa: B036  every outcome is recorded, SystemExit included
        if is_ctrl_c(exc):
            raise
        box.exception = exc
    finally:
        state.close()


def _in_handler_thread(
    job: CronJob, ctx: JobContext, state: AttemptState, clock: Callable[[], datetime], box: _Box
) -> None:
    box.connections = [connections[alias] for alias in connections]
    _call_handler(job, ctx, state, clock, box)


def _watch(
    job: CronJob,
    ctx: JobContext,
    state: AttemptState,
    fence: LeaseFence,
    box: _Box,
    stop: threading.Event | None,
    clock: Callable[[], datetime],
    lease_seconds: float,
    renew: Callable[[float], bool],
) -> None:
    """Run the handler in a thread of its own; renew the lease, enforce the deadline, honour ``stop``."""
    signal: AbortSignal = ctx.signal
    task = handler_threads.submit(lambda: _in_handler_thread(job, ctx, state, clock, box))
    renew_every = max(0.2, lease_seconds / _RENEW_FRACTION)
    next_renewal = time.monotonic() + renew_every
    while not task.done.wait(max(0.0, min(next_renewal - time.monotonic(), signal.remaining(), 0.25))):
        if stop is not None and stop.is_set():
            signal.abort(Outcome.SHUTDOWN)
        if signal.aborted:
            break
        if fence.ran_out() and signal.remaining() > LEASE_MARGIN_SECONDS:
            # Too late to renew (the process was frozen, or its renewals failed): the lease may have been
            # another's meanwhile, and the fence refuses every commit from here on. A late renewal that still
            # found the token would let the attempt go on as if it had never stopped. (The last grant before the
            # deadline runs out a margin before it: that attempt ends timed_out, below.)
            signal.abort(Outcome.LEASE_LOST)
            break
        if time.monotonic() >= next_renewal:
            sent = time.monotonic()
            seconds = min(lease_seconds, max(signal.remaining(), 0.001))
            if not renew(seconds):
                signal.abort(Outcome.LEASE_LOST)
                break
            fence.valid_until = valid_until(sent, seconds)
            next_renewal = sent + renew_every
    if not task.done.is_set() and not task.done.wait(_ABORT_GRACE_SECONDS):
        task.abandoned = True
        _cut_off(job, [*box.connections, *state.pool_connections])


def _cut_off(job: CronJob, handler_connections: list[BaseDatabaseWrapper]) -> None:
    """End a handler that ignored its abort: close its connections (and its ctx.executor() threads') so the
    database frees their locks."""
    for conn in handler_connections:
        raw = getattr(conn, "connection", None)
        if raw is None:
            continue
        try:
            if conn.vendor == "postgresql":
                pid = raw.info.backend_pid
                with default_connection.cursor() as cursor:
                    cursor.execute(fence_sql.TERMINATE_BACKEND, [pid])
            elif conn.vendor == "mysql":
                with default_connection.cursor() as cursor:
                    cursor.execute(fence_sql.KILL_CONNECTION, [raw.thread_id()])
            elif conn.vendor == "sqlite":
                raw.interrupt()
        except Exception:
            logger.warning("Could not cut off a stale attempt's connection job=%s", job.name)
    logger.warning("Attempt abandoned after its abort job=%s", job.name)


def _outcome(signal: AbortSignal, box: _Box) -> str:
    if box.returned and not box.aborted_before_return:
        return Outcome.SUCCEEDED
    if signal.aborted and signal.reason:
        return signal.reason
    exc = box.exception
    if isinstance(exc, FabrikaError):
        return exc.code
    return Outcome.HANDLER_FAILED
