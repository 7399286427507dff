"""The outbox recipe end to end: the registration form, the register and send_outbox jobs, one-click unsubscribe.

And the privacy rule over a whole run of it: no address, key, name or message text in a log line or history row.
"""

import logging
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core import mail as django_mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from fabrika_django.models import Attempt, SentMail
from fabrika_django.testing import run_job
from fabrika_django.tokens import sign
from testproject.outbox.models import OutboxMail, Person, Registration

from .smtp import SMTPServer
from .workers import WorkerProcess, wait_until

ADDRESS = "grace.hopper@example.org"
NAME = "Grace Brewster Hopper"


def _register(client, email=ADDRESS, name=NAME):
    response = client.post(reverse("outbox:register"), {"name": name, "email": email})
    assert response.status_code == 302 and response["Location"] == reverse("outbox:thanks")


def _one_click(url):
    """What a mailbox does for RFC 8058: POST ``List-Unsubscribe=One-Click`` to the URL, with no CSRF token."""
    path = urlsplit(url)
    return Client(enforce_csrf_checks=True).post(
        f"{path.path}?{path.query}", "List-Unsubscribe=One-Click", content_type="application/x-www-form-urlencoded"
    )


@pytest.mark.django_db
def test_the_form_records_a_registration_and_kicks_the_register_job(
    client, fabrika_kicks, django_capture_on_commit_callbacks
):
    assert client.get(reverse("outbox:register")).status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        _register(client)
    registration = Registration.objects.get()
    assert (registration.email, registration.state) == (ADDRESS, "waiting")
    assert fabrika_kicks == ["register"]


@pytest.mark.django_db
def test_an_invalid_form_records_nothing_and_kicks_nothing(client, fabrika_kicks):
    response = client.post(reverse("outbox:register"), {"name": NAME, "email": "not an address"})
    assert response.status_code == 200 and b"Enter a valid email address" in response.content
    assert not Registration.objects.exists() and fabrika_kicks == []


@pytest.mark.django_db
def test_the_recipe_records_the_person_sends_the_mail_once_and_the_link_unsubscribes(
    client, fabrika_kicks, settings, django_capture_on_commit_callbacks
):
    settings.FABRIKA = dict(settings.FABRIKA, BASE_URL="https://demo.example")
    with django_capture_on_commit_callbacks(execute=True):
        _register(client)

    assert run_job("register").ok
    person = Person.objects.get()
    mail = OutboxMail.objects.get()
    assert (person.email, mail.person, mail.state, mail.kind) == (ADDRESS, person, "waiting", "welcome")
    assert not Registration.objects.exists()  # its work is recorded in the person and the mail
    assert fabrika_kicks == ["register", "send_outbox"]

    assert run_job("send_outbox").ok
    assert run_job("send_outbox").ok  # nothing left: the mail is done, nothing goes twice
    [sent] = django_mail.outbox
    mail.refresh_from_db()
    assert (mail.state, mail.attempts) == ("done", 1)
    assert mail.message_id and sent.extra_headers["Message-ID"] == f"<{mail.message_id}>"
    assert sent.to == [ADDRESS] and sent.reply_to == ["help@fabrika-demo.example"]
    assert sent.from_email == "Fabrika demo <demo@localhost>"
    assert sent.extra_headers["List-Unsubscribe"] == f"<{mail.unsubscribe_url}>"
    assert NAME in sent.body and mail.unsubscribe_url in sent.body
    url = mail.unsubscribe_url
    assert url.startswith("https://demo.example/unsubscribe/?t=")

    page = client.get(urlsplit(url).path + "?" + urlsplit(url).query)
    assert page.status_code == 200 and b"<button" in page.content
    person.refresh_from_db()
    assert person.unsubscribed is False  # a GET (a link scanner) changes nothing

    assert _one_click(url).status_code == 200
    person.refresh_from_db()
    assert person.unsubscribed is True


@pytest.mark.django_db
def test_a_tampered_or_expired_unsubscribe_token_is_refused_and_changes_nothing(client):
    person = Person.objects.create(name=NAME, email=ADDRESS)
    token = sign("unsubscribe", {"person": person.pk}, days=400)
    tampered = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
    other_purpose = sign("confirm", {"person": person.pk}, days=400)
    expired = sign("unsubscribe", {"person": person.pk}, days=1, now=timezone.now() - timedelta(days=2))
    unsubscribe = reverse("outbox:unsubscribe")
    for bad in (tampered, other_purpose, "", "garbage"):
        response = Client(enforce_csrf_checks=True).post(f"{unsubscribe}?t={bad}")
        assert response.status_code == 400 and b"not valid" in response.content
        assert client.get(f"{unsubscribe}?t={bad}").status_code == 400
    response = Client().post(f"{unsubscribe}?t={expired}")
    assert response.status_code == 400 and b"expired" in response.content
    person.refresh_from_db()
    assert person.unsubscribed is False


