"""A Django task's row: its arguments checked as JSON, and the row inserted with its queue's kick in one commit.

``FabrikaBackend.enqueue()`` and the periodic tasks' jobs (``_periodic``) insert through here alone.
"""

from __future__ import annotations

import json
import operator
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import DatabaseError, connections, router, transaction
from django.utils import timezone

from ._channel import CHANNEL
from ._runs.kickmarks import kicked_in_transaction, note_kick
from ._sql import cache
from ._sql import prepared as _prepared
from ._sql import tasks as task_sql
from ._tasks_compat import Task, normalize_json
from .jobs import task_job_name
from .kicks import kick

if TYPE_CHECKING:
    from django.db.models import Field

    from ._sql import SQLParam
    from .models import QueuedTask

#: The JSON of one task's args and kwargs together, at most, in bytes (UTF-8, without spaces). The worker, the
#: database and a task's admin page hold them whole, so a task carries ids, not documents.
MAX_ARGUMENTS_BYTES = 1024 * 1024
# One encoder for every enqueue: ``json.dumps`` with options makes a new one each call. It holds no state of a call.
_ENCODE = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode


def insert(
    alias: str, task: Task, args: Sequence[object], kwargs: Mapping[str, object], *, result_id: uuid.UUID | None = None
) -> QueuedTask:
    """Insert ``task``'s row for the backend ``alias`` (a new result id, or ``result_id``) and kick its queue's job
    when the current transaction commits; answer the row. Arguments that are no JSON raise before any write."""
    from .models import QueuedTask

    now = timezone.now()
    # Exactly the fields of ``_GIVEN``; every other field holds its default.
    given = {
        "result_id": uuid.uuid4() if result_id is None else result_id,
        "task_path": task.module_path,
        "backend": alias,
        "queue_name": task.queue_name,
        "priority": task.priority,
        # A value that is not JSON, NaN, Infinity or too much raises here, before anything is written.
        **json_arguments(args, kwargs),
        "run_after": task.run_after,
        "due": task.run_after or now,
        "enqueued_at": now,
    }
    # Positionally, in the order of the concrete fields (as ``Model.from_db`` makes an instance): a fifth of the
    # time of keyword arguments, which Django matches against every field.
    fields = QueuedTask._meta.concrete_fields
    values: list[Any] = [given[field.attname] if field.attname in given else field.get_default() for field in fields]
    row = QueuedTask(*values)  # type: ignore[misc]  # django-stubs types a positional argument as the pk's
    _insert_and_kick(row, given, task_job_name(alias, task.queue_name))
    return row


def _insert_and_kick(row: QueuedTask, given: Mapping[str, object], job: str) -> None:
    """Insert the task's row and kick its job, in one commit: the caller's transaction, or one of their own.

    PostgreSQL: one statement, the row, the kick's row and the NOTIFY (``run_sql.kick_cte``), so an enqueue in
    autocommit is one round trip and one commit, as an INSERT alone. Elsewhere: the row and the kick in one
    transaction (no savepoint inside the caller's).
    """
    from .models import QueuedTask

    alias = router.db_for_write(QueuedTask, instance=row)
    connection = connections[alias]
    if connection.vendor != "postgresql":
        with transaction.atomic(using=alias, savepoint=False):
            row.save(force_insert=True, using=alias)
            kick(job, using=alias)
        return
    insert = _insert_statement(alias, not kicked_in_transaction(job, alias))
    # Each value is turned by its field (``get_db_prep_save``, as ``save()`` does): the call's on each enqueue, the
    # task's once per task (``_task_params``); the defaults are in the statement already (``_insert_statement``).
    params = dict(_task_params(alias, _task_values(given)))
    for name, field in insert.of_call:
        params[name] = field.get_db_prep_save(given[field.attname], connection)
    params.update(name=job, channel=CHANNEL)
    answer = _prepared.fetchone(connection, insert.sql, params)
    if answer is None:
        # A check, not an assert (``python -O`` drops those): an INSERT ... RETURNING answers its row unless
        # something on the table (a trigger, a rule) skipped it; the task would never run, so say so.
        raise DatabaseError(f"The task's row was not inserted into {QueuedTask._meta.db_table}: no row returned.")
    row.pk = answer[0]
    row._state.adding, row._state.db = False, alias
    note_kick(job, alias)


