"""The demo's Django task: the "resend the welcome mail" page enqueues it; it writes a new outbox mail."""

import pytest

from fabrika_django.models import QueuedTask
from fabrika_django.testing import run_tasks
from testproject.outbox.models import OutboxMail

from .factories import OutboxMailFactory, PersonFactory

pytestmark = pytest.mark.django_db


def test_the_resend_page_enqueues_the_task_which_copies_the_welcome_mail_into_the_outbox(
    client, admin_client, fabrika_kicks, django_capture_on_commit_callbacks
):
    welcome = OutboxMailFactory(due=None, message_id="sent-1")
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/resend/", {"email": welcome.person.email})
    assert response.status_code == 200 and b"on its way" in response.content
    assert fabrika_kicks == ["tasks.default.emails"]
    [result] = run_tasks(queue="emails")  # inside the test's transaction: the kicks its task commits go out
    again = OutboxMail.objects.exclude(pk=welcome.pk).get()
    assert result.return_value == {"person": welcome.person.pk, "mail": again.pk}
    assert (again.subject, again.text, again.due is not None) == (welcome.subject, welcome.text, True)
    assert fabrika_kicks == ["tasks.default.emails", "send_outbox"]
    listed = admin_client.get("/admin/fabrika_django/queuedtask/?function=testproject.outbox.tasks.resend_welcome")
    assert listed.context["cl"].result_count == 1


def test_the_resend_page_says_the_same_for_an_unknown_address_and_enqueues_nothing(client):
    PersonFactory(email="known@example.com")
    response = client.post("/resend/", {"email": "stranger@example.com"})
    assert response.status_code == 200 and b"on its way" in response.content
    assert not QueuedTask.objects.exists()
