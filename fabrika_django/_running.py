"""The thread's active job run: how the runner tells claim() and the write guard what is happening.

The runner enters ``running(run)`` in the thread that executes a job's handler, and sets
``run.in_transaction`` while ``ctx.transaction()`` is open; framework writes (claim, the lease) set
``run.framework_writes``. Everything here is internal.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from django.db import connections
from django.utils import timezone

from .jobs import CronJob

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

_local = threading.local()


def is_ctrl_c(exc: BaseException) -> bool:
    """Whether ``exc`` is Ctrl-C's, for a run to let through rather than record as its failure.

    Python raises Ctrl-C's ``KeyboardInterrupt`` in the main thread only (a run inline: ``fabrika_job run``,
    ``run_job``/``run_tasks`` in a test's transaction). On a handler thread it is the handler's or task's own
    raise, its failed attempt: let through, it would kill the thread with nothing recorded.
    """
    return isinstance(exc, KeyboardInterrupt) and threading.current_thread() is threading.main_thread()


#: Jobs whose first claim rides in the start of a kicked run (PostgreSQL's one-statement start,
#: ``_sql.runs.free_lease_start``), by name: a function of (connection, now, job) answering the claim's WITH
#: items (gated on ``taken``, the lease the start took), the tail of the statement's answer (its columns,
#: ``FROM recorded, taken`` and the claim's joins and order) and its parameters. The tasks' queue jobs register
#: theirs (``_runs.task_claim.claim_at_start``).
CLAIMS_AT_START: dict[str, Callable[[Any, datetime, Any], tuple[str, str, dict[str, Any]]]] = {}


class Fence(Protocol):
    """The lease fence of an attempt (``_runs.fence.LeaseFence``), as the code that runs under it uses it."""

    def check(self) -> None: ...

    def hold(self, using: str | None) -> None: ...


@dataclass(frozen=True)
class ClaimedAtStart:
    """The rows a claim riding in a run's start answered (``CLAIMS_AT_START``), on which database, at which
    ``now`` (the instant its backoff counted from)."""

    using: str
    now: datetime
    rows: list[tuple[Any, ...]]


@dataclass
class AttemptState:
    """What the runner hands one attempt beside its ``JobContext``, for the framework's own code under it.

    The context keeps it to itself; the claim, the tasks' queue and the runner's watch reach it through the
    thread's active run (``ActiveRun.state``) or hold it from the start.
    """

    fence: Fence
    #: What the run's claims say about its backlog (None outside the runner).
    demand: LaneDemand | None = None
    #: What a task queue's first claim answered in the run's start (``CLAIMS_AT_START``): the first attempt's
    #: only, taken by its first claim.
    claimed_at_start: ClaimedAtStart | None = None
    #: Connections of ctx.executor() threads, which the runner cuts off with the handler's.
    pool_connections: list[BaseDatabaseWrapper] = field(default_factory=list)
    #: What to close when the attempt ends (the mail transport's connection).
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Release what the attempt opened."""
        for close in self.closers:
            close()


@dataclass
class ActiveRun:
    """What the current thread is running."""

    job: CronJob
    #: The clock of the run: claim's ``now``. The test kit passes a fixed one.
    clock: Callable[[], datetime] = timezone.now
    #: True while ctx.transaction() is open in this thread.
    in_transaction: bool = False
    #: Depth of framework-owned writes (claim, leases, history), which the write guard lets through.
    framework_writes: int = 0
    #: The JobContext, when there is one.
    context: Any = field(default=None, repr=False)
    #: The attempt's own machinery, under the runner (None for a run made by hand, as the tests' and benches').
    state: AttemptState | None = field(default=None, repr=False)
    #: Each database alias's depth of atomic blocks when the run began in this thread (a TestCase's own
    #: blocks, under the test kit): a claim deeper than that is inside a transaction the handler opened.
    atomic_depths: dict[str, int] = field(default_factory=dict, repr=False)
    #: (database alias, queue label) of each table the run claimed from: remembered when the run ends here.
    claimed: set[tuple[str, str]] = field(default_factory=set, repr=False)

    def opened_atomic(self, alias: str) -> bool:
        """Return whether the handler has an atomic block of its own open on ``alias``."""
        return len(connections[alias].atomic_blocks) > self.atomic_depths.get(alias, 0)

    def now(self) -> datetime:
        return self.clock()


@dataclass
class LaneDemand:
    """What a run's claims say about its backlog, for a job with lanes (a full claim asks for one more lane).

    Shared by the run's attempts and their executor threads; claim() writes it, the runner reads it at the end.
    """

    job: str
    lanes: int
    #: Whether the run's last claim came back full (as many rows as its limit): work is left.
    last_full: bool = False

    def claimed(self, count: int, limit: int) -> bool:
        """Note a claim of ``count`` rows of ``limit``; True when it asks for one more lane."""
        self.last_full = count >= limit
        return self.last_full and self.lanes > 1


def active_run() -> ActiveRun | None:
    """Return the run active in this thread, or None outside a job."""
    return getattr(_local, "run", None)


@contextmanager
def running(run: ActiveRun) -> Iterator[ActiveRun]:
    """Mark ``run`` active in this thread for the duration of the block."""
    previous = active_run()
    run.atomic_depths = {conn.alias: len(conn.atomic_blocks) for conn in connections.all(initialized_only=True)}
    _local.run = run
    try:
        yield run
    finally:
        _local.run = previous


@contextmanager
def framework_write() -> Iterator[None]:
    """Let the framework's own writes through the write guard (no-op outside a run)."""
    run = active_run()
    if run is None:
        yield
        return
    run.framework_writes += 1
    try:
        yield
    finally:
        run.framework_writes -= 1


@contextmanager
def outside_run() -> Iterator[None]:
    """Suspend the thread's active run for the block: code run there is plain Django code, as in a view.

    A Django task runs inside its queue's job, yet it is not a job: no write guard, no fence, no claim.
    """
    previous = active_run()
    _local.run = None
    try:
        yield
    finally:
        _local.run = previous
