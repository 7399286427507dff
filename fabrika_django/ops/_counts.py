"""Each queue table's counts by state (waiting, due now, dead, done), one statement per table.

The overview, ``fabrika_job status``, the metrics, the health findings and the queue samples all count the
same way: the states of ``_queuestate``, compiled once per table and bound to the time afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.db import connections, models, router
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .._queuestate import not_done_q, q_sql, state_sql
from .._sql import cache
from .._sql import ops as ops_sql
from ..models import QueueModel

if TYPE_CHECKING:
    from .._sql import SQLParam


@dataclass
class QueueCounts:
    model: type[models.Model]
    waiting: int
    due_now: int
    dead: int
    done: int  # cap + 1 means "more than the cap"
    oldest_due: datetime | None


def queue_models() -> list[type[models.Model]]:
    """Return every concrete queue model of the project, by label."""
    found = [
        model
        for model in apps.get_models()
        if issubclass(model, QueueModel) and not model._meta.abstract and not model._meta.proxy
    ]
    return sorted(found, key=lambda model: model._meta.label)


def count_sql(
    model: type[models.Model], now: datetime, using: str, cap: int | None, *, done: bool = True
) -> tuple[str, list[SQLParam]]:
    """Return the one statement that counts a queue table's states, and its parameters.

    The outer query reads only waiting or dead rows, written as the predicates of the table's two partial
    indexes (claim's and dead rows'), so they are counted from those indexes however many done rows the table
    holds. Done rows are
    counted in a sub-select that stops at ``cap + 1`` (when a cap is given): a million finished rows cost no
    more than ten thousand. Written out because the ORM's ``aggregate()`` refuses the scalar sub-select; the
    conditions are the states' own ``Q`` compiled, once per table (``_count_template``): compiling them cost
    more than counting a small table, every five minutes for each. ``done=False`` leaves the done count out
    (0): the sampling job needs none.
    """
    sql, params, moving = _count_template(model, using, cap, done)
    due: Any = model._meta.get_field("due")
    moment = due.get_db_prep_value(now, connections[using], prepared=False)  # as the lookups prepare it
    return sql, [moment if index in moving else param for index, param in enumerate(params)]


@cache(maxsize=256)
def _count_template(
    model: type[models.Model], using: str, cap: int | None, done: bool
) -> tuple[str, list[SQLParam], frozenset[int]]:
    """``count_sql``'s statement and parameters, and which parameters are the moment ``now``.

    Compiled at two moments: the parameters that differ are the moment's (the statement is the same).
    """
    first, second = (datetime(year, 1, 1, tzinfo=UTC) for year in (2000, 2001))
    sql, params = _compile_count(model, first, using, cap, done=done)
    _same, other = _compile_count(model, second, using, cap, done=done)
    moving = frozenset(index for index, (one, two) in enumerate(zip(params, other, strict=True)) if one != two)
    return sql, params, moving


def _compile_count(
    model: type[models.Model], now: datetime, using: str, cap: int | None, *, done: bool = True
) -> tuple[str, list[SQLParam]]:
    """Compile ``count_sql``'s statement for ``now`` (the states' ``Q`` through the ORM's compiler)."""
    connection = connections[using]
    quote = connection.ops.quote_name
    opts = model._meta
    due_field: Any = opts.get_field("due")
    table, due = quote(opts.db_table), quote(due_field.column)
    indexed, indexed_params = q_sql(model, not_done_q(model), connection)
    waiting, waiting_params = state_sql(model, "waiting", now, connection)
    due_now, due_now_params = state_sql(model, "due_now", now, connection)
    dead, dead_params = state_sql(model, "dead", now, connection)
    done_sql, done_params = state_sql(model, "done", now, connection)
    limit = "" if cap is None else " LIMIT %s"
    done_count = ops_sql.DONE_COUNT.format(table=table, done=done_sql, limit=limit) if done else "0"
    statement = ops_sql.QUEUE_COUNTS.format(
        waiting=waiting, due_now=due_now, dead=dead, due=due, done_count=done_count, table=table, indexed=indexed
    )
    params = [*waiting_params, *due_now_params, *dead_params, *due_now_params]
    if done:
        params += [*done_params, *([] if cap is None else [cap + 1])]
    return statement, params + indexed_params


def count_queue(model: type[models.Model], now: datetime, *, cap: int | None = None, done: bool = True) -> QueueCounts:
    """Count one queue table's rows by state in one statement (see ``count_sql``)."""
    using = router.db_for_read(model)
    sql, params = count_sql(model, now, using, cap, done=done)
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        waiting, due_now, dead, oldest, done = cursor.fetchone()
    return QueueCounts(model, waiting, due_now, dead, done, _as_datetime(oldest))


def _as_datetime(value: object) -> datetime | None:
    """Return a MIN() of a datetime column as an aware datetime (SQLite answers text, MySQL a naive UTC value)."""
    if value is None or isinstance(value, datetime) and timezone.is_aware(value):
        return value
    moment = value if isinstance(value, datetime) else parse_datetime(str(value))
    if moment is not None and settings.USE_TZ and timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    return moment
