"""``FabrikaBackend.enqueue()``'s own path: a task's checks once until a setting changes, the row as the enqueue
answered it, and every promise of an enqueue kept once those are remembered (the signal, the rollback, the
refusal of bad arguments before a write)."""

import math
from datetime import datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings

from fabrika_django import _task_rows
from fabrika_django._sql import tasks as task_sql
from fabrika_django._tasks_compat import InvalidTask, task_enqueued
from fabrika_django.models import QueuedTask
from fabrika_django.tasks import FabrikaBackend
from testproject.lab import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def validations(monkeypatch):
    """The tasks ``FabrikaBackend.validate_task`` was asked about, in order."""
    seen = []
    validate = FabrikaBackend.validate_task

    def recorded(self, task):
        seen.append(task)
        validate(self, task)

    monkeypatch.setattr(FabrikaBackend, "validate_task", recorded)
    return seen


def test_a_tasks_checks_run_at_its_first_enqueue_only_while_the_settings_hold(validations):
    task, equal = tasks.add.using(priority=37), tasks.add.using(priority=37)  # a task no other test enqueues
    validations.clear()  # Django validates each task it makes
    task.enqueue(1, 2)
    task.enqueue(3, 4)
    equal.enqueue(5, 6)  # an equal task is the same task
    assert validations == [task]
    with override_settings(FABRIKA={"LEASE_SECONDS": 30}):  # any setting: every cache is emptied
        task.enqueue(7, 8)
        task.enqueue(9, 10)
    task.enqueue(11, 12)
    assert validations == [task, task, task]  # and once more on the change, once on the change back
    assert QueuedTask.objects.count() == 6


def test_a_task_valid_under_the_old_settings_is_refused_once_they_change():
    """``USE_TZ`` off: a naive ``run_after`` is valid, and the enqueue is remembered; on again, the same task is
    refused as Django's own check refuses it, and nothing is written."""
    with override_settings(USE_TZ=False):
        naive = tasks.add.using(run_after=datetime(2030, 1, 1, 12, 0))
        naive.enqueue(1, 2)
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        naive.enqueue(1, 2)
    assert QueuedTask.objects.count() == 1


def test_an_enqueue_with_its_checks_remembered_still_signals_refuses_bad_arguments_and_rolls_back(fabrika_kicks):
    seen = []

    def record(sender, task_result, **kwargs):
        seen.append(task_result.args)

    task_enqueued.connect(record, weak=False)
    try:
        tasks.add.enqueue(1, 2)
        tasks.add.enqueue(3, 4)
        with pytest.raises(ValueError, match="NaN or Infinity"):
            tasks.add.enqueue(math.nan, 4)
        with pytest.raises(TypeError):
            tasks.add.enqueue(object(), 4)
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            tasks.add.enqueue(5, 6)
            raise ZeroDivisionError
    finally:
        task_enqueued.disconnect(record)
    assert seen == [[1, 2], [3, 4], [5, 6]]  # the rolled back one was enqueued, then undone
    assert sorted(QueuedTask.objects.values_list("args", flat=True)) == [[1, 2], [3, 4]]
    assert fabrika_kicks == ["tasks.default.default", "tasks.default.default"]


def test_the_row_in_the_database_is_the_row_the_enqueue_answered_field_by_field():
    """Every column as the row the enqueue answered holds it: the values it gives (turned by their fields on each
    enqueue) and the defaults (turned once, and written into PostgreSQL's statement)."""
    run_after = datetime.fromisoformat("2030-01-02T03:04:05.678901+00:00")
    task = tasks.add.using(priority=-7, queue_name="emails", run_after=run_after)
    row = _task_rows.insert("default", task, [1, "50% off"], {"b": {"c": None}})
    stored = QueuedTask.objects.get(pk=row.pk)
    attnames = [field.attname for field in QueuedTask._meta.concrete_fields]
    assert {name: getattr(stored, name) for name in attnames} == {name: getattr(row, name) for name in attnames}
    assert (stored.args, stored.kwargs, stored.due) == ([1, "50% off"], {"b": {"c": None}}, run_after)
    assert (stored.priority, stored.queue_name, stored.status, stored.attempts) == (-7, "emails", "READY", 0)
    assert (stored.version, stored.errors, stored.worker_ids, stored.return_value) == (0, [], [], None)
    assert row._state.adding is False and row._state.db == "default"


def test_tasks_of_one_function_that_differ_in_priority_queue_or_run_after_each_write_their_own():
    """What a task gives its rows is turned once per task (on PostgreSQL): a task made by ``using()`` is another."""
    later = datetime.fromisoformat("2031-05-06T07:08:09.123456+00:00")
    made = [
        tasks.add.using(priority=5),
        tasks.add.using(priority=6),
        tasks.add.using(priority=6, queue_name="emails"),
        tasks.add.using(priority=6, queue_name="emails", run_after=later),
        tasks.add.using(priority=6, queue_name="emails", run_after=later + timedelta(microseconds=1)),
    ]
    for task in made * 2:
        task.enqueue(1, 2)
    stored = QueuedTask.objects.order_by("pk").values_list("priority", "queue_name", "run_after")
    expected = [(task.priority, task.queue_name, task.run_after) for task in made]
    assert list(stored) == expected * 2


@pytest.mark.postgresql
def test_a_default_is_written_into_the_statement_as_a_literal_with_its_percent_signs_doubled():
    connection.ensure_connection()
    sql = task_sql.insert(connection, ['"a"', '"b"'], '"id"', with_kick=False, fixed={1: "50% off"})
    assert sql.endswith(' ("a", "b") VALUES (%(v0)s, \'50%% off\') RETURNING "id"')


@pytest.mark.postgresql
def test_a_default_that_may_differ_by_row_is_refused_when_the_statement_is_made(monkeypatch):
    field = QueuedTask._meta.get_field("last_failure")
    field.get_default()  # Django keeps the default it read first: the real one, for the tests after this one
    monkeypatch.setattr(field, "default", lambda: "may differ")
    _task_rows._insert_statement.cache_clear()
    try:
        with pytest.raises(TypeError, match=r"^fabrika_django.QueuedTask.last_failure has a default that may differ"):
            tasks.add.enqueue(1, 2)
    finally:
        _task_rows._insert_statement.cache_clear()
    assert QueuedTask.objects.count() == 0
