"""What the admin's overview and ``fabrika_job status`` report: each queue table's counts, each job's state,
and the health findings of ``_health`` (computed from the same counts).

Both read the same data the same way: queue rows counted by the states of ``_queuestate`` (one statement
per table), jobs read through ``run_reads.job_states`` (nothing written on a read).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import connections, models, router
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .._queuestate import not_done_q, q_sql, state_sql
from .._runs import reads as run_reads
from .._sql import cache
from .._sql import ops as ops_sql
from ..jobs import registry
from ..models import QueueModel
from . import _health


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
) -> tuple[str, list[Any]]:
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
) -> tuple[str, list[Any], frozenset[int]]:
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
) -> tuple[str, list[Any]]:
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


def _as_datetime(value: Any) -> datetime | None:
    """Return a MIN() of a datetime column as an aware datetime (SQLite answers text, MySQL a naive UTC value)."""
    if value is None or isinstance(value, datetime) and timezone.is_aware(value):
        return value
    moment = value if isinstance(value, datetime) else parse_datetime(str(value))
    if moment is not None and settings.USE_TZ and timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    return moment


def job_states(now: datetime) -> list[dict[str, Any]]:
    """Return each registered job's row (defaults for a job without one) with its run state.

    ``active``, ``active_lanes``, ``lanes``, ``holder``, ``pending``: see ``run_reads.job_states``.
    """
    names = [job.name for job in registry]
    states = run_reads.job_states(names, now)
    return [states[name] for name in names]


def job_state_word(state: dict[str, Any]) -> str:
    """Return "active", "active, pending", "pending" or "idle"; with lanes, "active 3/8" (active lanes / lanes)."""
    if state["active"]:
        active = f"active {state['active_lanes']}/{state['lanes']}" if state["lanes"] > 1 else "active"
        return f"{active}, pending" if state["pending"] else active
    return "pending" if state["pending"] else "idle"


def status(now: datetime) -> dict[str, Any]:
    """The report of ``fabrika_job status``: each queue table's counts (done exactly), each job's state, health."""
    queues = []
    counted = {}
    for model in queue_models():
        counts = counted[model._meta.label] = count_queue(model, now)
        oldest = counts.oldest_due
        queues.append(
            {
                "model": model._meta.label,
                "waiting": counts.waiting,
                "due_now": counts.due_now,
                "dead": counts.dead,
                "done": counts.done,
                "oldest_due_age_seconds": None if oldest is None else round((now - oldest).total_seconds(), 3),
            }
        )
    jobs = []
    for state in job_states(now):
        jobs.append(
            {
                "name": state["name"],
                "state": job_state_word(state),
                "active": state["active"],
                "active_lanes": state["active_lanes"],
                "lanes": state["lanes"],
                "pending": state["pending"],
                "holder": state["holder"],
                "next_fire": _utc(state["next_fire"]),
                "last_run_id": str(state["last_run_id"]) if state["last_run_id"] else None,
                "last_trigger": state["last_trigger"] or None,
                "last_started": _utc(state["last_started"]),
                "last_finished": _utc(state["last_finished"]),
                "last_outcome": state["last_outcome"] or None,
                "last_success": _utc(state["last_success"]),
                "failures_in_row": state["failures_in_row"],
            }
        )
    health = [finding.as_dict() for finding in _health.health_report(now, counts=counted)]
    return {"now": _utc(now), "queues": queues, "jobs": jobs, "health": health}


def _utc(moment: datetime | None) -> str | None:
    # ISO 8601 with its offset, so a reader never has to guess the zone.
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="seconds")