@pytest.mark.django_db
def test_without_a_transport_the_mail_job_returns_and_spends_no_attempt(client):
    _register(client)
    assert run_job("register").ok
    before = OutboxMail.objects.values().get()
    result = run_job("send_outbox", mail="none")
    assert (result.ok, result.attempts) == (True, 1)
    assert OutboxMail.objects.values().get() == before
    assert django_mail.outbox == []


@pytest.mark.django_db
def test_a_refused_mail_is_dead_at_once_with_its_step_code_and_a_requeue_sends_it(client, settings, tmp_path):
    _register(client, email="x@example.org")
    assert run_job("register").ok
    mail = OutboxMail.objects.get()
    settings.MEDIA_ROOT = str(tmp_path)
    mail.attachment.name = "outbox/gone.pdf"  # a file its storage no longer holds
    mail.save()
    assert run_job("send_outbox").ok
    mail.refresh_from_db()
    assert (mail.state, mail.last_failure) == ("dead", "send.file_missing")
    mail.attachment.name = ""
    mail.save()
    mail.requeue()
    assert run_job("send_outbox").ok
    mail.refresh_from_db()
    assert mail.state == "done" and len(django_mail.outbox) == 1


@pytest.mark.django_db
def test_a_mail_to_a_person_who_unsubscribed_is_skipped_but_the_welcome_still_goes():
    person = Person.objects.create(name=NAME, email=ADDRESS, unsubscribed=True)
    news = OutboxMail.objects.create(person=person, kind="news", subject="News", text="News.")
    welcome = OutboxMail.objects.create(person=person, kind="welcome", subject="Welcome", text="Hi.")
    assert run_job("send_outbox").ok
    news.refresh_from_db()
    welcome.refresh_from_db()
    assert (news.state, news.message_id) == ("done", "") and news.skipped_at is not None
    assert welcome.state == "done" and welcome.message_id and welcome.skipped_at is None
    assert [sent.subject for sent in django_mail.outbox] == ["Welcome"]


def _secrets(mail=None):
    found = [ADDRESS, NAME, "Grace", "Welcome to the fabrika demo", "outbox-mail-", "help@fabrika-demo"]
    if mail is not None:
        found.append(urlsplit(mail.unsubscribe_url).query)
    return found


def _history_text():
    return "\n".join(" ".join(str(value) for value in row) for row in Attempt.objects.values_list()) + "\n".join(
        " ".join(str(value) for value in row) for row in SentMail.objects.values_list()
    )


@pytest.mark.django_db
def test_no_address_key_or_message_reaches_a_log_line_or_a_history_row(client, caplog, settings, tmp_path):
    caplog.set_level(logging.DEBUG)
    settings.MEDIA_ROOT = str(tmp_path)
    _register(client)
    assert run_job("register").ok
    OutboxMail.objects.update(attachment="outbox/gone.pdf")
    assert run_job("send_outbox").ok  # a failure's log line too
    OutboxMail.objects.update(attachment="")
    OutboxMail.objects.get().requeue()
    assert run_job("send_outbox").ok
    assert len(django_mail.outbox) == 1
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "Mail not sent id=" in logged and "Mail sent id=" in logged  # the lines were there to search
    for secret in _secrets(OutboxMail.objects.get()):
        assert secret not in logged
        assert secret not in _history_text()


@pytest.mark.django_db(transaction=True)
def test_the_whole_recipe_through_the_worker_and_a_real_smtp_server(client):
    with SMTPServer() as smtp:
        worker = WorkerProcess(
            "--only",
            "register,send_outbox",
            EMAIL_URL=f"smtp://127.0.0.1:{smtp.port}",
            BASE_URL="http://testserver",
            FABRIKA_POLL_INTERVAL="0.1",
        )
        try:
            _register(client)
            wait_until(lambda: smtp.received, workers=[worker], what="the welcome mail at the SMTP server")
            wait_until(
                lambda: OutboxMail.objects.filter(due=None).exists(), workers=[worker], what="the mail marked done"
            )
            # The handler logs its line after the finish commits: wait for the line, not only for the row.
            output = wait_until(
                lambda: "Mail sent id=" in worker.output() and worker.output(), workers=[worker], what="the sent line"
            )
        finally:
            worker.kill()
        [received] = smtp.received
    message = received.message
    assert received.envelope_to == [ADDRESS]
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    url = str(message["List-Unsubscribe"]).strip().strip("<>")
    assert parse_qs(urlsplit(url).query)["t"]
    assert url in message.get_body(("plain",)).get_content()

    tampered = url[:-2] + ("xy" if not url.endswith("xy") else "yz")
    assert _one_click(tampered).status_code == 400
    assert Person.objects.get().unsubscribed is False
    assert _one_click(url).status_code == 200
    assert Person.objects.get().unsubscribed is True

    assert "Mail sent id=" in output  # the worker logged at debug level: the lines were there to search
    for secret in _secrets(OutboxMail.objects.get()):
        assert secret not in output
        assert secret not in _history_text()
