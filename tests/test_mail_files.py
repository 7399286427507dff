"""ctx.mail's refusals before anything is reserved: header text with control characters, an attachment whose name
escapes its storage, a file that is not live (``FABRIKA["FILE_STATE"]``), and a message the transport cannot
carry (``ctx.mail.capabilities``); and the ledger's pruning after ``MAIL_LEDGER_DAYS``.

The SMTP cases go through Django's SMTP backend to the real loopback server of tests/smtp.py.
"""

import os
from datetime import timedelta

import pytest
from django.core import mail as django_mail
from django.core.exceptions import ImproperlyConfigured
from django.core.files.base import ContentFile
from django.test import override_settings
from django.utils import timezone

from fabrika_django import EmailDeliveryError
from fabrika_django.jobs import registry
from fabrika_django.models import Outcome, SentMail
from fabrika_django.testing import run_job
from testproject.mailers import mail_settings
from testproject.outbox.models import OutboxMail, Person

from .smtp import SMTPServer
from .test_mail import UNSUBSCRIBE, _mailer, _message, _run, _sending_job

#: What the scanner of the test project says of a file, by its name: tests set it.
FILE_STATES: dict[str, str] = {}


def file_state(field_file):
    """The FILE_STATE callable of these tests: live unless FILE_STATES says otherwise."""
    return FILE_STATES.get(field_file.name.rsplit("/", 1)[-1], "live")


@pytest.fixture
def media(tmp_path, settings):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path / "media"


@pytest.fixture
def scanner(settings):
    FILE_STATES.clear()
    settings.FABRIKA = dict(settings.FABRIKA, FILE_STATE=f"{__name__}.file_state")
    yield FILE_STATES
    FILE_STATES.clear()


def _row(name="report.pdf", content=b"%PDF-1.4 x") -> OutboxMail:
    person, _ = Person.objects.get_or_create(email="ada@example.org", defaults={"name": "Ada"})
    row = OutboxMail.objects.create(person=person, kind="welcome", subject="Hello", text="Hi")
    if name is not None:
        row.attachment.save(name, ContentFile(content))
    return row


# --- header text ------------------------------------------------------------------------------------------------