#: The fields ``insert`` gives a value of: the task's own (the same for each of its rows), and the call's. Every
#: other field of the row holds its default.
_OF_TASK = ("task_path", "backend", "queue_name", "priority", "run_after")
_OF_CALL = ("result_id", "args", "kwargs", "due", "enqueued_at")
_GIVEN = frozenset(_OF_TASK + _OF_CALL)
_task_values = operator.itemgetter(*_OF_TASK)  # a given's values of _OF_TASK, as a tuple, in one call


class _InsertStatement(NamedTuple):
    """The task row's INSERT on PostgreSQL (``sql``), and its parameters ``v0``... by the field each is of."""

    sql: str
    of_task: list[tuple[str, Field]]
    of_call: list[tuple[str, Field]]


@cache(maxsize=256)
def _task_params(alias: str, values: tuple[object, ...]) -> dict[str, SQLParam]:
    """The database values of what a task gives each of its rows (``_OF_TASK``'s ``values``), by parameter.

    Turned by their fields once per (database, values), where each enqueue of a task turned the same five again.
    Bounded: ``using(run_after=...)`` makes a task, and values, for each call.
    """
    connection = connections[alias]
    given = dict(zip(_OF_TASK, values, strict=True))
    # The parameters are named alike with and without the kick.
    of_task = _insert_statement(alias, False).of_task
    return {name: field.get_db_prep_save(given[field.attname], connection) for name, field in of_task}


@cache(maxsize=8)
def _insert_statement(alias: str, with_kick: bool) -> _InsertStatement:
    """The task row's INSERT on PostgreSQL (its columns as Django's own INSERT writes them), and its parameters.

    With ``with_kick``, the kick's row and NOTIFY ride in the same statement. Parameters: ``v0``... by field given
    (``_OF_TASK``, ``_OF_CALL``), ``name`` (the job), ``channel``. Every other field's default is turned by the field
    once (``get_db_prep_save``, as ``save()`` would on each row) and written into the statement, so it must be the
    same for every row: a value, or ``list``/``dict`` (an empty one); a default that may differ by row is refused.
    """
    from .models import QueuedTask

    connection = connections[alias]
    connection.ensure_connection()  # the defaults are quoted for the session (``task_sql.insert``)
    fields = [field for field in QueuedTask._meta.concrete_fields if not field.primary_key]
    of_task: list[tuple[str, Field]] = []
    of_call: list[tuple[str, Field]] = []
    fixed = {}
    for index, field in enumerate(fields):
        if field.attname in _GIVEN:
            (of_task if field.attname in _OF_TASK else of_call).append((f"v{index}", field))
        elif field.has_default() and callable(field.default) and field.default not in (list, dict):
            raise TypeError(
                f"{QueuedTask._meta.label}.{field.name} has a default that may differ by row: the enqueue must give "
                "its value (add it to _task_rows._OF_CALL)."
            )
        else:
            fixed[index] = field.get_db_prep_save(field.get_default(), connection)
    quote = connection.ops.quote_name
    columns = [quote(str(field.column)) for field in fields]
    pk = quote(str(QueuedTask._meta.pk.column))
    sql = task_sql.insert(connection, columns, pk, with_kick=with_kick, fixed=fixed)
    return _InsertStatement(sql, of_task, of_call)


def json_arguments(args: object, kwargs: object) -> dict[str, object]:
    """A task's args and kwargs as JSON values, or a ``ValueError`` that says what is wrong with them."""
    values: dict[str, object] = {
        "args": normalize_json(args),
        "kwargs": normalize_json(kwargs),
    }  # TypeError for what is no JSON
    try:
        text = _ENCODE(values)
    except ValueError:
        raise ValueError(
            "A task's arguments hold NaN or Infinity, which JSON and the database have no value for: pass None "
            "or a string instead."
        ) from None
    size = len(text.encode())
    if size > MAX_ARGUMENTS_BYTES:
        raise ValueError(
            f"A task's arguments are {size} bytes of JSON; a task takes at most {MAX_ARGUMENTS_BYTES} (1 MiB): "
            "store the data in a row or a file and pass its id."
        )
    return values
