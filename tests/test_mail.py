"""ctx.mail through a real SMTP server on loopback: headers, parts, attachments, the idempotency ledger, refusals."""

import hashlib
import socket
import threading
import time

import pytest
from django.core import mail as django_mail
from django.core.files.base import ContentFile
from django.test import override_settings

from fabrika_django import CapabilityRefused, EmailDeliveryError, runner
from fabrika_django.context import AbortSignal
from fabrika_django.mail import Mailer, SendResult
from fabrika_django.mail._ledger import Ledger
from fabrika_django.models import SentMail
from fabrika_django.testing import run_job
from testproject.mailers import mail_settings
from testproject.outbox.models import OutboxMail, Person

from .jobs_helpers import temporary_job
from .smtp import SMTPServer

UNSUBSCRIBE = "https://demo.example/unsubscribe/?t=abc.def"
PDF = bytes(range(256)) * 8  # every byte value: an attachment must arrive byte for byte


@pytest.fixture
def media(tmp_path, settings):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


def _outbox_row(*, attachment: bytes | None = None, name="report.pdf") -> OutboxMail:
    person, _ = Person.objects.get_or_create(email="ada@example.org", defaults={"name": "Ada"})
    row = OutboxMail.objects.create(person=person, kind="welcome", subject="Hello", text="Hi")
    if attachment is not None:
        row.attachment.save(name, ContentFile(attachment))
    return row


def _message(**overrides):
    values = {
        "to": "ada@example.org",
        "subject": "Welcome, Ada",
        "text": "Hello Ada,\nwelcome.",
        "html": "<p>Hello <b>Ada</b></p>",
        "reply_to": "help@demo.example",
        "from_name": "Fabrika Demo",
        "idempotency_key": "outbox-mail-1",
        "unsubscribe_url": UNSUBSCRIBE,
    }
    values.update(overrides)
    return values


def _sending_job(messages, answers, **options):
    """A job that sends each of ``messages`` (dicts of send() arguments), keeping each result or error."""

    def mail_sender(ctx):
        for message in messages:
            try:
                answers.append(ctx.mail.send(**message))
            except EmailDeliveryError as error:
                answers.append(error)
                answers.append(ctx.mail.may_retry(error))

    options.setdefault("mailer", "installation")
    return temporary_job(mail_sender, **options)


def _run(name="mail_sender"):
    """Run through the worker's path with the configured transport (not the test kit's locmem)."""
    return runner.run(name, "manual", pause=lambda failed: 0.0)


def _mailer(mode=None, mailer="installation"):
    return Mailer(job_name="direct", mailer=mailer, mode=mode, signal=AbortSignal(time.monotonic() + 60))


# --- what arrives --------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_message_arrives_with_its_headers_parts_and_attachment_byte_for_byte(media):
    row = _outbox_row(attachment=PDF)
    answers = []
    with SMTPServer() as smtp, override_settings(**smtp.settings):
        with _sending_job([_message(attachments=[row.attachment])], answers) as job:
            assert _run(job.name).outcome == "succeeded"

    [result] = answers
    assert isinstance(result, SendResult)
    assert (result.status, result.provider) == ("accepted", "smtp")
    [received] = smtp.received
    assert received.envelope_to == ["ada@example.org"]
    message = received.message
    assert message["From"] == "Fabrika Demo <demo@localhost>"
    assert message["Reply-To"] == "help@demo.example"
    assert message["Subject"] == "Welcome, Ada"
    assert message["List-Unsubscribe"] == f"<{UNSUBSCRIBE}>"
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert message["Message-ID"] == f"<{result.message_id}>"
    # Django 6.1 ends a text part with a line break; earlier versions sent the text as given.
    assert message.get_body(("plain",)).get_content().replace("\r\n", "\n").rstrip("\n") == "Hello Ada,\nwelcome."
    assert message.get_body(("html",)).get_content().rstrip("\r\n") == "<p>Hello <b>Ada</b></p>"
    [attached] = list(message.iter_attachments())
    assert attached.get_filename() == "report.pdf"
    assert attached.get_content_type() == "application/pdf"
    assert attached.get_content() == PDF


