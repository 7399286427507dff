"""PostgreSQL: a kicked task queue's first claim rides in its run's start statement, and only when the start
took the lease; that statement also starts the first task (RUNNING), which the run then does not mark again."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fabrika_django import runner
from fabrika_django._runs import start as run_start
from fabrika_django._runs import tasks as _task_runs
from fabrika_django._runs.task_groups import Writes
from fabrika_django.models import QueuedTask
from testproject.lab import tasks
from testproject.lab.models import Mark

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

JOB = "tasks.default.default"


def _start(holder):
    start = run_start.Start(
        job=JOB, trigger="kick", holder=holder, seconds=30, max_attempt=1, mark_pending=False, now=timezone.now()
    )
    return run_start.start_or_join(start)


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
    alias, rows = lease.claimed.using, lease.claimed.rows
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


def _started_now(lease):
    """The ``started_now`` flag the start answered with each claimed row (the answer's last column)."""
    return [bool(values[-1]) for values in lease.claimed.rows]


def test_the_start_statement_starts_the_first_task_in_claim_order_and_only_it():
    later = tasks.mark.enqueue("enqueued first, lower priority")
    first = tasks.mark.using(priority=5).enqueue("higher priority")
    before = timezone.now()
    lease = _start("worker-a")
    assert _started_now(lease) == [True, False]
    started = QueuedTask.objects.get(result_id=first.id)
    assert started.status == "RUNNING"
    assert started.started_at >= before and started.last_attempted_at == started.started_at
    assert started.worker_ids == [_task_runs.task_backends["default"].worker_id]
    waiting = QueuedTask.objects.get(result_id=later.id)
    assert (waiting.status, waiting.started_at, waiting.worker_ids) == ("READY", None, [])


def test_a_task_started_by_the_start_statement_is_not_marked_running_again():
    # Claim and RUNNING in one write (version 1), SUCCESSFUL in one more: a second RUNNING would make it 3.
    result = tasks.mark.enqueue("started at the start")
    assert runner.run(JOB, "kick", mark_pending=False).ok
    row = QueuedTask.objects.get(result_id=result.id)
    assert (row.status, row.attempts, row.version) == ("SUCCESSFUL", 1, 2)
    assert row.worker_ids == [_task_runs.task_backends["default"].worker_id]


def test_a_retried_task_keeps_its_first_started_at_and_gains_the_new_worker_id():
    result = tasks.mark.enqueue("retried")
    long_ago = timezone.now() - timezone.timedelta(hours=1)
    QueuedTask.objects.filter(result_id=result.id).update(
        status="RUNNING", attempts=1, started_at=long_ago, worker_ids=["gone:1"]
    )
    lease = _start("worker-a")
    assert _started_now(lease) == [True]
    row = QueuedTask.objects.get(result_id=result.id)
    assert row.started_at == long_ago and row.last_attempted_at > long_ago
    assert row.worker_ids == ["gone:1", _task_runs.task_backends["default"].worker_id]


def test_the_start_statement_does_not_start_a_task_past_its_last_attempt():
    result = tasks.mark.enqueue("its worker died on the last attempt")
    QueuedTask.objects.filter(result_id=result.id).update(status="RUNNING", attempts=3)  # max_attempts is 3
    lease = _start("worker-a")
    assert _started_now(lease) == [False]
    row = QueuedTask.objects.get(result_id=result.id)
    assert (row.status, row.attempts, row.worker_ids) == ("RUNNING", 4, [])


def test_a_task_the_start_statement_started_is_ready_again_when_the_run_gives_it_back():
    result = tasks.mark.enqueue("given back")
    assert _started_now(_start("worker-a")) == [True]
    row = QueuedTask.objects.get(result_id=result.id)  # as the run holds it: claimed and RUNNING
    writes = Writes(_task_runs.task_backends["default"].worker_id, lambda row, task: None)
    _task_runs._give_back(writes, [row], {row.pk})
    writes.flush()
    row = QueuedTask.objects.get(result_id=result.id)
    assert (row.status, row.attempts) == ("READY", 0)


def test_a_run_whose_start_claimed_nothing_claims_again_with_a_later_now():
    # A requeue that commits after the start read its ``now`` and before its statement: the start takes the
    # requeue's kick, but the row is not due to that ``now``. The run must not end on that empty claim.
    result = tasks.mark.enqueue("made due between the start's now and its statement")
    start = timezone.now()
    QueuedTask.objects.filter(result_id=result.id).update(due=start + timezone.timedelta(seconds=1))
    times = iter([start])
    outcome = runner.run(
        JOB, "kick", mark_pending=False, clock=lambda: next(times, start + timezone.timedelta(seconds=2))
    )
    assert outcome.ok
    assert QueuedTask.objects.get(result_id=result.id).status == "SUCCESSFUL"


def test_a_task_the_start_statement_started_is_ready_again_when_the_attempt_ends_before_it_runs(monkeypatch):
    # The attempt ends between its start statement and the task (a shutdown, say): the fence's check refuses.
    from fabrika_django._runs import fence as _fence
    from fabrika_django.exceptions import LeaseLost

    def refuse(self):
        raise LeaseLost("the attempt ended")

    monkeypatch.setattr(_fence.LeaseFence, "check", refuse)
    result = tasks.mark.enqueue("never run")
    assert not runner.run(JOB, "kick", mark_pending=False).ok
    row = QueuedTask.objects.get(result_id=result.id)
    assert (row.status, row.attempts) == ("READY", 1)
    assert not Mark.objects.exists()
