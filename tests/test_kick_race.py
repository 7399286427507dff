"""PostgreSQL: a kick that commits while a run's one-statement start is under way is still served.

The start (``run_sql.free_lease_start``) reads with the snapshot its statement took when it began, and a
task queue's first claim rides in it (``_running.CLAIMS_AT_START``). A caller whose row and kick commit after
that snapshot and before the start takes the Job row's lock is invisible to the start's claim; its kick must
outlive the start (a row the start's snapshot did not see either) so that the run goes once more.

The interleaving is forced, not hoped for: another session holds the Job row's lock, the start statement waits
for it (seen in ``pg_stat_activity``, its snapshot taken), the caller commits and kicks, then the lock goes.
"""

import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, connections
from django.utils import timezone

from fabrika_django import kick, runner
from fabrika_django._runs import pending as run_pending
from fabrika_django.models import Job, QueuedTask
from testproject.lab import tasks
from testproject.lab.models import Item

from . import processes

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

JOB = "tasks.default.default"


@pytest.fixture(autouse=True)
def job_rows():
    runner.sync_jobs([JOB, "lab_items"])


def _waiting_statement(poll, pid, timeout=20.0):
    """The query of session ``pid`` once it waits for a lock (polled: the wait is an event that must come)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = poll.execute(
            "SELECT query FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", [pid]
        ).fetchone()
        if row is not None:
            return row[0]
        time.sleep(0.01)
    raise AssertionError("the start never waited for the Job row's lock")


def _run_with_a_caller_in_the_starts_snapshot(caller, job=JOB):
    """Run the job for a kick (as a worker that heard one) while ``caller`` commits during its start statement."""
    url = processes.test_database_url()
    outcome, errors, pids = [], [], []
    ready = threading.Event()

    def serve():
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pids.append(cursor.fetchone()[0])
            ready.set()
            outcome.append(runner.run(job, "kick", holder="worker-a", mark_pending=False))
        except Exception as exc:  # noqa: BLE001  reported below
            errors.append(exc)
        finally:
            ready.set()
            connections.close_all()

    with psycopg.connect(url) as holder, psycopg.connect(url, autocommit=True) as poll:
        table = connection.ops.quote_name(Job._meta.db_table)
        holder.execute(f"SELECT 1 FROM {table} WHERE name = %s FOR UPDATE", [job])  # noqa: S608  quoted name
        worker = threading.Thread(target=serve)
        worker.start()
        try:
            assert ready.wait(20) and pids, errors
            waiting = _waiting_statement(poll, pids[0])
            # The one-statement start (PREPARE'd on the thread's new connection), its snapshot taken.
            assert "WITH locked AS" in waiting, waiting[:200]
            caller()
        finally:
            holder.commit()  # the start goes on, with its snapshot from before the caller's commit
            worker.join(30)
    assert not worker.is_alive()
    assert errors == []
    return outcome[0]


def _pending_with_a_deferred_task():
    """A task not due yet, its enqueue's kick taken into the pending flag (which the start then serves)."""
    result = tasks.noop.using(run_after=timezone.now() + timedelta(days=1)).enqueue()
    assert run_pending.take_kicks([JOB]) == [JOB]
    return result


def test_a_kick_committed_during_a_runs_start_runs_the_row_its_caller_made_due():
    """The admin's requeue: a row made due, then ``kick()`` in autocommit while the job is pending. Before every
    autocommit kick was a row, this kick wrote nothing (the flag seemed to cover it): the start served the flag,
    its claim missed the row, and the run ended with nothing pending."""
    result = _pending_with_a_deferred_task()

    def requeue():
        # Due an hour ago: only the start's snapshot, not its clock, can hide it from the start's claim.
        QueuedTask.objects.filter(result_id=result.id).update(due=timezone.now() - timedelta(hours=1))
        kick(JOB)

    outcome = _run_with_a_caller_in_the_starts_snapshot(requeue)
    assert outcome.ok
    assert QueuedTask.objects.get(result_id=result.id).status == "SUCCESSFUL"


def test_an_enqueue_committed_during_a_runs_start_is_run():
    """``enqueue()`` in autocommit: its kick's row rides in the task row's INSERT (``kick_cte``), never skipped."""
    _pending_with_a_deferred_task()
    enqueued = []

    def enqueue():
        enqueued.append(tasks.noop.using(run_after=timezone.now() - timedelta(hours=1)).enqueue())

    outcome = _run_with_a_caller_in_the_starts_snapshot(enqueue)
    assert outcome.ok
    assert QueuedTask.objects.get(result_id=enqueued[0].id).status == "SUCCESSFUL"


def test_a_kick_committed_during_a_runs_start_runs_the_queue_row_its_caller_made():
    """A queue table's row and ``kick()``: the job claims in its handler, after the start's commit, so its claim
    sees the row whatever the start's snapshot; the rule holds there too (and held before 1961c25)."""
    kick("lab_items")
    assert run_pending.take_kicks(["lab_items"]) == ["lab_items"]  # pending: the start serves the flag
    made = []

    def request():
        made.append(Item.objects.create(n=1))
        kick("lab_items")

    outcome = _run_with_a_caller_in_the_starts_snapshot(request, job="lab_items")
    assert outcome.ok
    assert Item.objects.get(pk=made[0].pk).writes == 1