@pytest.mark.django_db(transaction=True)
def test_without_an_unsubscribe_url_there_is_no_list_unsubscribe_header_and_no_free_header_is_possible():
    answers = []
    with SMTPServer() as smtp, override_settings(**smtp.settings):
        with _sending_job([_message(unsubscribe_url=None, html=None)], answers) as job:
            assert _run(job.name).ok
        with pytest.raises(TypeError):
            _mailer().send(**_message(headers={"X-Anything": "1"}))
    message = smtp.received[0].message
    assert message["List-Unsubscribe"] is None and message["List-Unsubscribe-Post"] is None
    assert message.get_content_type() == "text/plain"


@pytest.mark.django_db(transaction=True)
def test_an_attempt_sends_its_batch_over_one_connection_and_reopens_one_the_server_dropped():
    answers = []

    def batch(ctx):
        for number in range(3):
            answers.append(ctx.mail.send(**_message(idempotency_key=f"batch-{number}")))
        # The server drops the idle connection: the next message opens a new one instead of failing.
        ctx.mail._backend.connection.sock.shutdown(socket.SHUT_RDWR)
        answers.append(ctx.mail.send(**_message(idempotency_key="after-drop")))

    with SMTPServer() as smtp, override_settings(**smtp.settings), temporary_job(batch, mailer="installation"):
        assert _run("batch").ok
        assert smtp.handler.sessions == 2
        assert len(smtp.received) == 4
    assert [answer.status for answer in answers] == ["accepted"] * 4
    assert SentMail.objects.filter(state="accepted").count() == 4


# --- the idempotency ledger ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_repeated_key_with_the_same_content_answers_the_first_acceptance_and_sends_nothing(media):
    answers = []
    with SMTPServer() as smtp, override_settings(**smtp.settings):
        with _sending_job([_message(), _message()], answers) as job:
            assert _run(job.name).ok
        with _sending_job([_message()], answers) as job:
            assert _run(job.name).ok
    assert len(smtp.received) == 1
    assert answers[0] == answers[1] == answers[2]
    ledger = SentMail.objects.get()
    assert (ledger.state, ledger.provider, ledger.message_id) == ("accepted", "smtp", answers[0].message_id)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "change",
    [
        {"subject": "Welcome again"},
        {"text": "Other text"},
        {"html": None},
        {"to": "bob@example.org"},
        {"unsubscribe_url": "https://demo.example/unsubscribe/?t=other"},
        {"unsubscribe_url": None},
        {"attachments": "other bytes"},
        {"attachments": "other name"},
    ],
    ids=lambda change: "-".join(f"{k}={v}" for k, v in change.items()),
)
def test_a_repeated_key_with_other_content_is_refused_as_idempotency_conflict(media, change):
    row = _outbox_row(attachment=PDF)
    first = _message(attachments=[row.attachment])
    second = dict(first, **change)
    if change.get("attachments") == "other bytes":
        row2 = OutboxMail.objects.create(person=row.person, kind="x", subject="s", text="t")
        row2.attachment.save("report.pdf", ContentFile(PDF + b"!"))
        second["attachments"] = [row2.attachment]
    elif change.get("attachments") == "other name":
        row2 = OutboxMail.objects.create(person=row.person, kind="x", subject="s", text="t")
        row2.attachment.save("renamed.pdf", ContentFile(PDF))
        second["attachments"] = [row2.attachment]
    answers = []
    with SMTPServer() as smtp, override_settings(**smtp.settings):
        with _sending_job([first, second], answers) as job:
            assert _run(job.name).ok
    assert len(smtp.received) == 1
    assert isinstance(answers[0], SendResult)
    error, may_retry = answers[1:]
    assert (error.code, error.outcome, may_retry) == ("idempotency_conflict", "not_sent", False)


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "x" * 201, "has space", "tab\there", "clé", None, 42])
def test_a_key_that_is_not_1_to_200_visible_ascii_characters_is_refused_and_nothing_is_recorded(key):
    with pytest.raises(EmailDeliveryError) as refused:
        _mailer(mode="locmem").send(**_message(idempotency_key=key))
    assert (refused.value.code, refused.value.outcome) == ("invalid_idempotency_key", "not_sent")
    assert "1 to 200 visible ASCII" in str(refused.value)
    assert not SentMail.objects.exists() and django_mail.outbox == []


