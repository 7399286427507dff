"""A Django task's row: its arguments checked as JSON, and the row inserted with its queue's kick in one commit.

``FabrikaBackend.enqueue()`` and the periodic tasks' jobs (``_periodic``) insert through here alone.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

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


def insert(
    alias: str, task: Task, args: Sequence[object], kwargs: Mapping[str, object], *, result_id: uuid.UUID | None = None
) -> QueuedTask:
    """Insert ``task``'s row for the backend ``alias`` (a new result id, or ``result_id``) and kick its queue's job
    when the current transaction commits; answer the row. Arguments that are no JSON raise before any write."""
    from .models import QueuedTask

    now = timezone.now()
    row = QueuedTask(
        task_path=task.module_path,
        backend=alias,
        queue_name=task.queue_name,
        priority=task.priority,
        # A value that is not JSON, NaN, Infinity or too much raises here, before anything is written.
        **json_arguments(args, kwargs),
        run_after=task.run_after,
        due=task.run_after or now,
        enqueued_at=now,
    )
    if result_id is not None:
        row.result_id = result_id
    _insert_and_kick(row, task_job_name(alias, task.queue_name))
    return row


def _insert_and_kick(row: QueuedTask, job: str) -> None:
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
    with_kick = not kicked_in_transaction(job, alias)
    sql, fields = _insert_sql(alias, with_kick)
    params: dict[str, SQLParam] = {
        f"v{index}": field.get_db_prep_save(field.pre_save(row, True), connection) for index, field in enumerate(fields)
    }
    params.update(name=job, channel=CHANNEL)
    answer = _prepared.fetchone(connection, sql, params)
    if answer is None:
        # A check, not an assert (``python -O`` drops those): an INSERT ... RETURNING answers its row unless
        # something on the table (a trigger, a rule) skipped it; the task would never run, so say so.
        raise DatabaseError(f"The task's row was not inserted into {QueuedTask._meta.db_table}: no row returned.")
    row.pk = answer[0]
    row._state.adding, row._state.db = False, alias
    note_kick(job, alias)


@cache(maxsize=8)
def _insert_sql(alias: str, with_kick: bool) -> tuple[str, list[Field]]:
    """The task row's INSERT on PostgreSQL (its columns as Django's own INSERT writes them), and its fields.

    With ``with_kick``, the kick's row and NOTIFY ride in the same statement. Parameters: ``v0``... by field,
    ``name`` (the job), ``channel``.
    """
    from .models import QueuedTask

    connection = connections[alias]
    fields = [field for field in QueuedTask._meta.concrete_fields if not field.primary_key]
    quote = connection.ops.quote_name
    columns = [quote(str(field.column)) for field in fields]
    pk = quote(str(QueuedTask._meta.pk.column))
    return task_sql.insert(connection, columns, pk, with_kick=with_kick), fields


def json_arguments(args: object, kwargs: object) -> dict[str, object]:
    """A task's args and kwargs as JSON values, or a ``ValueError`` that says what is wrong with them."""
    values: dict[str, object] = {
        "args": normalize_json(args),
        "kwargs": normalize_json(kwargs),
    }  # TypeError for what is no JSON
    try:
        text = json.dumps(values, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
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
