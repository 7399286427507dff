"""JobContext: what a job's handler receives."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from concurrent.futures import Executor
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, Unpack

from django.db import transaction as db_transaction

from ._running import ActiveRun, AttemptState, active_run, framework_write
from ._signal import AbortSignal as AbortSignal  # its home is _signal; projects and tests know it from here
from .exceptions import UndeclaredKick

if TYPE_CHECKING:
    from .egress import FetchOptions, FetchResponse
    from .jobs import CronJob
    from .mail import Mailer
    from .models import QueueModel
    from .tokens import Tokens

logger = logging.getLogger("fabrika_django.jobs")


class _JobLogAdapter(logging.LoggerAdapter[logging.Logger]):
    """Prefixes each line with the job, run and attempt: ids only, never users' data."""

    def process(self, msg: object, kwargs: MutableMapping[str, Any]) -> tuple[str, MutableMapping[str, Any]]:
        extra = self.extra or {}
        kwargs.setdefault("extra", {}).update(extra)
        return f"job={extra['job']} run={extra['run']} attempt={extra['attempt']} {msg}", kwargs


class JobContext:
    """The context of one attempt of a job run, passed to the job's function.

    Reads run anywhere; every write goes inside ``ctx.transaction()``, which the attempt's lease fences.
    """

    def __init__(
        self,
        *,
        job: CronJob,
        run_id: uuid.UUID,
        attempt: int,
        trigger: str,
        signal: AbortSignal,
        state: AttemptState,
        clock: Callable[[], datetime],
        mail_mode: str | None = None,
        lane: int = 0,
    ) -> None:
        self.job = job
        #: The lane (0-based) of the run: one of the job's ``lanes`` runs that may be active at once.
        self.lane = lane
        self.run_id = run_id
        self.attempt = attempt
        self.trigger = trigger
        self.signal = signal
        self.mail_mode = mail_mode
        #: The attempt's machinery (its fence, its executor threads' connections, what to close at its end).
        self._state = state
        self._clock = clock
        self.log = _JobLogAdapter(logger, {"job": job.name, "run": str(run_id), "attempt": attempt})

    def __repr__(self) -> str:
        return f"<JobContext job={self.job.name} run={self.run_id} attempt={self.attempt}>"

    def now(self) -> datetime:
        """Return the run's clock (a fixed one under the test kit's ``now=``)."""
        return self._clock()

    @contextmanager
    def transaction(self, using: str | None = None) -> Iterator[None]:
        """Open a ``transaction.atomic()`` fenced by the attempt's lease.

        It refuses to begin, and refuses to commit, once the lease is no longer this attempt's (LeaseLost,
        or AttemptTimedOut past the deadline): a stale attempt never writes after its replacement started.
        """
        run = active_run()
        if run is None or run.context is not self:
            raise RuntimeError("ctx.transaction() belongs to its own attempt: use it inside the job's function.")
        self._state.fence.check()
        outer = run.in_transaction
        with db_transaction.atomic(using=using):
            run.in_transaction = True
            try:
                if not outer:
                    with framework_write():
                        self._state.fence.hold(using)
                yield
                # Past this point the block commits: refuse if the attempt ended meanwhile.
                self._state.fence.check()
            finally:
                run.in_transaction = outer

    def executor(self, max_workers: int) -> Executor:
        """Return a thread pool (a ``concurrent.futures.Executor``) whose threads belong to this attempt.

        Use it as ``with ctx.executor(max_workers=4) as pool:``. In its threads, as in the handler's,
        ``ctx.transaction()`` is fenced by the attempt's lease and a write outside it is refused; each thread
        has its own database connections. A thread the handler starts any other way is outside the attempt.
        """
        from ._pool import RunExecutor

        def new_run() -> ActiveRun:  # each of the pool's threads enters the run with this attempt's machinery
            return ActiveRun(job=self.job, clock=self.now, context=self, state=self._state)

        return RunExecutor(new_run, self._state.pool_connections, max_workers)

    def row(self, row: QueueModel, step: str, *, give_up: bool = False) -> AbstractContextManager[None]:
        """One claimed row's work: an exception inside is the row's failure, not the attempt's.

        ``with ctx.row(row, step="send"): ...`` — an exception raised inside (other than the attempt's abort and
        a broken framework rule, which propagate) records ``step`` as the row's ``last_failure`` in a fenced
        transaction of its own, is logged with the row's id, the step and the exception's class (never its
        message), and is suppressed, so the run goes on with the next row. The claim's backoff brings the row
        back; with ``give_up=True``, or for an ``EmailDeliveryError`` that ``ctx.mail.may_retry`` refuses, the
        row is dead at once. Open it outside ``ctx.transaction()``, and the row's transaction inside it.
        """
        from ._rowwork import row_work

        return row_work(self, row, step, give_up)

    def kick(self, name: str) -> None:
        """Kick a job declared in this job's ``kicks``; inside ctx.transaction() it goes out on commit."""
        if name not in self.job.kicks:
            raise UndeclaredKick(
                f"Job '{self.job.name}' kicked '{name}' without declaring it: add it to @cron(..., kicks=[{name!r}])."
            )
        # Imported on use, here and below: each capability pulls in its own dependencies (models, mail, HTTP).
        from .kicks import kick

        kick(name)

    @cached_property
    def mail(self) -> Mailer:
        """The job's mailer (jobs that declare ``mailer``)."""
        from .mail import mailer_for

        mailer = mailer_for(self.job, self.mail_mode, self.signal)
        self._state.closers.append(mailer.close)  # its connection ends with the attempt
        return mailer

    @cached_property
    def tokens(self) -> Tokens:
        """Signed tokens for the purposes the job declares in ``signs``."""
        from .tokens import Tokens

        return Tokens(self.job.name, self.job.signs, self.now)

    def url(self, name: str, *, query: dict[str, object] | None = None, kwargs: dict[str, object] | None = None) -> str:
        """Return an absolute URL of the application's view ``name``, from the BASE_URL setting."""
        from .tokens import absolute_url

        return absolute_url(name, query=query, kwargs=kwargs)

    def fetch(self, method: str, url: str, **options: Unpack[FetchOptions]) -> FetchResponse:
        """Make an HTTPS request to one of the job's declared ``egress`` origins, within the attempt's time."""
        from .egress import fetch_for

        return fetch_for(self.job.name, self.job.egress, self.signal, self.log)(method, url, **options)
