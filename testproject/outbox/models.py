"""Recipe 1, an outbox: a registration form's row, the person it records, and the mail a job sends."""

from django.db import models

from fabrika_django.models import QueueModel


class Registration(QueueModel):
    """What the public form recorded; a job turns it into a Person and an outbox mail."""

    name = models.CharField(max_length=200)
    email = models.EmailField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Queue:
        max_attempts = 5

    def __str__(self) -> str:
        return f"Registration {self.pk}"


class Person(models.Model):
    name = models.CharField(max_length=200)
    email = models.EmailField(unique=True)
    unsubscribed = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"Person {self.pk}"


class OutboxMail(QueueModel):
    """One e-mail to send; the mail job claims it and sends it with a key derived from its id."""

    person = models.ForeignKey(Person, on_delete=models.CASCADE, related_name="mails")
    kind = models.CharField(max_length=32)
    subject = models.CharField(max_length=200)
    text = models.TextField()
    html = models.TextField(blank=True)
    attachment = models.FileField(upload_to="outbox/", blank=True)
    # The person's signed one-click unsubscribe link (RFC 8058), issued by the job that wrote the mail.
    unsubscribe_url = models.URLField(max_length=2000, blank=True)
    message_id = models.CharField(max_length=255, blank=True)
    # Set instead of a send when the person unsubscribed before the mail went out.
    skipped_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Queue:
        max_attempts = 5

    def __str__(self) -> str:
        return f"Mail {self.pk} ({self.kind})"

    @property
    def idempotency_key(self) -> str:
        return f"outbox-mail-{self.pk}"
