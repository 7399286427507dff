"""PostgreSQL: a task row whose JSON the worker cannot decode (written outside ``enqueue()``) fails alone.

Without that, the claim that read it failed as a whole: every row of the batch was charged an attempt on every
run, and the first, which the run's start statement had marked RUNNING, stayed RUNNING with nobody running it.
"""

import pytest
from django.db import connection

from fabrika_django import runner
from fabrika_django.models import QueuedTask
from testproject.lab import tasks
from testproject.lab.models import Mark

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

JOB = "tasks.default.default"
#: Deeper than Python's json decoder follows (it raises RecursionError), yet valid jsonb for PostgreSQL.
DEEP = "[" * 3000 + "]" * 3000


@pytest.fixture(autouse=True)
def job_rows():
    runner.sync_jobs([JOB])


def _poison(result_id):
    """Write args no worker can decode, as a project's own SQL (not ``enqueue()``) could."""
    table = connection.ops.quote_name(QueuedTask._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET args = %s::jsonb WHERE result_id = %s", [DEEP, result_id])


@pytest.mark.parametrize("trigger, serving", [("kick", False), ("manual", True)], ids=["at-start", "claim"])
def test_a_task_row_whose_json_cannot_be_decoded_fails_alone(trigger, serving):
    # Priority puts the bad row first in claim order: the row the start statement marks RUNNING.
    bad = tasks.mark.using(priority=5).enqueue("undecodable")
    good = [tasks.mark.enqueue(f"neighbour {n}") for n in range(3)]
    _poison(bad.id)
    assert runner.run(JOB, trigger, mark_pending=serving).ok
    row = QueuedTask.objects.defer("args").get(result_id=bad.id)
    assert (row.status, row.last_failure) == ("FAILED", "task_undecodable")
    assert row.finished_at is not None
    rows = QueuedTask.objects.filter(result_id__in=[result.id for result in good])
    assert sorted(rows.values_list("status", "attempts")) == [("SUCCESSFUL", 1)] * 3
    assert Mark.objects.count() == 3
