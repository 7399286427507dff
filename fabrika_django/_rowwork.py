"""``ctx.row(row, step=...)``: one record's work, whose failure is the row's and not the batch's.

Without it a row that raises ends the attempt, and every row claimed behind it in the same batch was charged
an attempt for nothing: with the same ``due`` each time, a poison row takes its neighbours to the dead state
with it. Inside ``ctx.row`` the exception is recorded on the row (``last_failure``, in a fenced transaction of
its own), logged by class only, and suppressed, so the run goes on with the next row; the claim's backoff
brings the row back, or it is dead at once when no retry can help.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from .exceptions import (
    CapabilityRefused,
    ClaimInsideTransaction,
    ClaimOutsideJob,
    EmailDeliveryError,
    LeaseLost,
    UndeclaredKick,
    VersionConflict,
    WriteOutsideTransaction,
)

if TYPE_CHECKING:
    from ._signal import AbortSignal
    from .mail import Mailer
    from .models import QueueModel

# These end the attempt, not the row: its abort (deadline, lost lease, shutdown), and a broken rule of the
# job's own code or declarations, which every later row would break too.
_ATTEMPT_ENDS = (
    LeaseLost,
    ClaimOutsideJob,
    ClaimInsideTransaction,
    WriteOutsideTransaction,
    UndeclaredKick,
    CapabilityRefused,
)
# What a rolled-back transaction may have moved on the object (finish() clears due and bumps the version).
_OWN_FIELDS = ("attempts", "due", "version", "last_failure")


class _Attempt(Protocol):
    """What a row's work needs of the attempt's ``JobContext`` (context.py, which calls this module)."""

    @property
    def signal(self) -> AbortSignal: ...

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]: ...

    @property
    def mail(self) -> Mailer: ...

    def transaction(self, using: str | None = None) -> AbstractContextManager[None]: ...


@contextmanager
def row_work(ctx: _Attempt, row: object, step: str, give_up: bool) -> Iterator[Any]:
    """The body of ``JobContext.row``: see its docstring."""
    from ._running import active_run
    from .models import FAILURE_CODE, QueueModel

    if not isinstance(row, QueueModel):
        raise TypeError(f"ctx.row() got a {type(row).__name__}: give it a row of a queue table (a QueueModel).")
    if not isinstance(step, str) or not FAILURE_CODE.fullmatch(step):
        raise ValueError(
            "ctx.row(step=...) needs a fixed code: 1-64 characters of a-z, 0-9, '_', '.', '-' naming the step "
            "(e.g. 'send')."
        )
    run = active_run()
    if run is not None and run.in_transaction:
        raise RuntimeError(
            "ctx.row() records a failure in a transaction of its own: open it outside ctx.transaction(), "
            "and the row's ctx.transaction() inside it."
        )
    claimed = {name: getattr(row, name) for name in _OWN_FIELDS}
    try:
        yield row
    except _ATTEMPT_ENDS:
        raise
    except Exception as error:
        if ctx.signal.aborted:
            raise  # the attempt is over: nothing more may be written, not even the row's failure
        _record(ctx, row, step, error, give_up=give_up or _refused_mail(ctx, error), claimed=claimed)


def _refused_mail(ctx: _Attempt, error: Exception) -> bool:
    """True for a mail error ``ctx.mail.may_retry`` refuses: sending again cannot help (or could send twice)."""
    return isinstance(error, EmailDeliveryError) and not ctx.mail.may_retry(error)


def _record(
    ctx: _Attempt, row: QueueModel, step: str, error: Exception, *, give_up: bool, claimed: dict[str, object]
) -> None:
    """Keep ``step`` on the row, as it was claimed; log ids, the step and the class; never the message."""
    current = {name: getattr(row, name) for name in _OWN_FIELDS}
    # The row's own transaction rolled back (or never began): the row is as it was claimed, whatever the object
    # says. If it did change in the database (it was finished, then something raised), the version tells.
    for name, value in claimed.items():
        setattr(row, name, value)
    try:
        with ctx.transaction():
            row.record_failure(step, give_up=give_up)
    except VersionConflict:
        for name, value in current.items():
            setattr(row, name, value)
        ctx.log.warning(
            "Row failed and changed since its claim: nothing recorded row=%s step=%s error=%s",
            row.pk,
            step,
            type(error).__name__,
        )
        return
    except LeaseLost:
        raise
    except Exception:
        # Recording failed too (the database went away): the row stays as its claim left it, due again after
        # its backoff. The attempt ends with the row's own error, which is what went wrong first.
        raise error from None
    ctx.log.warning(
        "Row failed row=%s step=%s error=%s dead=%d", row.pk, step, type(error).__name__, int(row.state == "dead")
    )