@pytest.mark.django_db
def test_a_key_of_200_visible_characters_is_fine_and_the_ledger_holds_only_hashes(settings):
    settings.FABRIKA = dict(settings.FABRIKA, ENVIRONMENT="staging")
    key = "~" * 190 + "-mail-1!!"
    result = _mailer(mode="locmem").send(**_message(idempotency_key=key))
    ledger = SentMail.objects.get()
    assert ledger.key_hash == hashlib.sha256(f"staging\0{key}".encode()).hexdigest()
    stored = " ".join(str(value) for value in SentMail.objects.values_list().get())
    for secret in (key, "ada@example.org", "Welcome", "Hello"):
        assert secret not in stored
    assert result.provider == "locmem" and len(django_mail.outbox) == 1


@pytest.mark.django_db
def test_the_environment_prefixes_the_key_so_two_environments_never_share_one(settings):
    _mailer(mode="locmem").send(**_message())
    settings.FABRIKA = dict(settings.FABRIKA, ENVIRONMENT="other-environment")
    _mailer(mode="locmem").send(**_message(subject="Another message, same key"))
    assert SentMail.objects.count() == 2 and len(django_mail.outbox) == 2


# --- a crash between the transport's acceptance and the ledger's write ------------------------------------------


def _crash_after_acceptance(monkeypatch):
    """The process dies after the transport accepted and before the ledger recorded it."""

    def die(self, result):
        raise RuntimeError("crashed before recording the acceptance")

    monkeypatch.setattr(Ledger, "accepted", die)


@pytest.mark.django_db(transaction=True)
def test_after_a_crash_past_acceptance_a_plain_smtp_retry_is_reported_unknown_and_does_not_send_twice(monkeypatch):
    answers = []
    with SMTPServer() as smtp, override_settings(**smtp.settings):
        with _sending_job([_message()], answers) as job:
            with monkeypatch.context() as crash:
                _crash_after_acceptance(crash)
                assert _run(job.name).outcome == "handler_failed"
            assert SentMail.objects.get().state == "sending"
            assert _run(job.name).ok  # the retry
    assert len(smtp.received) == 1  # SMTP cannot deduplicate: the retry did not send
    error, may_retry = answers
    assert (error.code, error.outcome, may_retry) == ("outcome_unknown", "unknown", False)
    assert SentMail.objects.get().state == "unknown"


@pytest.mark.django_db(transaction=True)
def test_after_a_crash_past_acceptance_a_deduplicating_transport_is_asked_again_and_delivers_once(monkeypatch):
    answers = []
    with SMTPServer(dedup=True) as smtp:
        settings = mail_settings(**dict(smtp.email, EMAIL_BACKEND="testproject.lab.mail.DeduplicatingSMTPBackend"))
        with override_settings(**settings), _sending_job([_message()], answers) as job:
            with monkeypatch.context() as crash:
                _crash_after_acceptance(crash)
                assert _run(job.name).outcome == "handler_failed"
            assert _run(job.name).ok  # the retry
    assert len(smtp.received) == 1  # the relay dropped the second copy by its Message-ID
    [result] = answers
    assert (result.status, result.provider) == ("accepted", "dedup-relay")
    assert SentMail.objects.get().state == "accepted"


@pytest.mark.django_db(transaction=True)
def test_a_connection_lost_after_data_is_unknown_and_only_a_persons_requeue_sends_it_again():
    answers = []
    with SMTPServer(hang_up_after_data=True) as smtp, override_settings(**smtp.settings):
        with _sending_job([_message()], answers) as job:
            assert _run(job.name).ok
            error, may_retry = answers
            assert (error.code, error.outcome, may_retry) == ("transport_failed", "unknown", False)
            assert len(smtp.received) == 1  # it did leave: the client could not know
            assert SentMail.objects.get().state == "unknown"
            # Reported once; the application made its row dead. A person who checked requeues it: it goes again.
            smtp.handler.hang_up_after_data = False
            answers.clear()
            assert _run(job.name).ok
    assert isinstance(answers[0], SendResult)
    assert len(smtp.received) == 2
    assert SentMail.objects.get().state == "accepted"