CONTROLS = ["\x00", "\x01", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x7f", "\x85", "\u2028", "\u2029"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("argument", ["subject", "from_name"])
@pytest.mark.parametrize("char", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_header_text_with_a_control_character_is_refused_before_anything_is_reserved(argument, char):
    answers = []
    with SMTPServer() as smtp, override_settings(**smtp.settings):
        with _sending_job([_message(**{argument: f"Hello{char}Ada"})], answers) as job:
            assert _run(job.name).ok
    error, may_retry = answers
    assert (error.code, error.outcome, may_retry) == ("invalid_message", "not_sent", False)
    assert str(error) == f"{argument} holds a control character: a header is one line of text."
    assert smtp.received == [] and not SentMail.objects.exists()


@pytest.mark.django_db
def test_a_tab_in_a_subject_is_header_text():
    assert _mailer(mode="locmem").send(**_message(subject="Hello\tAda")).status == "accepted"


# --- an attachment whose name escapes its storage ------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["../secret.txt", "/etc/passwd", "outbox/../../secret.txt"])
def test_an_attachment_whose_name_escapes_its_storage_is_refused_without_quoting_the_path(media, name):
    (media.parent / "secret.txt").write_text("not for mail")
    row = _row()
    OutboxMail.objects.filter(pk=row.pk).update(attachment=name)
    row.refresh_from_db()
    with pytest.raises(EmailDeliveryError) as refused:
        _mailer(mode="locmem").send(**_message(attachments=[row.attachment]))
    assert (refused.value.code, refused.value.outcome) == ("invalid_message", "not_sent")
    assert str(refused.value) == (
        "attachment 1's file name points outside its storage: fix the row's file field, then requeue the row."
    )
    assert "secret" not in str(refused.value) and str(media.parent) not in str(refused.value)
    assert refused.value.__cause__ is None
    assert not SentMail.objects.exists() and django_mail.outbox == []


@pytest.mark.django_db
@pytest.mark.parametrize("linked", ["file", "folder"])
def test_an_attachment_reached_through_a_link_inside_its_storage_is_refused(media, linked):
    outside = media.parent / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not for mail")
    row = _row()
    if linked == "file":
        os.symlink(outside / "secret.txt", media / "outbox-link.txt")
        OutboxMail.objects.filter(pk=row.pk).update(attachment="outbox-link.txt")
    else:
        os.symlink(outside, media / "shared")
        OutboxMail.objects.filter(pk=row.pk).update(attachment="shared/secret.txt")
    row.refresh_from_db()
    with row.attachment.open("rb") as opened:  # the premise: the field opens the file outside
        assert opened.read() == b"not for mail"
    with pytest.raises(EmailDeliveryError) as refused:
        _mailer(mode="locmem").send(**_message(attachments=[row.attachment]))
    assert (refused.value.code, refused.value.outcome) == ("file_is_link", "not_sent")
    assert str(refused.value) == (
        "attachment 1's file is a symbolic link inside its storage; nothing was sent: "
        "store the file itself in the field, then requeue the row."
    )
    assert _mailer(mode="none").may_retry(refused.value) is False
    assert not SentMail.objects.exists() and django_mail.outbox == []


# --- FILE_STATE ---------------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("state", "code", "may"),
    [
        ("pending", "file_not_ready", True),
        ("quarantined", "file_not_ready", True),
        ("rejected", "file_rejected", False),
    ],
)
def test_a_file_that_is_not_live_fails_the_send_before_anything_is_reserved(media, scanner, state, code, may):
    row = _row(name="scan.pdf")
    scanner["scan.pdf"] = state
    answers = []
    with SMTPServer() as smtp, override_settings(**smtp.settings):
        with _sending_job([_message(attachments=[row.attachment])], answers) as job:
            assert _run(job.name).ok
            assert smtp.received == [] and not SentMail.objects.exists()
            # The scan finishes: the same message with the same key goes.
            scanner["scan.pdf"] = "live"
            assert _run(job.name).ok
    error, may_retry = answers[:2]
    assert (error.code, error.outcome, may_retry) == (code, "not_sent", may)
    assert "\n" not in str(error) and "scan.pdf" not in str(error)
    assert answers[2].status == "accepted" and len(smtp.received) == 1


@pytest.mark.django_db
def test_without_file_state_every_existing_file_is_live(media):
    row = _row()
    assert _mailer(mode="locmem").send(**_message(attachments=[row.attachment])).status == "accepted"


@pytest.mark.django_db
def test_a_file_state_that_answers_no_state_is_a_configuration_error_naming_the_setting(media, scanner):
    row = _row(name="odd.pdf")
    scanner["odd.pdf"] = "clean"
    with pytest.raises(ImproperlyConfigured) as refused:
        _mailer(mode="locmem").send(**_message(attachments=[row.attachment]))
    assert str(refused.value) == (
        "FABRIKA['FILE_STATE'] answered a str that is no file state: "
        "return 'live', 'pending', 'quarantined' or 'rejected'."
    )
    assert not SentMail.objects.exists()


def raising_file_state(field_file):
    raise RuntimeError("scanner down for ada@example.org")


def unhashable_file_state(field_file):
    return ["live"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("callable_name", "code", "text", "may"),
    [
        (
            "raising_file_state",
            "file_state_failed",
            "FABRIKA['FILE_STATE'] raised RuntimeError for attachment 1; nothing was sent: a later attempt asks it "
            "again.",
            True,
        ),
        (
            "unhashable_file_state",
            "file_state_invalid",
            "FABRIKA['FILE_STATE'] answered a list for attachment 1; nothing was sent: return 'live', 'pending', "
            "'quarantined' or 'rejected'.",
            False,
        ),
    ],
)
def test_a_file_state_that_raises_or_answers_something_unhashable_is_a_delivery_error(
    media, settings, callable_name, code, text, may
):
    settings.FABRIKA = dict(settings.FABRIKA, FILE_STATE=f"{__name__}.{callable_name}")
    row = _row()
    with pytest.raises(EmailDeliveryError) as refused:
        _mailer(mode="locmem").send(**_message(attachments=[row.attachment]))
    assert (refused.value.code, refused.value.outcome, str(refused.value)) == (code, "not_sent", text)
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    assert "ada@example.org" not in str(refused.value)
    assert _mailer(mode="none").may_retry(refused.value) is may
    assert code in Outcome.values
    assert not SentMail.objects.exists() and django_mail.outbox == []


def test_the_file_codes_are_outcomes_and_only_file_not_ready_may_retry():
    from fabrika_django.models import Outcome

    assert {"file_not_ready", "file_rejected", "fetch_too_large"} <= set(Outcome.values)
    mailer = _mailer(mode="none")
    assert mailer.may_retry(EmailDeliveryError("x", code="file_not_ready")) is True
    assert mailer.may_retry(EmailDeliveryError("x", code="file_rejected")) is False


# --- capabilities -----------------------------------------------------------------------------------------------

SMTP = "django.core.mail.backends.smtp.EmailBackend"
CONSOLE = "django.core.mail.backends.console.EmailBackend"
LOCMEM = "django.core.mail.backends.locmem.EmailBackend"
FILEBASED = "django.core.mail.backends.filebased.EmailBackend"
DUMMY = "django.core.mail.backends.dummy.EmailBackend"
PLAIN = "testproject.lab.mail.PlainRelayBackend"
FULL = {"attachments": True, "unsubscribe_header": True, "max_attachment_bytes": 10 * 1024 * 1024}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        (SMTP, {**FULL, "deduplicates": False, "confirmation": "sent"}),
        (CONSOLE, {**FULL, "deduplicates": False, "confirmation": "sent"}),
        (FILEBASED, {**FULL, "deduplicates": False, "confirmation": "sent"}),
        (LOCMEM, {**FULL, "deduplicates": False, "confirmation": "sent"}),
        (
            DUMMY,
            {
                "attachments": False,
                "unsubscribe_header": False,
                "max_attachment_bytes": 0,
                "deduplicates": False,
                "confirmation": "sent",
            },
        ),
        (
            "testproject.lab.mail.DeduplicatingSMTPBackend",
            {**FULL, "deduplicates": True, "confirmation": "sent"},
        ),
        (
            "testproject.lab.mail.SmallLocmemBackend",
            {**FULL, "max_attachment_bytes": 1024, "deduplicates": False, "confirmation": "sent"},
        ),
        (
            PLAIN,
            {
                "attachments": False,
                "unsubscribe_header": False,
                "max_attachment_bytes": 0,
                "deduplicates": False,
                "confirmation": "queued",
            },
        ),
    ],
    ids=lambda value: value.rsplit(".", 2)[-2] if isinstance(value, str) else "",
)
def test_capabilities_describe_djangos_backends_and_a_backends_own_attributes(tmp_path, backend, expected):
    with override_settings(**mail_settings(EMAIL_BACKEND=backend, EMAIL_FILE_PATH=str(tmp_path))):
        capabilities = _mailer().capabilities
    assert {name: getattr(capabilities, name) for name in expected} == expected


