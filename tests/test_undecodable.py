"""A row the worker cannot decode (written outside the ORM) fails alone, on every claim's way.

Without that, the claim that read it failed as a whole: every row of the batch was charged an attempt on every
run, and the first task, which the run's start statement had marked RUNNING, stayed RUNNING with nobody running
it. Two such values: JSON nested deeper than Python's decoder follows (up to 3.12: Python 3.13 follows 1,500
levels, and SQLite refuses more than 2,000, so there it is skipped; MariaDB refuses more than 32 levels), and a
number longer than Python turns into an int (4,300 digits), which all three databases hold.
"""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import DatabaseError, connection, transaction

from fabrika_django import runner
from fabrika_django._running import ActiveRun, running
from fabrika_django.models import QueuedTask
from testproject.lab import tasks
from testproject.lab.models import Mark, Parcel

from .conftest import make_job

pytestmark = [pytest.mark.django_db(transaction=True)]

JOB = "tasks.default.default"
#: Deeper than Python's json decoder follows up to 3.12 (it raises RecursionError), yet valid JSON for PostgreSQL's
#: jsonb and SQLite's json_valid (which follows 2,000 levels).
DEEP = "[" * 1500 + "]" * 1500
#: A number of more digits than Python converts to an int (ValueError), valid JSON for every database.
LONG_NUMBER = "[" + "1" * 5000 + "]"
NOON = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def job_rows():
    runner.sync_jobs([JOB])


def _undecodable(poison):
    """The premise: this Python's json decoder cannot read ``poison``, and this database can hold it."""
    if poison == DEEP and connection.vendor == "mysql":
        pytest.skip("MariaDB cannot hold such a row (test_on_mariadb_a_task_row_nested_too_deep_cannot_be_written)")
    try:
        json.loads(poison)
    except (RecursionError, ValueError):
        return poison
    pytest.skip("this Python's json decoder reads it")


def _poison(result_id, poison=DEEP):
    """Write args no worker can decode, as a project's own SQL (not ``enqueue()``) could."""
    table = connection.ops.quote_name(QueuedTask._meta.db_table)
    value = "%s::jsonb" if connection.vendor == "postgresql" else "%s"
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET args = {value} WHERE result_id = %s",
            [poison, QueuedTask.result_id.field.get_db_prep_value(result_id, connection)],
        )


POISONS = pytest.mark.parametrize("poison", [DEEP, LONG_NUMBER], ids=["nested", "long-number"])


@POISONS
@pytest.mark.parametrize("trigger, serving", [("kick", False), ("manual", True)], ids=["at-start", "claim"])
def test_a_task_row_whose_json_cannot_be_decoded_fails_alone(trigger, serving, poison):
    poison = _undecodable(poison)
    # Priority puts the bad row first in claim order: the row the start statement marks RUNNING.
    bad = tasks.mark.using(priority=5).enqueue("undecodable")
    good = [tasks.mark.enqueue(f"neighbour {n}") for n in range(3)]
    _poison(bad.id, poison)
    assert runner.run(JOB, trigger, mark_pending=serving).ok
    row = QueuedTask.objects.defer("args").get(result_id=bad.id)
    assert (row.status, row.last_failure) == ("FAILED", "task_undecodable")
    assert row.finished_at is not None
    rows = QueuedTask.objects.filter(result_id__in=[result.id for result in good])
    assert sorted(rows.values_list("status", "attempts")) == [("SUCCESSFUL", 1)] * 3
    assert Mark.objects.count() == 3


@pytest.mark.mysql
def test_on_mariadb_a_task_row_nested_too_deep_cannot_be_written():
    result = tasks.mark.enqueue("undecodable")
    with pytest.raises(DatabaseError), transaction.atomic():
        _poison(result.id)
    assert QueuedTask.objects.get(result_id=result.id).args == ["undecodable"]


@POISONS
def test_a_queue_row_that_cannot_be_decoded_is_given_up_alone_and_dead(poison):
    """A queue table's row whose JSON cannot be read back: the claim gives it up, dead with ``row_undecodable``,
    and answers its neighbours (PostgreSQL: in one statement; SQLite and MariaDB: the long way)."""
    poison = _undecodable(poison)
    rows = [Parcel.objects.create(contents={"n": n}, due=NOON - timedelta(minutes=3 - n)) for n in range(3)]
    bad = rows[1]
    table = connection.ops.quote_name(Parcel._meta.db_table)
    value = "%s::jsonb" if connection.vendor == "postgresql" else "%s"
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET contents = {value} WHERE id = %s", [poison, bad.pk])
    with running(ActiveRun(job=make_job(), clock=lambda: NOON)):
        claimed = Parcel.objects.claim(limit=10)
    assert [row.pk for row in claimed] == [rows[0].pk, rows[2].pk]
    assert [row.contents for row in claimed] == [{"n": 0}, {"n": 2}]
    given_up = Parcel.objects.filter(pk=bad.pk).values("attempts", "last_failure").get()
    assert given_up == {"attempts": 4, "last_failure": "row_undecodable"}  # Parcel's Queue.max_attempts
    assert Parcel.objects.dead().filter(pk=bad.pk).exists()
