"""A queue row's states, defined once: a ``Q`` per state, its label, and the same rule for a row in memory.

A row is *waiting* while ``due`` is set and its attempts are below the model's ``Queue.max_attempts``
(*due now* is a waiting row whose ``due`` has come), *dead* once they reach it, and *done* when ``due`` is
null. The queryset's filters, the model's ``state``, the admin's filter, the overview's and the status
command's counts all ask here, and so do the table's two partial indexes (``models.py``): the claim's
``(due, pk)`` index holds waiting rows only (``state_q(model, "waiting")``), so dead rows, however many, are
never in the claim's path, and a ``(pk)`` index holds dead rows only (``state_q(model, "dead")``), so they
are counted and listed without reading the table. Every condition but done's keeps ``due IS NOT NULL`` and
the attempts term of one of those predicates, written the same way, so each index serves its state.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Q
from django.db.models.sql import Query
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from ._sql import SQLParam

DEFAULT_MAX_ATTEMPTS = 10

#: The states a person filters by and sees counted, in the order the admin shows them, with their labels.
STATES = (
    ("waiting", _("waiting")),
    ("due_now", _("due now")),
    ("dead", _("dead")),
    ("done", _("done")),
)


#: Every state but done: waiting and dead rows.
NOT_DONE = Q(due__isnull=False)


def max_attempts_of(model: type[models.Model]) -> int:
    """Return the model's ``Queue.max_attempts`` (10 when it declares none)."""
    return int(getattr(getattr(model, "Queue", None), "max_attempts", DEFAULT_MAX_ATTEMPTS))


def state_q(model: type[models.Model], state: str, now: datetime | None = None) -> Q:
    """Return the condition of ``state`` on ``model``'s rows (``due_now`` needs ``now``)."""
    limit = max_attempts_of(model)
    if state == "waiting":
        return waiting_q(limit)
    if state == "due_now":
        if now is None:
            raise ValueError("state_q(..., 'due_now') needs now=: the moment rows are due by.")
        # The claim's condition: it holds the claim index's predicate (waiting_q) term for term, which is how
        # PostgreSQL and SQLite see that the partial index serves it.
        return waiting_q(limit) & Q(due__lte=now)
    if state == "dead":
        return dead_q(limit)
    if state == "done":
        return Q(due__isnull=True)
    raise ValueError(f"{state!r} is not a queue state: use one of {', '.join(key for key, _label in STATES)}.")


def waiting_q(max_attempts: int) -> Q:
    """Return the waiting rows of a table whose ``Queue.max_attempts`` is ``max_attempts`` (the claim index's)."""
    return NOT_DONE & Q(attempts__lt=max_attempts)


def dead_q(max_attempts: int) -> Q:
    """Return the dead rows of a table whose ``Queue.max_attempts`` is ``max_attempts`` (the dead index's)."""
    return NOT_DONE & Q(attempts__gte=max_attempts)


def due_again_q(model: type[models.Model], now: datetime) -> Q:
    """Return the waiting rows that a claim took before and that come due again after ``now`` (their backoff)."""
    return waiting_q(max_attempts_of(model)) & Q(attempts__gt=0, due__gt=now)


def not_done_q(model: type[models.Model]) -> Q:
    """Return waiting or dead rows as the two partial indexes' predicates, so a scan of both serves it."""
    return state_q(model, "waiting") | state_q(model, "dead")


def row_state(row: Any) -> str:
    """Return ``"waiting"``, ``"dead"`` or ``"done"`` for a row in memory (as ``state_q`` decides in SQL)."""
    if row.due is None:
        return "done"
    return "dead" if row.attempts >= max_attempts_of(type(row)) else "waiting"


def row_state_at(row: Any, now: datetime) -> str:
    """Return the row's state as the filter names it: a waiting row whose time has come is ``"due_now"``."""
    state = row_state(row)
    if state == "waiting" and row.due <= now:
        return "due_now"
    return state


def state_sql(
    model: type[models.Model], state: str, now: datetime | None, connection: BaseDatabaseWrapper
) -> tuple[str, list[SQLParam]]:
    """Return ``state_q`` as SQL on ``model``'s table (unqualified column names), and its parameters."""
    return q_sql(model, state_q(model, state, now), connection)


def q_sql(model: type[models.Model], condition: Q, connection: BaseDatabaseWrapper) -> tuple[str, list[SQLParam]]:
    """Return a condition on ``model``'s table as SQL (unqualified column names), and its parameters."""
    query = Query(model, alias_cols=False)
    where = query.build_where(condition)
    sql, params = where.as_sql(query.get_compiler(connection=connection), connection)
    return sql, list(params)
