"""The tasks page: status, queue and function filters, args only on a task's page, requeue of failed tasks."""

import pytest
from django.utils import timezone

from fabrika_django.models import QueuedTask
from fabrika_django.testing import run_tasks
from testproject.lab import tasks

pytestmark = pytest.mark.django_db

TASKS = "/admin/fabrika_django/queuedtask/"


def _failed(result):
    QueuedTask.objects.filter(result_id=result.id).update(
        status="FAILED",
        attempts=100,
        finished_at=timezone.now(),
        errors=[{"exception_class_path": "x", "traceback": ""}],
    )
    return QueuedTask.objects.get(result_id=result.id)


def test_the_list_filters_by_status_queue_and_function_and_shows_no_args(admin_client):
    tasks.add.enqueue(111111, 2)
    tasks.mark.using(queue_name="emails").enqueue("note")
    response = admin_client.get(TASKS)
    assert response.status_code == 200 and response.context["cl"].result_count == 2
    assert "111111" not in response.content.decode()
    assert admin_client.get(f"{TASKS}?status=READY").context["cl"].result_count == 2
    assert admin_client.get(f"{TASKS}?status=FAILED").context["cl"].result_count == 0
    assert admin_client.get(f"{TASKS}?queue_name=emails").context["cl"].result_count == 1
    by_function = admin_client.get(f"{TASKS}?function=testproject.lab.tasks.add")
    assert by_function.context["cl"].result_count == 1
    assert admin_client.get(f"{TASKS}?state=waiting").context["cl"].result_count == 2  # the overview's links


def test_a_tasks_page_shows_its_args_and_return_value(admin_client):
    result = tasks.add.enqueue(111111, 2)
    run_tasks()
    row = QueuedTask.objects.get(result_id=result.id)
    html = admin_client.get(f"{TASKS}{row.pk}/change/").content.decode()
    assert "111111" in html and "111113" in html


def test_requeue_action_makes_failed_tasks_ready_kicks_their_job_and_leaves_the_others(
    admin_client, fabrika_kicks, django_capture_on_commit_callbacks
):
    failed = _failed(tasks.add.enqueue(1, 2))
    ready = QueuedTask.objects.get(result_id=tasks.add.enqueue(3, 4).id)
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(TASKS, {"action": "requeue_selected", "_selected_action": [failed.pk, ready.pk]})
    assert response.status_code == 302
    assert fabrika_kicks == ["tasks.default.default"]
    failed.refresh_from_db()
    ready.refresh_from_db()
    assert (failed.status, failed.attempts, failed.finished_at) == ("READY", 0, None)
    assert failed.errors == [{"exception_class_path": "x", "traceback": ""}]  # the history stays
    assert (ready.version, ready.status) == (0, "READY")
    [ran] = [result for result in run_tasks() if result.id == str(failed.result_id)]
    assert ran.status == "SUCCESSFUL" and ran.return_value == 3


def test_the_requeue_button_is_on_a_failed_tasks_page_only_and_requeues_it(admin_client):
    failed = _failed(tasks.add.enqueue(1, 2))
    ready = QueuedTask.objects.get(result_id=tasks.add.enqueue(3, 4).id)
    assert admin_client.get(f"{TASKS}{failed.pk}/change/").context["fabrika_requeue_url"] is not None
    assert admin_client.get(f"{TASKS}{ready.pk}/change/").context["fabrika_requeue_url"] is None
    response = admin_client.post(f"{TASKS}{ready.pk}/requeue/", {"version": ready.version})
    assert response.status_code == 302
    ready.refresh_from_db()
    assert ready.version == 0  # not failed: left as it is
    admin_client.post(f"{TASKS}{failed.pk}/requeue/", {"version": failed.version})
    failed.refresh_from_db()
    assert (failed.status, failed.attempts) == ("READY", 0)


def test_the_overview_counts_the_tasks_table(admin_client):
    tasks.add.enqueue(1, 2)
    _failed(tasks.add.enqueue(3, 4))
    response = admin_client.get("/admin/fabrika_django/overview/")
    (queue,) = [queue for queue in response.context["queues"] if queue["model"] == "fabrika_django.QueuedTask"]
    assert {cell["state"]: cell["count"] for cell in queue["cells"]} == {
        "waiting": 1,
        "due_now": 1,
        "dead": 1,
        "done": 0,
    }
