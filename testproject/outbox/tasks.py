"""A Django task (fabrika_django.tasks.FabrikaBackend): resend a person's welcome mail.

The task is plain Django code: it copies the person's welcome mail into a new outbox row and kicks
``send_outbox``, which sends it with the outbox's idempotency key. Its return value is ids, never an address.
"""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

from django.db import transaction

from fabrika_django import kick

from .models import OutboxMail


@task(queue_name="emails", priority=10)
def resend_welcome(person_id):
    welcome = OutboxMail.objects.filter(person_id=person_id, kind="welcome").order_by("-pk").first()
    if welcome is None:
        return {"person": person_id, "mail": None}  # the registration has not been recorded yet
    with transaction.atomic():
        mail = OutboxMail.objects.create(
            person_id=person_id,
            kind="welcome",
            subject=welcome.subject,
            text=welcome.text,
            html=welcome.html,
            unsubscribe_url=welcome.unsubscribe_url,
        )
        kick("send_outbox")
    return {"person": person_id, "mail": mail.pk}