@pytest.mark.django_db
def test_a_mailer_without_a_transport_has_no_capabilities():
    capabilities = _mailer(mode="none").capabilities
    assert (capabilities.attachments, capabilities.unsubscribe_header, capabilities.max_attachment_bytes) == (
        False,
        False,
        0,
    )


@pytest.mark.django_db(transaction=True)
def test_smtp_carries_attachments_and_the_unsubscribe_header(media):
    row = _row()
    answers = []
    with SMTPServer() as smtp, override_settings(**smtp.settings):
        with _sending_job([_message(attachments=[row.attachment])], answers) as job:
            assert _run(job.name).ok
    [received] = smtp.received
    assert received.message["List-Unsubscribe"] == f"<{UNSUBSCRIBE}>"
    assert [part.get_filename() for part in received.message.iter_attachments()] == ["report.pdf"]


@pytest.mark.django_db
def test_the_console_backend_carries_attachments_and_the_unsubscribe_header(media, capsys):
    row = _row()
    with override_settings(**mail_settings(EMAIL_BACKEND=CONSOLE)):
        assert _mailer().send(**_message(attachments=[row.attachment])).provider == "console"
    printed = capsys.readouterr().out
    assert f"List-Unsubscribe: <{UNSUBSCRIBE}>" in printed and 'filename="report.pdf"' in printed