@pytest.mark.django_db(transaction=True)
def test_an_unknown_outcome_over_a_deduplicating_transport_may_be_retried():
    answers = []
    with SMTPServer(hang_up_after_data=True, dedup=True) as smtp:
        settings = mail_settings(**dict(smtp.email, EMAIL_BACKEND="testproject.lab.mail.DeduplicatingSMTPBackend"))
        with override_settings(**settings), _sending_job([_message()], answers) as job:
            assert _run(job.name).ok
            smtp.handler.hang_up_after_data = False
            assert _run(job.name).ok
    error, may_retry, result = answers
    assert (error.outcome, may_retry) == ("unknown", True)
    assert isinstance(result, SendResult)
    assert len(smtp.received) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.row_locks
def test_two_tries_racing_on_one_key_send_once_and_the_other_is_told_unknown_or_the_acceptance():
    with SMTPServer() as smtp, override_settings(**smtp.settings):
        original = smtp.handler.handle_DATA

        async def slow_data(server, session, envelope):
            import asyncio

            await asyncio.sleep(0.5)
            return await original(server, session, envelope)

        smtp.handler.handle_DATA = slow_data
        answers = []
        barrier = threading.Barrier(2)

        def attempt():
            from django.db import connection

            try:
                barrier.wait()
                answers.append(_mailer().send(**_message()))
            except EmailDeliveryError as error:
                answers.append(error)
            finally:
                connection.close()

        threads = [threading.Thread(target=attempt) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert len(smtp.received) == 1
    kinds = sorted(type(answer).__name__ for answer in answers)
    assert kinds == ["EmailDeliveryError", "SendResult"]
    error = next(answer for answer in answers if isinstance(answer, EmailDeliveryError))
    assert (error.code, error.outcome) == ("outcome_unknown", "unknown")
    assert SentMail.objects.get().state == "accepted"


# --- refusals: nothing sent, nothing kept -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_refused_recipients_are_not_sent_may_not_retry_and_free_the_key():
    answers = []
    with SMTPServer(refuse_recipients=True) as smtp, override_settings(**smtp.settings):
        with _sending_job([_message()], answers) as job:
            assert _run(job.name).ok
    error, may_retry = answers
    assert (error.code, error.outcome, may_retry) == ("recipient_refused", "not_sent", False)
    assert "ada@" not in str(error)
    assert not SentMail.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_refused_credentials_are_a_configuration_refusal_that_may_not_retry():
    answers = []
    with SMTPServer(refuse_login=True) as smtp:
        credentials = mail_settings(**dict(smtp.email, EMAIL_HOST_USER="app", EMAIL_HOST_PASSWORD="wrong"))
        with override_settings(**credentials), _sending_job([_message()], answers) as job:
            assert _run(job.name).ok
        assert smtp.received == []
    error, may_retry = answers
    assert (error.code, error.outcome, may_retry) == ("transport_refused", "not_sent", False)
    assert not SentMail.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_temporary_refusal_before_the_data_sends_nothing_and_may_retry():
    answers = []
    with SMTPServer() as smtp, override_settings(**smtp.settings):
        smtp.handler.defer_mail = True
        with _sending_job([_message()], answers) as job:
            assert _run(job.name).ok
            error, may_retry = answers
            assert (error.code, error.outcome, may_retry) == ("transport_deferred", "not_sent", True)
            assert not SentMail.objects.exists()
            smtp.handler.defer_mail = False
            answers.clear()
            assert _run(job.name).ok
        assert isinstance(answers[0], SendResult) and len(smtp.received) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("reply", "code", "may"),
    [("451 4.3.0 Queue full", "transport_deferred", True), ("554 5.6.0 Content refused", "message_rejected", False)],
)
def test_a_refused_data_frees_the_key_and_may_retry_only_when_temporary(reply, code, may):
    answers = []
    with SMTPServer() as smtp, override_settings(**smtp.settings):
        smtp.handler.data_reply = reply
        with _sending_job([_message()], answers) as job:
            assert _run(job.name).ok
        assert smtp.received == []
    error, may_retry = answers
    assert (error.code, error.outcome, may_retry) == (code, "not_sent", may)
    assert not SentMail.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_unreachable_transport_sends_nothing_and_may_retry():
    closed = SMTPServer()  # never started: its port answers nothing
    answers = []
    with override_settings(**closed.settings), _sending_job([_message()], answers) as job:
        assert _run(job.name).ok
    error, may_retry = answers
    assert (error.code, error.outcome, may_retry) == ("transport_unavailable", "not_sent", True)
    assert not SentMail.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"to": []}, "to names no recipient"),
        ({"to": "not an address"}, "to: entry 1 is not an e-mail address."),
        ({"to": ["ada@example.org", "bob"]}, "to: entry 2 is not an e-mail address."),
        ({"reply_to": "nope"}, "reply_to: entry 1"),
        ({"subject": ""}, "subject is empty"),
        ({"subject": "two\nlines"}, "subject holds a line break"),
        ({"from_name": "Evil\r\nBcc: x@y.z"}, "from_name holds a line break"),
        ({"text": None}, "text must be a string"),
        ({"unsubscribe_url": "/relative/"}, "unsubscribe_url is not an absolute http(s) URL"),
        ({"unsubscribe_url": "mailto:x@example.org"}, "unsubscribe_url is not an absolute http(s) URL"),
        ({"unsubscribe_url": "https://a.example/?t=x>, <https://evil.example/"}, "unsubscribe_url is not"),
        ({"timeout": 0}, "timeout=0 is not a deadline"),
        ({"attachments": ["report.pdf"]}, "attachment 1 is not a file of a FileField"),
    ],
)
def test_a_bad_message_is_refused_as_invalid_message_with_a_line_that_quotes_no_value(change, fragment):
    with pytest.raises(EmailDeliveryError) as refused:
        _mailer(mode="locmem").send(**_message(**change))
    assert (refused.value.code, refused.value.outcome) == ("invalid_message", "not_sent")
    assert fragment in str(refused.value)
    assert "\n" not in str(refused.value)
    assert not SentMail.objects.exists() and django_mail.outbox == []


