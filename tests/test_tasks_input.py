"""What ``enqueue()`` takes: arguments of at most 1 MiB of JSON, without NaN or Infinity, refused before anything is
written; and the tasks list, which never reads a task's call or result."""

import math

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from fabrika_django.models import QueuedTask
from fabrika_django.tasks import MAX_ARGUMENTS_BYTES
from testproject.lab import tasks

pytestmark = pytest.mark.django_db(transaction=True)

TOO_MUCH = (
    "A task's arguments are {size} bytes of JSON; a task takes at most 1048576 (1 MiB): store the data in a row or a "
    "file and pass its id."
)
NAN = (
    "A task's arguments hold NaN or Infinity, which JSON and the database have no value for: pass None or a string "
    "instead."
)


def test_arguments_up_to_one_mib_of_json_are_taken_and_more_are_refused_before_anything_is_written():
    assert MAX_ARGUMENTS_BYTES == 1024 * 1024
    # {"args":["x…"],"kwargs":{}} is 25 bytes around the string.
    tasks.mark.enqueue("x" * (MAX_ARGUMENTS_BYTES - 25))
    with pytest.raises(ValueError) as refused:
        tasks.mark.enqueue("x" * (MAX_ARGUMENTS_BYTES - 24))
    assert str(refused.value) == TOO_MUCH.format(size=MAX_ARGUMENTS_BYTES + 1)
    with pytest.raises(ValueError, match=r"^A task's arguments are 2097187 bytes of JSON"):
        tasks.add.enqueue(a="é" * MAX_ARGUMENTS_BYTES, b=1)  # counted in UTF-8 bytes, kwargs too
    assert QueuedTask.objects.count() == 1


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((math.nan, 1), {}),
        ((math.inf, 1), {}),
        ((1,), {"b": -math.inf}),
        (([1, {"deep": [math.nan]}], 1), {}),
    ],
    ids=["nan", "infinity", "minus-infinity-in-kwargs", "nested-nan"],
)
def test_nan_and_infinity_are_refused_at_enqueue_and_the_callers_transaction_goes_on(args, kwargs):
    with transaction.atomic():
        with pytest.raises(ValueError) as refused:
            tasks.add.enqueue(*args, **kwargs)
        assert str(refused.value) == NAN
        # No database error broke the transaction: the caller's next statements and enqueues work.
        kept = tasks.add.enqueue(1, 2)
    assert [str(pk) for pk in QueuedTask.objects.values_list("result_id", flat=True)] == [kept.id]


def test_the_tasks_list_reads_no_call_or_result_column(admin_client):
    tasks.mark.enqueue("x" * 1000)
    table = QueuedTask._meta.db_table
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get("/admin/fabrika_django/queuedtask/").status_code == 200
    [listing] = [q["sql"] for q in queries if table in q["sql"] and "LIMIT" in q["sql"] and "COUNT" not in q["sql"]]
    quote = connection.ops.quote_name
    for column in ("args", "kwargs", "return_value", "errors"):
        assert f"{quote(table)}.{quote(column)}" not in listing
    assert f"{quote(table)}.{quote('task_path')}" in listing
