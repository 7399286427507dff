"""A run of Django tasks starts fast tasks in groups and writes their outcomes with the next group's start
(``_runs.task_groups``): slow tasks one by one, a row changed since its claim never run, and the outcomes a
run holds written whatever ends it."""

import logging

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from fabrika_django.models import QueuedTask
from fabrika_django.testing import run_tasks
from testproject.lab import tasks
from testproject.lab.models import Mark

pytestmark = pytest.mark.django_db(transaction=True)


def _statuses_seen(results):
    """Each task's answer (the statuses it saw while it ran), in the order the tasks ran."""
    return [result.return_value for result in sorted(results, key=lambda result: result.finished_at)]


def test_fast_tasks_are_started_together_and_every_one_succeeds():
    enqueued = [tasks.statuses.enqueue() for _ in range(10)]
    results = run_tasks()
    assert sorted(result.id for result in results) == sorted(result.id for result in enqueued)
    assert {result.status for result in results} == {"SUCCESSFUL"}
    # The first task runs alone (its time is not known yet): the second was not started while it ran. The ones
    # after it, of a millisecond each, are started together: some task saw a later one RUNNING before it ran
    # (whichever, so that a slow first task on a loaded machine delays the grouping without failing the test).
    seen = _statuses_seen(results)
    order = [result.id for result in sorted(results, key=lambda result: result.finished_at)]
    assert seen[0][order[1]] == "READY"
    saw_a_later_one_running = [
        any(seen[index][later] == "RUNNING" for later in order[index + 1 :]) for index in range(len(order))
    ]
    assert any(saw_a_later_one_running), seen


@pytest.mark.skipif(connection.vendor != "postgresql", reason="one statement a group on PostgreSQL only")
def test_on_postgresql_a_group_of_fast_tasks_costs_one_statement_not_two_a_task():
    # Inline in a test's transaction: the run's statements are this connection's, so they can be counted.
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        for _ in range(20):
            tasks.noop.enqueue()
        assert len(run_tasks()) == 20
    table = connection.ops.quote_name(QueuedTask._meta.db_table)
    writes = [query for query in queries if query["sql"].startswith(f"UPDATE {table}")]
    # Was two a task (its RUNNING, then its outcome), 40 in all.
    assert len(writes) < 10


def test_slow_tasks_are_started_one_by_one():
    for _ in range(3):
        tasks.statuses.enqueue(0.03)  # three times the group's window: no two of them share a start
    seen = _statuses_seen(run_tasks())
    assert len(seen) == 3
    # Each saw itself RUNNING, and the others not yet started, or done.
    assert all(list(statuses.values()).count("RUNNING") == 1 for statuses in seen), seen


def test_a_task_changed_since_its_claim_is_not_started_nor_run(caplog):
    later = tasks.mark.enqueue("must not run")
    tasks.changes_a_task.using(priority=10).enqueue(later.id)  # runs first, alone, and changes the later row
    with caplog.at_level(logging.WARNING, logger="fabrika_django"):
        run_tasks()
    assert not Mark.objects.filter(note="must not run").exists()
    row = QueuedTask.objects.get(result_id=later.id)
    assert (row.status, row.attempts) == ("READY", 1)  # its claim's attempt counted, due after the backoff
    assert f"task={later.id} code=version_conflict" in caplog.text


def test_the_outcomes_a_run_holds_are_written_when_a_task_ends_the_run_with_ctrl_c():
    # Inline in the main thread (a test's transaction), Ctrl-C ends the run as it ends a worker run by hand.
    with transaction.atomic():
        first, second = tasks.noop.enqueue(), tasks.noop.enqueue()
        interrupted = tasks.interrupts_itself.using(priority=-10).enqueue()
        with pytest.raises(KeyboardInterrupt):
            run_tasks()
        statuses = {str(pk): status for pk, status in QueuedTask.objects.values_list("result_id", "status")}
    # The second ran in one group with the interrupted task: its outcome was still held when Ctrl-C came.
    assert statuses[first.id] == statuses[second.id] == "SUCCESSFUL"
    assert statuses[interrupted.id] == "RUNNING"  # its worker stopped with it: rerun after the backoff


def test_a_run_short_of_a_tasks_timeout_gives_the_claimed_rest_back_and_asks_for_another_run():
    from django.test import override_settings

    from fabrika_django.models import Attempt

    backends = {
        "default": {
            "BACKEND": "fabrika_django.tasks.FabrikaBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"timeout": 1},
        }
    }
    with override_settings(TASKS=backends):
        # The attempt has twice the timeout (2 s): after the first task's 1.2 s, less than a timeout is left.
        tasks.statuses.using(priority=10).enqueue(1.2)
        rest = [tasks.mark.enqueue(f"after {n}") for n in range(3)]
        assert len(run_tasks()) == 4
    # The rest went back to the table, their claimed attempt not counted, and the run asked for the next one,
    # which ran them.
    rows = QueuedTask.objects.filter(result_id__in=[result.id for result in rest])
    assert sorted(rows.values_list("status", "attempts")) == [("SUCCESSFUL", 1)] * 3
    runs = Attempt.objects.filter(job="tasks.default.default").values_list("run_id", flat=True).distinct()
    assert len(runs) == 2