@pytest.mark.django_db
def test_attachments_are_at_most_twenty_bounded_by_the_transport_and_must_exist(media):
    rows = [_outbox_row(attachment=b"x" * 100, name=f"f{n}.txt") for n in range(21)]
    with pytest.raises(EmailDeliveryError) as refused:
        _mailer(mode="locmem").send(**_message(attachments=[row.attachment for row in rows]))
    assert refused.value.code == "invalid_message" and "at most 20" in str(refused.value)

    with override_settings(**mail_settings(EMAIL_BACKEND="testproject.lab.mail.SmallLocmemBackend")):
        with pytest.raises(EmailDeliveryError) as refused:
            _mailer().send(**_message(attachments=[row.attachment for row in rows[:11]]))
        assert refused.value.code == "attachments_too_large"
        assert "at most 1024" in str(refused.value)
        assert _mailer().send(**_message(attachments=[row.attachment for row in rows[:10]])).provider == "small"

    rows[0].attachment.storage.delete(rows[0].attachment.name)
    with pytest.raises(EmailDeliveryError) as refused:
        _mailer(mode="locmem").send(**_message(idempotency_key="k2", attachments=[rows[0].attachment]))
    assert (refused.value.code, refused.value.outcome) == ("file_missing", "not_sent")
    empty = OutboxMail.objects.create(person=rows[0].person, kind="x", subject="s", text="t")
    with pytest.raises(EmailDeliveryError) as refused:
        _mailer(mode="locmem").send(**_message(idempotency_key="k3", attachments=[empty.attachment]))
    assert refused.value.code == "file_missing"
    assert SentMail.objects.count() == 1  # only the one that went