@pytest.mark.django_db
def test_the_locmem_backend_carries_attachments_and_the_unsubscribe_header(media):
    row = _row()
    with override_settings(**mail_settings(EMAIL_BACKEND=LOCMEM)):
        _mailer().send(**_message(attachments=[row.attachment]))
    [sent] = django_mail.outbox
    assert sent.extra_headers["List-Unsubscribe"] == f"<{UNSUBSCRIBE}>"
    assert [attachment[0] for attachment in sent.attachments] == ["report.pdf"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("change", "text"),
    [
        ("attachments", "This transport carries no attachments: send a link to the file instead."),
        (
            "unsubscribe_url",
            "This transport writes no List-Unsubscribe header: send without unsubscribe_url, "
            "and put the link in the text.",
        ),
    ],
)
def test_a_message_the_transport_cannot_carry_is_refused_before_anything_is_reserved(media, change, text):
    row = _row()
    message = _message(unsubscribe_url=None)
    message[change] = [row.attachment] if change == "attachments" else UNSUBSCRIBE
    with override_settings(**mail_settings(EMAIL_BACKEND=PLAIN)):
        mailer = _mailer()
        with pytest.raises(EmailDeliveryError) as refused:
            mailer.send(**message)
        assert (refused.value.code, refused.value.outcome, mailer.may_retry(refused.value)) == (
            "invalid_message",
            "not_sent",
            False,
        )
        assert str(refused.value) == text
        assert not SentMail.objects.exists() and django_mail.outbox == []
        # What it can carry goes.
        assert mailer.send(**_message(unsubscribe_url=None)).provider == "plain-relay"
    assert len(django_mail.outbox) == 1


# --- the ledger's window ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_builtin_job_prunes_ledger_rows_older_than_mail_ledger_days(settings):
    settings.FABRIKA = dict(settings.FABRIKA, MAIL_LEDGER_DAYS=10)
    now = timezone.now()
    for number, age in enumerate([11, 10.5, 9, 0]):
        SentMail.objects.create(
            key_hash=f"{number:064d}", content_hash="c" * 64, state="accepted", created=now - timedelta(days=age)
        )
    assert "fabrika_prune_history" in registry
    assert run_job("fabrika_prune_history").ok
    assert sorted(SentMail.objects.values_list("key_hash", flat=True)) == [f"{2:064d}", f"{3:064d}"]


@pytest.mark.django_db
def test_a_repeat_after_the_ledger_window_sends_again(settings):
    mailer = _mailer(mode="locmem")
    mailer.send(**_message())
    SentMail.objects.update(created=timezone.now() - timedelta(days=31))
    assert run_job("fabrika_prune_history").ok
    _mailer(mode="locmem").send(**_message())
    assert len(django_mail.outbox) == 2


def test_mail_ledger_days_defaults_to_thirty_and_is_checked(settings):
    from fabrika_django.checks import _check_settings
    from fabrika_django.conf import settings as fabrika_settings

    assert fabrika_settings.MAIL_LEDGER_DAYS == 30
    settings.FABRIKA = {"MAIL_LEDGER_DAYS": 0}
    assert [error.id for error in _check_settings()] == ["fabrika.E032"]
    settings.FABRIKA = {"FILE_STATE": "no.such.callable"}
    errors = _check_settings()
    assert [error.id for error in errors] == ["fabrika.E035"]
    assert errors[0].msg == "Setting FABRIKA['FILE_STATE'] is 'no.such.callable', which does not import to a callable."
