"""A queue row's states, defined once: a ``Q`` per state, its label, and the same rule for a row in memory.

A row is *waiting* while ``due`` is set and its attempts are below the model's ``Queue.max_attempts``
(*due now* is a waiting row whose ``due`` has come), *dead* once they reach it, and *done* when ``due`` is
null. The queryset's filters, the model's ``state``, the admin's filter, the overview's and the status
command's counts all ask here. Every condition but done's keeps ``due IS NOT NULL``, the predicate of the
table's partial ``(due, pk)`` index, so the index serves it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.sql import Query
from django.utils.translation import gettext_lazy as _

DEFAULT_MAX_ATTEMPTS = 10

#: The states a person filters by and sees counted, in the order the admin shows them, with their labels.
STATES = (
    ("waiting", _("waiting")),
    ("due_now", _("due now")),
    ("dead", _("dead")),
    ("done", _("done")),
)


#: The rows a queue table's partial ``(due, pk)`` index holds: waiting and dead ones (every state but done).
NOT_DONE = Q(due__isnull=False)


def max_attempts_of(model: type[models.Model]) -> int:
    """Return the model's ``Queue.max_attempts`` (10 when it declares none)."""
    return int(getattr(getattr(model, "Queue", None), "max_attempts", DEFAULT_MAX_ATTEMPTS))


def state_q(model: type[models.Model], state: str, now: datetime | None = None) -> Q:
    """Return the condition of ``state`` on ``model``'s rows (``due_now`` needs ``now``)."""
    limit = max_attempts_of(model)
    if state == "waiting":
        return NOT_DONE & Q(attempts__lt=limit)
    if state == "due_now":
        if now is None:
            raise ValueError("state_q(..., 'due_now') needs now=: the moment rows are due by.")
        return NOT_DONE & Q(attempts__lt=limit, due__lte=now)
    if state == "dead":
        return NOT_DONE & Q(attempts__gte=limit)
    if state == "done":
        return Q(due__isnull=True)
    raise ValueError(f"{state!r} is not a queue state: use one of {', '.join(key for key, _label in STATES)}.")


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


def state_sql(model: type[models.Model], state: str, now: datetime | None, connection: Any) -> tuple[str, list[Any]]:
    """Return ``state_q`` as SQL on ``model``'s table (unqualified column names), and its parameters."""
    return q_sql(model, state_q(model, state, now), connection)


def q_sql(model: type[models.Model], condition: Q, connection: Any) -> tuple[str, list[Any]]:
    """Return a condition on ``model``'s table as SQL (unqualified column names), and its parameters."""
    query = Query(model, alias_cols=False)
    where = query.build_where(condition)
    sql, params = where.as_sql(query.get_compiler(connection=connection), connection)
    return sql, list(params)
