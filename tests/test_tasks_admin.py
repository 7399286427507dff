"""The tasks page: status, queue and function filters, args only on a task's page, requeue of failed tasks."""

from datetime import UTC, datetime

import pytest
from django.utils import timezone

from fabrika_django.models import QueuedTask
from fabrika_django.testing import run_tasks
from testproject.lab import tasks

from .test_admin import moment_html

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


def _filter_titles(response):
    return [str(spec.title) for spec in response.context["cl"].filter_specs]


def test_the_list_offers_one_status_filter_and_the_state_filter_only_while_the_overview_uses_it(admin_client):
    tasks.add.enqueue(1, 2)
    assert _filter_titles(admin_client.get(TASKS)) == ["status", "queue", "function", "backend"]
    arrived = admin_client.get(f"{TASKS}?state=dead")  # from the overview's count: it shows what filters the list
    assert _filter_titles(arrived) == ["status", "queue", "function", "backend", "state"]
    assert arrived.context["cl"].result_count == 0


def test_the_list_shows_times_with_their_zone_and_the_function_wrapping_at_its_dots(admin_client, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    result = tasks.add.enqueue(1, 2)
    QueuedTask.objects.filter(result_id=result.id).update(enqueued_at=datetime(2026, 7, 1, 10, 0, tzinfo=UTC))
    html = admin_client.get(TASKS).content.decode()
    assert moment_html("2026-07-01", "12:00 CEST") in html
    assert "testproject.<wbr>lab.<wbr>tasks.<wbr>add<" in html
    page = admin_client.get(f"{TASKS}{QueuedTask.objects.get().pk}/change/").content.decode()
    assert '2026-07-01</span> <span class="fabrika-nowrap">12:00 CEST' in page  # the task's own page too


def test_a_task_that_succeeds_after_a_failure_keeps_its_code_shown_as_before_the_success(admin_client):
    result = tasks.add.enqueue(1, 2)
    QueuedTask.objects.filter(result_id=result.id).update(last_failure="task_failed")
    run_tasks()
    row = QueuedTask.objects.get(result_id=result.id)
    assert (row.status, row.last_failure) == ("SUCCESSFUL", "task_failed")  # the code is history, as errors are
    page = admin_client.get(f"{TASKS}{row.pk}/change/").content.decode()
    assert '<code>task_failed</code> <span class="fabrika-quiet">(before the success)</span>' in page
    QueuedTask.objects.filter(pk=row.pk).update(status="FAILED")
    page = admin_client.get(f"{TASKS}{row.pk}/change/").content.decode()
    assert "<code>task_failed</code>" in page and "(before the success)" not in page


def test_a_function_no_row_can_hold_filters_no_task(admin_client):
    # PostgreSQL refuses a NUL in text (a DataError): a crafted filter was a 500.
    tasks.mark.enqueue("x")
    listed = admin_client.get("/admin/fabrika_django/queuedtask/?function=testproject.lab.tasks.mark%00")
    assert listed.status_code == 200 and listed.context["cl"].result_count == 0
