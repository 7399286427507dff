"""One requeue rule from every door: the admin's action, the admin's button and ``fabrika_job requeue``.

Waiting and dead rows are made due now with no attempts; done rows are skipped; a RUNNING task refuses the
whole request. Each test goes through all three doors, so a door with a rule of its own fails here.
"""

from io import StringIO

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.utils import timezone

from fabrika_django.models import QueuedTask
from testproject.lab import tasks
from testproject.reminders.models import Reminder

pytestmark = pytest.mark.django_db

DOORS = ("action", "button", "command")
REMINDERS = ("/admin/reminders/reminder/", "reminders.Reminder")
TASKS = ("/admin/fabrika_django/queuedtask/", "fabrika_django.QueuedTask")


def _through(door, client, table, rows):
    """Requeue ``rows`` through ``door``; answer what it said (the admin's messages, or the command's lines)."""
    url, label = table
    if door == "action":
        response = client.post(url, {"action": "requeue_selected", ACTION_CHECKBOX_NAME: [row.pk for row in rows]})
        assert response.status_code == 302
        return [str(message) for message in get_messages(response.wsgi_request)]
    if door == "button":
        said = []
        for row in rows:
            response = client.post(f"{url}{row.pk}/requeue/", {"version": str(row.version)})
            assert response.status_code == 302
            said += [str(message) for message in get_messages(response.wsgi_request)]
        return said
    out = StringIO()
    try:
        call_command("fabrika_job", "requeue", label, "--id", *[str(row.pk) for row in rows], stdout=out)
    except CommandError as exc:
        return [*out.getvalue().splitlines(), str(exc)]
    return out.getvalue().splitlines()


def _reminder(**values):
    return Reminder.objects.create(note="r", email="a@example.com", **values)


def _task(status, **values):
    row = QueuedTask.objects.get(result_id=tasks.add.enqueue(1, 2).id)
    QueuedTask.objects.filter(pk=row.pk).update(status=status, **values)
    return QueuedTask.objects.get(pk=row.pk)


def _kept(row):
    """The queue's own columns of ``row`` as the database holds them."""
    return type(row).objects.filter(pk=row.pk).values_list("due", "attempts", "version").get()


@pytest.mark.parametrize("door", DOORS)
def test_every_door_makes_a_dead_and_a_waiting_row_due_now_with_no_attempts(door, admin_client):
    before = timezone.now()
    rows = [_reminder(due=before, attempts=3), _reminder(due=before, attempts=1)]
    _through(door, admin_client, REMINDERS, rows)
    for row in rows:
        due, attempts, version = _kept(row)
        assert (attempts, version) == (0, 1) and due >= before


@pytest.mark.parametrize("door", DOORS)
def test_every_door_leaves_a_done_row_done(door, admin_client):
    done = _reminder(due=None, attempts=1)
    said = _through(door, admin_client, REMINDERS, [done])
    assert _kept(done) == (None, 1, 0)
    assert any("done" in line for line in said)  # the person is told why nothing happened


@pytest.mark.parametrize("door", DOORS)
def test_every_door_leaves_a_successful_task_done(door, admin_client):
    done = _task("SUCCESSFUL", due=None, attempts=1, finished_at=timezone.now())
    _through(door, admin_client, TASKS, [done])
    assert _kept(done) == (None, 1, 0)
    assert QueuedTask.objects.get(pk=done.pk).status == "SUCCESSFUL"


@pytest.mark.parametrize("door", DOORS)
def test_every_door_refuses_a_running_task_and_requeues_nothing_beside_it(door, admin_client):
    running = _task("RUNNING", attempts=1)
    failed = _task("FAILED", attempts=100, finished_at=timezone.now())
    rows = [running] if door == "button" else [running, failed]
    said = _through(door, admin_client, TASKS, rows)
    refusal = (
        f"fabrika_django.QueuedTask {running.pk} is RUNNING: a requeue could run it twice. Wait until it ends "
        "(a killed worker's task is retried on its own once the job's lease expires); nothing was requeued."
    )
    assert refusal in said
    assert QueuedTask.objects.filter(pk=running.pk).values_list("status", "attempts", "version").get() == (
        "RUNNING",
        1,
        0,
    )
    assert QueuedTask.objects.filter(pk=failed.pk).values_list("status", "attempts", "version").get() == (
        "FAILED",
        100,
        0,
    )


@pytest.mark.parametrize("version", ["²", "9" * 5000, str(10**23), "-1", "1.0", "0x1"])
def test_the_button_answers_a_version_no_page_shows_with_a_message_and_writes_nothing(version, admin_client):
    dead = _reminder(due=timezone.now(), attempts=3)
    response = admin_client.post(f"{REMINDERS[0]}{dead.pk}/requeue/", {"version": version})
    assert response.status_code == 302
    assert [str(message) for message in get_messages(response.wsgi_request)] == [
        "The page's version of this row is not a whole number: reload the page and try again."
    ]
    assert _kept(dead)[1:] == (3, 0)
