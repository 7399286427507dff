"""Django tasks on real worker processes: a commit starts the task, a killed worker's task is retried."""

import os
import signal
import tempfile

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from fabrika_django import kick
from fabrika_django._tasks_compat import TaskResultStatus
from fabrika_django.models import QueuedTask
from testproject.lab import tasks
from testproject.lab.models import Mark

from .workers import WorkerProcess, wait_until

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

ONLY = ("--only", "tasks.default.default")


def _status(result_id):
    return QueuedTask.objects.filter(result_id=result_id).values_list("status", flat=True).first()


def test_a_commit_starts_the_task_on_a_listening_worker_and_a_rollback_starts_nothing():
    worker = WorkerProcess(*ONLY)
    try:
        wait_until(lambda: "Worker started" in worker.output(), workers=[worker], what="the worker")
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            tasks.mark.enqueue("rolled back")
            raise ZeroDivisionError
        with transaction.atomic():
            result = tasks.mark.enqueue("committed")
        wait_until(lambda: _status(result.id) == "SUCCESSFUL", timeout=20, workers=[worker], what="the task's run")
    finally:
        worker.kill()
    assert list(Mark.objects.values_list("note", "pid")) == [("committed", worker.pid)]
    assert QueuedTask.objects.count() == 1


def test_a_task_whose_worker_is_killed_mid_task_is_retried_and_ends_successful_with_both_workers():
    flag = tempfile.NamedTemporaryFile(delete=False)  # noqa: SIM115
    flag.close()
    os.unlink(flag.name)  # the first attempt makes it, then stalls
    short_lease = {"FABRIKA_LEASE_SECONDS": 2, "FABRIKA_POLL_INTERVAL": 0.2}
    first = WorkerProcess(*ONLY, **short_lease)
    second = None
    try:
        result = tasks.stalls_the_first_time.enqueue(flag.name)
        wait_until(lambda: Mark.objects.filter(note="stalled").exists(), workers=[first], what="the first attempt")
        assert _status(result.id) == "RUNNING"
        first.signal(signal.SIGKILL)
        first.wait(30)
        second = WorkerProcess(*ONLY, **short_lease)
        # The row is due again after its claim's backoff (a minute): bring that time forward, as the clock
        # would; the job's lease, held by the dead worker, expires on its own.
        QueuedTask.objects.filter(result_id=result.id).update(due=timezone.now())
        kick("tasks.default.default")  # else the next minute's sweep
        wait_until(lambda: _status(result.id) == "SUCCESSFUL", timeout=90, workers=[second], what="the retry")
    finally:
        first.kill()
        if second is not None:
            second.kill()
        if os.path.exists(flag.name):
            os.unlink(flag.name)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "done"
    assert result.attempts == 2
    assert [worker_id.rsplit(":", 1)[1] for worker_id in result.worker_ids] == [str(first.pid), str(second.pid)]
    assert result.errors == []


def test_a_task_requeued_from_the_admin_is_ready_again_and_runs(admin_user):
    result = tasks.mark.enqueue("again")
    QueuedTask.objects.filter(result_id=result.id).update(status="FAILED", attempts=100, finished_at=timezone.now())
    worker = WorkerProcess(*ONLY)
    try:
        wait_until(lambda: "Worker started" in worker.output(), workers=[worker], what="the worker")
        client = Client()
        client.force_login(admin_user)
        row = QueuedTask.objects.get(result_id=result.id)
        response = client.post(
            "/admin/fabrika_django/queuedtask/",
            {"action": "requeue_selected", "_selected_action": [row.pk]},
        )
        assert response.status_code == 302
        wait_until(lambda: _status(result.id) == "SUCCESSFUL", timeout=20, workers=[worker], what="the requeued run")
    finally:
        worker.kill()
    result.refresh()
    assert result.attempts == 1 and list(Mark.objects.values_list("note", flat=True)) == ["again"]