# --- availability and declarations ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_mail_none_makes_the_mailer_unavailable_and_every_send_fails_mail_not_configured():
    mailer = _mailer(mode="none")
    assert mailer.available is False
    with pytest.raises(EmailDeliveryError) as refused:
        mailer.send(**_message())
    assert (refused.value.code, refused.value.outcome) == ("mail_not_configured", "not_sent")
    assert mailer.may_retry(refused.value) is False
    assert not SentMail.objects.exists()


@pytest.mark.django_db
def test_the_dummy_backend_reaches_no_one():
    with override_settings(**mail_settings(EMAIL_BACKEND="django.core.mail.backends.dummy.EmailBackend")):
        assert _mailer().available is False
    with override_settings(**mail_settings(EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend")):
        assert _mailer().available is True


@pytest.mark.django_db
def test_mailer_own_sends_through_the_applications_factory_or_is_unavailable_without_one(settings):
    settings.FABRIKA = dict(settings.FABRIKA, OWN_MAIL_SENDER="testproject.lab.mail.own_sender")
    assert _mailer(mailer="own").send(**_message()).provider == "own-locmem"
    assert len(django_mail.outbox) == 1
    settings.FABRIKA = dict(settings.FABRIKA, OWN_MAIL_SENDER="testproject.lab.mail.no_sender")
    assert _mailer(mailer="own").available is False
    settings.FABRIKA = dict(settings.FABRIKA, OWN_MAIL_SENDER=None)
    assert _mailer(mailer="own").available is False


@pytest.mark.django_db
def test_a_job_without_mailer_has_no_ctx_mail_and_the_error_names_the_argument():
    seen = []

    def no_mailer(ctx):
        try:
            ctx.mail  # noqa: B018
        except CapabilityRefused as error:
            seen.append(str(error))
            raise

    with temporary_job(no_mailer):
        assert run_job("no_mailer").outcome == "capability_refused"
    assert seen == [
        "Job 'no_mailer' has no ctx.mail: declare @cron(..., mailer='installation') (Django's EMAIL_BACKEND) "
        "or mailer='own' (the OWN_MAIL_SENDER factory)."
    ]


@pytest.mark.django_db
def test_a_send_inside_ctx_transaction_is_refused_so_a_rollback_never_forgets_a_message_that_left():
    answers = []

    def inside(ctx):
        with ctx.transaction():
            try:
                ctx.mail.send(**_message())
            except EmailDeliveryError as error:
                answers.append(error.code)

    with temporary_job(inside, mailer="installation"):
        assert run_job("inside").ok
    assert answers == ["send_inside_transaction"] and django_mail.outbox == []


@pytest.mark.django_db
def test_the_test_kits_locmem_mode_sends_into_djangos_outbox():
    with _sending_job([_message()], []):
        assert run_job("mail_sender").ok
    [sent] = django_mail.outbox
    assert sent.to == ["ada@example.org"]
    assert sent.extra_headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"


def test_may_retry_answers_false_for_anything_but_a_delivery_error():
    mailer = _mailer(mode="none")
    assert mailer.may_retry(RuntimeError("x")) is False
    assert mailer.may_retry(EmailDeliveryError("x", code="transport_unavailable")) is True
    assert mailer.may_retry(EmailDeliveryError("x", code="transport_failed", outcome="unknown")) is False


@pytest.mark.django_db(transaction=True)
def test_reserving_a_key_is_one_statement_whether_the_key_is_new_or_taken():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ledger = Ledger("a" * 64, "b" * 64)
    with CaptureQueriesContext(connection) as first:
        assert ledger._insert_sending("smtp") is True
    with CaptureQueriesContext(connection) as again:
        assert ledger._insert_sending("smtp") is False
    assert [len(first), len(again)] == [1, 1]  # no savepoint, no IntegrityError to catch
    assert list(SentMail.objects.values_list("key_hash", "state", "provider")) == [("a" * 64, "sending", "smtp")]
