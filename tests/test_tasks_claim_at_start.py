"""PostgreSQL: a kicked task queue's first claim rides in its run's start statement, and only when the start
took the lease."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fabrika_django import _jobstate, runner
from fabrika_django.models import QueuedTask
from testproject.lab import tasks

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

JOB = "tasks.default.default"


def _start(holder):
    start = _jobstate.Start(
        job=JOB, trigger="kick", holder=holder, seconds=30, max_attempt=1, mark_pending=False, now=timezone.now()
    )
    return _jobstate.start_or_join(start)


@pytest.fixture(autouse=True)
def job_rows():
    runner.sync_jobs([JOB])


def test_the_start_of_a_kicked_task_run_claims_its_first_tasks_in_the_same_statement():
    first = tasks.mark.enqueue("first")
    second = tasks.mark.enqueue("second")
    with CaptureQueriesContext(connection) as started:
        lease = _start("worker-a")
    assert lease is not None
    assert len(started.captured_queries) == 1
    alias, rows = lease.claimed
    assert alias == "default" and len(rows) == 2
    claimed = QueuedTask.objects.filter(result_id__in=[first.id, second.id])
    assert sorted(claimed.values_list("attempts", "version")) == [(1, 1), (1, 1)]


def test_a_start_that_finds_the_job_busy_claims_nothing():
    tasks.mark.enqueue("first")
    assert _start("worker-a") is not None  # the lease, and the first task claimed
    later = tasks.mark.enqueue("during the run")
    assert _start("worker-b") is None  # busy: this start takes no lease
    assert QueuedTask.objects.get(result_id=later.id).attempts == 0  # so it claimed nothing


def test_a_run_serves_the_tasks_its_start_claimed_first():
    # Its claim moves the task's due by the backoff: a run that claimed again instead would not find it due.
    result = tasks.mark.enqueue("claimed at the start")
    outcome = runner.run(JOB, "kick", mark_pending=False)
    assert outcome.ok
    row = QueuedTask.objects.get(result_id=result.id)
    assert (row.status, row.attempts) == ("SUCCESSFUL", 1)
