"""A requeue kicks the jobs that claim the table: fabrika remembers which jobs claimed which queue tables."""

from io import StringIO

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from fabrika_django.models import Claimer
from fabrika_django.testing import run_job
from testproject.reminders.models import Reminder

pytestmark = pytest.mark.django_db

REMINDERS = "/admin/reminders/reminder/"


def _dead():
    return Reminder.objects.create(note="dead", email="a@example.com", due=timezone.now(), attempts=3)


def _messages(response):
    return [str(message) for message in get_messages(response.wsgi_request)]


@pytest.fixture
def commits(django_capture_on_commit_callbacks):
    """Kicks go out when the request's (here: the test's) transaction commits."""
    return django_capture_on_commit_callbacks


@pytest.fixture
def claimed():
    """send_reminders has run once and claimed from reminders.Reminder (with nothing due)."""
    assert run_job("send_reminders").ok
    assert list(Claimer.objects.values_list("job", "queue")) == [("send_reminders", "reminders.Reminder")]


def test_a_run_remembers_each_table_it_claimed_from_once():
    for _ in range(2):
        assert run_job("send_reminders").ok
    assert list(Claimer.objects.values_list("job", "queue")) == [("send_reminders", "reminders.Reminder")]


def test_the_requeue_action_kicks_the_claiming_job_and_says_so(claimed, admin_client, fabrika_kicks, commits):
    dead = _dead()
    with commits(execute=True):
        response = admin_client.post(REMINDERS, {"action": "requeue_selected", ACTION_CHECKBOX_NAME: [dead.pk]})
    assert _messages(response) == ["Requeued 1 reminder. Kicked send_reminders."]
    assert fabrika_kicks == ["send_reminders"]


def test_the_requeue_button_kicks_the_claiming_job_and_says_so(claimed, admin_client, fabrika_kicks, commits):
    dead = _dead()
    with commits(execute=True):
        response = admin_client.post(reverse("admin:reminders_reminder_requeue", args=[dead.pk]), {"version": "0"})
    assert _messages(response) == ["Requeued 1 reminder. Kicked send_reminders."]
    assert fabrika_kicks == ["send_reminders"]


def test_a_requeue_that_changed_nothing_kicks_nothing(claimed, admin_client, fabrika_kicks):
    dead = _dead()
    response = admin_client.post(reverse("admin:reminders_reminder_requeue", args=[dead.pk]), {"version": "7"})
    assert _messages(response)[0] == "Requeued 0 reminders."
    assert fabrika_kicks == []


def test_the_requeue_command_kicks_the_claiming_job_and_says_so(claimed, fabrika_kicks, commits):
    dead = _dead()
    out = StringIO()
    with commits(execute=True):
        call_command("fabrika_job", "requeue", "reminders.Reminder", "--id", str(dead.pk), stdout=out)
    assert out.getvalue() == "Requeued 1 row of reminders.Reminder. Kicked send_reminders.\n"
    assert fabrika_kicks == ["send_reminders"]


def test_a_table_no_job_claimed_yet_is_requeued_without_a_kick(admin_client, fabrika_kicks):
    dead = _dead()
    response = admin_client.post(REMINDERS, {"action": "requeue_selected", ACTION_CHECKBOX_NAME: [dead.pk]})
    assert _messages(response) == ["Requeued 1 reminder."]
    assert fabrika_kicks == []


def test_a_job_no_longer_registered_is_not_kicked(claimed, admin_client, fabrika_kicks):
    Claimer.objects.create(queue="reminders.Reminder", job="renamed_long_ago")
    dead = _dead()
    response = admin_client.post(REMINDERS, {"action": "requeue_selected", ACTION_CHECKBOX_NAME: [dead.pk]})
    assert _messages(response) == ["Requeued 1 reminder. Kicked send_reminders."]
