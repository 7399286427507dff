"""Recipe 1, an outbox: registrations become people and welcome mails; a second job sends the mails.

Each step is recorded before the next effect, so a run that stops anywhere is finished by the next one:
the registration is turned into the person and the outbox row in one transaction; the mail is claimed (its
attempt and backoff recorded) before the send; the acceptance is recorded right after it. Log lines carry ids and
codes only, never an address, a key or a message.
"""

from datetime import timedelta

from django.template.loader import render_to_string

from fabrika_django import EmailDeliveryError, VersionConflict, cron

from .models import OutboxMail, Person, Registration

BATCH = 50
FROM_NAME = "Fabrika demo"
REPLY_TO = "help@fabrika-demo.example"
#: The deadline of one send inside the attempt's: a hanging transport fails its mail, not the run.
SEND_TIMEOUT = 20.0


@cron(
    "*/10 * * * *",
    timeout=timedelta(minutes=5),
    kicks=["send_outbox"],
    signs=["unsubscribe"],
    actions=["outbox.change_registration", "outbox.delete_registration", "outbox.add_person", "outbox.add_outboxmail"],
)
def register(ctx):
    """Claim registrations; record each person and a welcome mail with a signed unsubscribe link."""
    for registration in Registration.objects.claim(limit=BATCH):
        ctx.signal.throw_if_aborted()
        try:
            with ctx.transaction():
                _record(ctx, registration)
        except VersionConflict:
            ctx.log.info("Registration changed meanwhile id=%s", registration.pk)
        except Exception:
            if ctx.signal.aborted:
                raise  # the attempt's failure: the next run meets the registration as it is
            ctx.log.warning("Registration failed id=%s code=record", registration.pk)
            with ctx.transaction():
                registration.record_failure("record")


def _record(ctx, registration):
    person, _created = Person.objects.get_or_create(email=registration.email, defaults={"name": registration.name})
    token = ctx.tokens.sign("unsubscribe", {"person": person.pk}, days=400)
    link = ctx.url("outbox:unsubscribe", query={"t": token})
    context = {"name": person.name, "unsubscribe_url": link}
    mail = OutboxMail.objects.create(
        person=person,
        kind="welcome",
        subject="Welcome to the fabrika demo",
        text=render_to_string("outbox/mail/welcome.txt", context),
        html=render_to_string("outbox/mail/welcome.html", context),
        unsubscribe_url=link,
    )
    # The form's row has done its work: the person and the mail hold what it asked for.
    registration.remove()
    ctx.kick("send_outbox")  # goes out when this transaction commits
    ctx.log.info("Registration recorded id=%s person=%s mail=%s", registration.pk, person.pk, mail.pk)


@cron("*/5 * * * *", timeout=timedelta(minutes=5), mailer="installation", actions=["outbox.change_outboxmail"])
def send_outbox(ctx):
    """Claim due mails and send each with a key derived from its row; record each acceptance at once."""
    if not ctx.mail.available:
        # No transport: leave every row as it is, so no attempt is spent; the first run after one is configured
        # sends them.
        ctx.log.info("No mail transport reaches send_outbox: the outbox waits")
        return
    for mail in OutboxMail.objects.claim(limit=BATCH):
        ctx.signal.throw_if_aborted()
        try:
            _send(ctx, mail)
        except VersionConflict:
            ctx.log.info("Mail changed meanwhile id=%s", mail.pk)
        except Exception:
            if ctx.signal.aborted:
                raise
            ctx.log.warning("Mail failed id=%s code=send", mail.pk)
            with ctx.transaction():
                mail.record_failure("send")


def _send(ctx, mail):
    person = Person.objects.get(pk=mail.person_id)
    if person.unsubscribed and mail.kind != "welcome":
        # Welcome mail confirms a registration the person just made; anything else respects the unsubscribe.
        with ctx.transaction():
            mail.finish(skipped_at=ctx.now())
        ctx.log.info("Mail skipped id=%s code=unsubscribed", mail.pk)
        return
    try:
        result = ctx.mail.send(
            to=person.email,
            subject=mail.subject,
            text=mail.text,
            html=mail.html or None,
            from_name=FROM_NAME,
            reply_to=REPLY_TO,
            idempotency_key=mail.idempotency_key,
            attachments=[mail.attachment] if mail.attachment else [],
            unsubscribe_url=mail.unsubscribe_url or None,
            timeout=SEND_TIMEOUT,
        )
    except EmailDeliveryError as error:
        if ctx.signal.aborted:
            raise
        retry = ctx.mail.may_retry(error)
        ctx.log.warning("Mail not sent id=%s code=%s outcome=%s retry=%s", mail.pk, error.code, error.outcome, retry)
        with ctx.transaction():
            # A refused message, or one that may have left over a transport that cannot deduplicate, is dead at
            # once: a person checks and requeues it. Otherwise the claim's backoff brings it back.
            mail.record_failure(f"send.{error.code}", give_up=not retry)
        return
    with ctx.transaction():
        mail.finish(message_id=result.message_id)
    ctx.log.info("Mail sent id=%s provider=%s", mail.pk, result.provider)
