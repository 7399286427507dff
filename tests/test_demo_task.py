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
        response = client.post("/resend/", {"email": welcome.person.email}, follow=True)
    assert response.redirect_chain == [("/resend/sent/", 302)]
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
    response = client.post("/resend/", {"email": "stranger@example.com"}, follow=True)
    assert response.redirect_chain == [("/resend/sent/", 302)]  # the same answer: the page tells nobody who exists
    assert response.status_code == 200 and b"on its way" in response.content
    assert not QueuedTask.objects.exists()


def test_reloading_the_resend_confirmation_enqueues_nothing_more(client, django_capture_on_commit_callbacks):
    welcome = OutboxMailFactory(due=None, message_id="sent-1")
    with django_capture_on_commit_callbacks(execute=True):
        sent = client.post("/resend/", {"email": welcome.person.email})
    assert (sent.status_code, sent["Location"]) == (302, "/resend/sent/")
    # What the browser's reload does on the page the redirect showed: a GET, with nothing to send again.
    with django_capture_on_commit_callbacks(execute=True):
        for _reload in range(2):
            assert b"on its way" in client.get(sent["Location"]).content
    assert QueuedTask.objects.count() == 1


def test_a_resend_with_a_malformed_address_shows_the_form_again_with_its_error(client):
    response = client.post("/resend/", {"email": "not an address"})
    assert response.status_code == 200 and response.context["form"].errors["email"]
    assert not QueuedTask.objects.exists()
