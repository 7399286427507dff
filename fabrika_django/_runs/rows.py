"""A job's rows and the lease rules every path shares: what an active lease is, how long one is granted
for, the Job row's lock that orders starts and ends, the lanes a job declares.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import connection as default_connection
from django.db.models import F, Q, Value
from django.db.models.functions import Now

from .._lease_time import lease_seconds
from .._running import ClaimedAtStart, framework_write
from .._sql import runs as run_sql
from ..jobs import registry
from ..models._tables import Job, Lease, Outcome

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models import QuerySet
    from django.db.models.expressions import CombinedExpression

    from ..jobs import CronJob

logger = logging.getLogger("fabrika_django.runner")


#: Outcomes of a run cut off: ending so with its lease still its own, the run leaves the job pending.
CUT_OFF = frozenset({Outcome.LEASE_LOST.value, Outcome.CRASHED.value})


FREE = {"token": None, "holder": "", "run_id": None, "expires": None, "attempt": 0}


@dataclass
class Started:
    """The lease a run holds: its token, run, trigger and attempt number (rotated per attempt)."""

    job: str
    token: uuid.UUID
    run_id: uuid.UUID
    trigger: str
    attempt: int
    holder: str
    #: The Attempt row of the attempt, inserted in the start's own commit.
    attempt_id: int
    #: The lane (0-based) whose lease this is, and that Lease row's id.
    lane: int = 0
    lease_id: int = 0
    #: The job's lanes when the run started.
    lanes: int = 1
    #: The first claim made in the start's own statement (``_running.CLAIMS_AT_START``), else None.
    claimed: ClaimedAtStart | None = None


def lease_active(now: datetime) -> Q:
    """The condition on a ``Lease`` row of a job whose run is active at ``now``: a token, not yet expired."""
    return Q(token__isnull=False, expires__gt=now)


def own_row(lease: Started) -> QuerySet[Lease]:
    """The lease's row while it is this attempt's (its token), found by its primary key.

    By the key, not the token: on MariaDB/MySQL a statement that found the row through the token's index would
    lock that index entry, which the fence holds shared for a whole ``ctx.transaction()``, so a renewal (which
    changes only ``expires``) would wait for it.
    """
    return Lease.objects.filter(pk=lease.lease_id, token=lease.token)


# -- how long a lease is: the one rule -----------------------------------------------------------------------
#
# A run's lease is granted for ``lease_seconds(job)`` on the database's clock (``expires_in``, and the same
# ``now + seconds`` in the one-statement start and MariaDB's renewal, which take those seconds as a parameter).
# The run's own view of it (``valid_until``) ends a margin earlier on its monotonic clock, measured from before
# the statement was sent, against clock drift and latency; the fence refuses a commit past it. A run inline in a
# caller's transaction cannot renew, so it is granted its whole timeout plus the margin at once. A holder frozen
# inside the Job row's lock is ended after two leases (``frozen_holder_bound``).

#: The local view of the lease ends this much before the database's, against clock drift and latency.
LEASE_MARGIN_SECONDS = 1.0


def inline_lease_seconds(job: CronJob) -> float:
    """The one grant of a run inline in a caller's transaction, which cannot renew: its timeout and the margin."""
    return float(job.timeout.total_seconds()) + LEASE_MARGIN_SECONDS


def valid_until(sent: float, seconds: float) -> float:
    """The monotonic time up to which a lease granted for ``seconds`` at ``sent`` is surely ours."""
    return sent + seconds - min(LEASE_MARGIN_SECONDS, seconds / 4)


def expires_in(seconds: float) -> CombinedExpression:
    """A lease's ``expires`` granted now for ``seconds``, on the database's clock."""
    return Now() + Value(timedelta(seconds=seconds))


def frozen_holder_bound() -> float:
    """Seconds after which a session idle inside the Job row's lock is ended: two leases."""
    return 2 * lease_seconds()


def ensure_rows(names: list[str]) -> None:
    """Make the ``Job`` and ``Lease`` rows of the named jobs that have none yet."""
    with framework_write():
        Job.objects.bulk_create([Job(name=name) for name in names], ignore_conflicts=True)
        leases = [Lease(job=name, lane=lane) for name in names for lane in range(lanes_of(name))]
        Lease.objects.bulk_create(leases, ignore_conflicts=True)


def lock_job(name: str) -> None:
    """Serialise starting and ending runs of one job on its Job row (SQLite: the database write lock).

    A job's rows are made here the first time it runs, so starting a run costs no statement for them.
    """
    if not _lock_job_row(name):
        ensure_rows([name])
        _lock_job_row(name)


def _lock_job_row(name: str) -> bool:
    connection = default_connection
    if connection.vendor == "postgresql" and len(connection.atomic_blocks) == 1:
        return _lock_job_row_bounded(connection, name)
    if connection.features.has_select_for_update:
        return bool(list(Job.objects.select_for_update().filter(name=name).values_list("name")))
    return bool(Job.objects.filter(name=name).update(failures_in_row=F("failures_in_row")))


def _lock_job_row_bounded(connection: BaseDatabaseWrapper, name: str) -> bool:
    """PostgreSQL: lock the Job row, and end this transaction's session if it sits idle past two leases.

    Every start and end of a run holds the Job row for a few statements. A process stopped in between (SIGSTOP,
    a VM paused) would hold it for as long as it stays stopped, and every other start and end of the job would
    wait: with lanes, starts are frequent enough to meet it. The server ends such a session
    (``idle_in_transaction_session_timeout``, for this transaction only), which rolls the transaction back;
    its process, should it wake, finds its connection gone and takes the path of a cut connection. Only in a
    transaction of the framework's own (not inside a caller's, such as a TestCase's).
    """
    bound = str(int(1000 * frozen_holder_bound()))
    with connection.cursor() as cursor:
        cursor.execute(run_sql.job_lock_bounded(connection), [bound, name])
        return cursor.fetchone() is not None


def lanes_of(name: str, default: int = 1) -> int:
    """The lanes ``name`` declares (``default`` for a name no ``@cron`` declares, e.g. a removed job)."""
    return registry.get(name).lanes if name in registry else default
